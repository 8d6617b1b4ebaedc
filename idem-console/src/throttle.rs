//! Sign-in throttling: after a few wrong write tokens from one client,
//! the next attempts are refused with 429 and `Retry-After` for a back-off
//! that doubles with each further wrong token (1 s, 2 s, 4 s, … at most
//! 5 minutes), without checking the token, so that guessing it takes
//! years rather than hours. A right token ends the client's back-off.
//!
//! A client is its IP address (an IPv6 client its /64 network), as the
//! server's [`ConnectInfo`] gives it: `idem serve` serves with it; a
//! router served without it (`axum::serve(listener, router)`) counts every
//! client as one, as does a reverse proxy (every request comes from it).
//! At most [`MAX_CLIENTS`] clients are remembered; beyond them, new
//! clients share one back-off, so memory stays bounded however many
//! addresses an attacker has.

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Wrong tokens in a row a client may send before a back-off.
pub(crate) const FREE: u32 = 5;
/// The first back-off.
const FIRST: Duration = Duration::from_secs(1);
/// The longest back-off.
const LONGEST: Duration = Duration::from_secs(300);
/// A client without a wrong token for this long starts afresh.
const FORGET: Duration = Duration::from_secs(15 * 60);
/// The most clients remembered.
pub(crate) const MAX_CLIENTS: usize = 4096;

/// Who sends a request, for the throttle: the peer's address, when the
/// server gives it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Client(Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for Client {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Client(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip()),
        ))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Ip(IpAddr),
    /// A server without `ConnectInfo`.
    Unknown,
    /// Clients beyond `MAX_CLIENTS`.
    Overflow,
}

impl Client {
    /// A client whose address the server did not give.
    #[cfg(test)]
    pub(crate) fn unknown() -> Self {
        Client(None)
    }

    fn key(self) -> Key {
        match self.0 {
            // IPv4-mapped addresses are IPv4 clients.
            Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
                Some(v4) => Key::Ip(IpAddr::V4(v4)),
                // One /64 network is one client: it holds 2^64 addresses.
                None => Key::Ip(IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into())),
            },
            Some(v4) => Key::Ip(v4),
            None => Key::Unknown,
        }
    }
}

#[derive(Debug)]
struct Entry {
    /// Attempts since the last right token (each counted as it starts).
    failures: u32,
    /// Refused until then.
    until: Instant,
    /// The last attempt.
    last: Instant,
}

/// The back-offs of the clients that sent wrong tokens.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    clients: Mutex<HashMap<Key, Entry>>,
}

impl Throttle {
    /// Starts a token check for `client`, or refuses it for the time left
    /// of its back-off. The attempt counts as wrong until
    /// [`Throttle::passed`] says otherwise, so that parallel attempts
    /// cannot all slip in before the first is counted.
    pub(crate) fn attempt(&self, client: Client, now: Instant) -> Result<(), Duration> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let mut key = client.key();
        if !clients.contains_key(&key) && clients.len() >= MAX_CLIENTS {
            clients.retain(|_, e| e.until > now || now.duration_since(e.last) < FORGET);
            if clients.len() >= MAX_CLIENTS {
                key = Key::Overflow;
            }
        }
        let e = clients.entry(key).or_insert(Entry {
            failures: 0,
            until: now,
            last: now,
        });
        if e.until > now {
            return Err(e.until - now);
        }
        if now.duration_since(e.last) >= FORGET {
            e.failures = 0;
        }
        e.failures += 1;
        e.last = now;
        if e.failures >= FREE {
            let doubled = FIRST.saturating_mul(1 << (e.failures - FREE).min(16));
            e.until = now + doubled.min(LONGEST);
        }
        Ok(())
    }

    /// The attempt of `client` had the right token: its back-off ends.
    pub(crate) fn passed(&self, client: Client) {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        clients.remove(&client.key());
    }
}

/// `Retry-After`'s value: whole seconds, rounded up.
pub(crate) fn retry_after(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ip: &str) -> Client {
        Client(Some(ip.parse().unwrap()))
    }

    #[test]
    fn back_off_doubles_per_client_and_a_right_token_ends_it() {
        let t = Throttle::default();
        let now = Instant::now();
        for _ in 0..FREE {
            assert!(t.attempt(at("10.0.0.1"), now).is_ok());
        }
        assert_eq!(t.attempt(at("10.0.0.1"), now), Err(FIRST));
        // Another client is not held back.
        assert!(t.attempt(at("10.0.0.2"), now).is_ok());
        // After the first back-off, one more wrong token: twice as long.
        let later = now + FIRST;
        assert!(t.attempt(at("10.0.0.1"), later).is_ok());
        assert_eq!(t.attempt(at("10.0.0.1"), later), Err(2 * FIRST));
        // A right token (after the back-off) ends it.
        let later = later + 2 * FIRST;
        assert!(t.attempt(at("10.0.0.1"), later).is_ok());
        t.passed(at("10.0.0.1"));
        for _ in 0..FREE {
            assert!(t.attempt(at("10.0.0.1"), later).is_ok());
        }
        assert!(t.attempt(at("10.0.0.1"), later).is_err());
        // Never longer than LONGEST; forgotten after FORGET.
        let mut when = later;
        for _ in 0..40 {
            when += LONGEST;
            assert!(t.attempt(at("10.0.0.1"), when).is_ok());
            assert!(t.attempt(at("10.0.0.1"), when).unwrap_err() <= LONGEST);
        }
        assert!(t.attempt(at("10.0.0.1"), when + LONGEST + FORGET).is_ok());
        assert!(t.attempt(at("10.0.0.1"), when + LONGEST + FORGET).is_ok());
    }

    #[test]
    fn one_ipv6_network_is_one_client() {
        let t = Throttle::default();
        let now = Instant::now();
        for i in 0..FREE {
            assert!(t.attempt(at(&format!("2001:db8::{i:x}")), now).is_ok());
        }
        assert!(t.attempt(at("2001:db8::ffff"), now).is_err());
        assert!(t.attempt(at("2001:db8:0:1::1"), now).is_ok());
        assert!(t.attempt(at("::ffff:10.0.0.9"), now).is_ok());
    }

    #[test]
    fn memory_is_bounded_however_many_clients() {
        let t = Throttle::default();
        let now = Instant::now();
        for i in 0..(MAX_CLIENTS as u32 + 100) {
            let ip = IpAddr::V4((0x0a00_0000 + i).into());
            let _ = t.attempt(Client(Some(ip)), now);
        }
        let len = t.clients.lock().unwrap().len();
        assert_eq!(len, MAX_CLIENTS + 1, "the clients and the shared overflow");
        // The clients beyond the bound share one back-off.
        for i in 0..FREE {
            let ip = IpAddr::V4((0x0b00_0000 + i).into());
            let _ = t.attempt(Client(Some(ip)), now);
        }
        assert!(t.attempt(at("12.0.0.1"), now).is_err());
        // Once the remembered ones are forgotten, room again.
        assert!(t.attempt(at("12.0.0.1"), now + FORGET + LONGEST).is_ok());
        assert!(t.clients.lock().unwrap().len() < 10);
    }
}

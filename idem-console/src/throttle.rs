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
//!
//! **A flood of addresses locks no one else out.** At most
//! [`MAX_CLIENTS`] entries are kept. When they are all taken, the network
//! holding the most entries is remembered as one client: its entries merge
//! into one (failures added up, the longest back-off kept), for an IPv4
//! /24, then /16, /8, for IPv6 a /56, then /48, /40, /32, until an eighth
//! of the table is free. An attacker's addresses thus shrink into a few
//! networks, each one back-off that goes on slowing every address of it,
//! fresh ones included, while a client of any other network keeps its own
//! entry, made in the room freed: its token is checked, its first wrong
//! ones are free. (Before, every client past the bound shared one
//! back-off: 4,100 addresses sending 5 wrong tokens each, 2.5 s of
//! traffic, had the right token refused from any fresh address for up to
//! 5 minutes.) An address that gave the right token is never merged
//! ([`MAX_TRUSTED`] are remembered): the operator is judged by their own
//! attempts even inside a flooding network. The guessing attacker stays
//! slowed: its addresses are refused unchecked as before, and the merged
//! networks are refused whole. Merging reaches a whole address family
//! (all of its clients one, as before) only for entries spread over
//! thousands of IPv6 /32s; never for IPv4, whose 256 /8s leave room.
//!
//! Why not a throttle that always checks the right token: an attempt
//! checked tells its sender whether the token was right, so only a
//! refusal without a look slows a guesser, and a fresh address cannot be
//! told from a guesser's next one. What can be bounded is who shares a
//! refusal: here, the network that failed. The token, when checked, is
//! compared in constant time ([`crate::auth`]).

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
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
/// The most clients (addresses, or networks merged) remembered.
pub(crate) const MAX_CLIENTS: usize = 4096;
/// How many entries merging leaves: an eighth of the table free.
const MERGED_TO: usize = MAX_CLIENTS - MAX_CLIENTS / 8;
/// The most addresses remembered for giving the right token.
pub(crate) const MAX_TRUSTED: usize = 256;
/// The prefixes an IPv4 client is remembered at, finest first: the
/// address, then the networks it may merge into.
const V4_LEVELS: &[u8] = &[32, 24, 16, 8, 0];
/// The same for IPv6: the /64, then the networks.
const V6_LEVELS: &[u8] = &[64, 56, 48, 40, 32, 0];

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

/// A remembered client: a network (its first address and prefix length;
/// an address is a /32, an IPv6 client a /64), or the one client of a
/// server without `ConnectInfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Key {
    Net(IpAddr, u8),
    Unknown,
}

/// The levels of `ip`'s family.
fn levels(ip: IpAddr) -> &'static [u8] {
    match ip {
        IpAddr::V4(_) => V4_LEVELS,
        IpAddr::V6(_) => V6_LEVELS,
    }
}

/// The network of `ip` with a prefix of `bits`.
fn net(ip: IpAddr, bits: u8) -> Key {
    let ip = match ip {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask))
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
    };
    Key::Net(ip, bits)
}

impl Client {
    /// A client whose address the server did not give.
    #[cfg(test)]
    pub(crate) fn unknown() -> Self {
        Client(None)
    }

    /// A client at `ip`.
    #[cfg(test)]
    pub(crate) fn at(ip: IpAddr) -> Self {
        Client(Some(ip))
    }

    /// Its address; an IPv4-mapped IPv6 address is the IPv4 one.
    pub(crate) fn ip(self) -> Option<IpAddr> {
        match self.0? {
            IpAddr::V6(v6) => Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)),
            v4 => Some(v4),
        }
    }

    /// Its own entry's key: the address (an IPv6 client's /64).
    fn key(self) -> Key {
        match self.ip() {
            Some(ip) => net(ip, levels(ip)[0]),
            None => Key::Unknown,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Attempts since the last right token (each counted as it starts).
    failures: u32,
    /// Refused until then.
    until: Instant,
    /// The last attempt.
    last: Instant,
}

impl Entry {
    fn forgotten(&self, now: Instant) -> bool {
        self.until <= now && now.duration_since(self.last) >= FORGET
    }

    /// One entry for the attempts of both.
    fn merge(self, other: Entry) -> Entry {
        Entry {
            failures: self.failures.saturating_add(other.failures),
            until: self.until.max(other.until),
            last: self.last.max(other.last),
        }
    }
}

/// The back-offs of the clients that sent wrong tokens.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<Key, Entry>,
    /// Addresses that gave the right token (never merged), with the
    /// how-manyth right token it was (the oldest go first).
    trusted: HashMap<Key, u64>,
    passes: u64,
}

impl State {
    /// The entry `client`'s attempt counts against: its own, the merged
    /// network holding it, or a new one of its own (making room first).
    fn key_for(&mut self, client: Client, now: Instant) -> Key {
        let Some(ip) = client.ip() else {
            return Key::Unknown;
        };
        let own = client.key();
        if self.entries.contains_key(&own) || self.trusted.contains_key(&own) {
            return own;
        }
        if let Some(network) = self.network_of(ip) {
            return network;
        }
        if self.entries.len() >= MAX_CLIENTS {
            self.entries.retain(|_, e| !e.forgotten(now));
        }
        if self.entries.len() >= MAX_CLIENTS {
            self.merge_networks();
            if let Some(network) = self.network_of(ip) {
                return network;
            }
        }
        own
    }

    /// The merged network holding `ip`, if any.
    fn network_of(&self, ip: IpAddr) -> Option<Key> {
        levels(ip)[1..]
            .iter()
            .map(|bits| net(ip, *bits))
            .find(|k| self.entries.contains_key(k))
    }

    /// Merges the networks holding the most entries, finest prefixes
    /// first, until at most [`MERGED_TO`] entries are left.
    fn merge_networks(&mut self) {
        for level in 1..V6_LEVELS.len() {
            if self.entries.len() <= MERGED_TO {
                return;
            }
            let mut groups: HashMap<Key, Vec<Key>> = HashMap::new();
            for key in self.entries.keys() {
                let Key::Net(ip, bits) = *key else { continue };
                let Some(&to) = levels(ip).get(level) else {
                    continue;
                };
                if bits > to && !self.trusted.contains_key(key) {
                    groups.entry(net(ip, to)).or_default().push(*key);
                }
            }
            let failures = |members: &[Key]| -> u64 {
                members
                    .iter()
                    .map(|k| u64::from(self.entries[k].failures))
                    .sum()
            };
            let mut groups: Vec<(Key, Vec<Key>, u64)> = groups
                .into_iter()
                .filter(|(_, members)| members.len() > 1)
                .map(|(network, members)| {
                    let f = failures(&members);
                    (network, members, f)
                })
                .collect();
            // The largest first, then the most failures; ties in address order.
            groups.sort_by(|a, b| {
                (b.1.len(), b.2)
                    .cmp(&(a.1.len(), a.2))
                    .then_with(|| a.0.cmp(&b.0))
            });
            for (network, members, _) in groups {
                if self.entries.len() <= MERGED_TO {
                    return;
                }
                let merged = members
                    .iter()
                    .filter_map(|k| self.entries.remove(k))
                    .reduce(Entry::merge);
                if let Some(merged) = merged {
                    match self.entries.get_mut(&network) {
                        Some(e) => *e = e.merge(merged),
                        None => {
                            self.entries.insert(network, merged);
                        }
                    }
                }
            }
        }
    }
}

impl Throttle {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a token check for `client`, or refuses it for the time left
    /// of its back-off (its own, or its merged network's). The attempt
    /// counts as wrong until [`Throttle::passed`] says otherwise, so that
    /// parallel attempts cannot all slip in before the first is counted.
    pub(crate) fn attempt(&self, client: Client, now: Instant) -> Result<(), Duration> {
        let mut state = self.lock();
        let key = state.key_for(client, now);
        let e = state.entries.entry(key).or_insert(Entry {
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

    /// The attempt of `client` had the right token: its own back-off
    /// ends, its address is trusted (never merged into a network), and a
    /// merged network it is in no longer counts this attempt.
    pub(crate) fn passed(&self, client: Client) {
        let mut state = self.lock();
        let own = client.key();
        if state.entries.remove(&own).is_none()
            && let Some(network) = client.ip().and_then(|ip| state.network_of(ip))
            && let Some(e) = state.entries.get_mut(&network)
        {
            e.failures = e.failures.saturating_sub(1);
        }
        if own == Key::Unknown {
            return;
        }
        state.passes += 1;
        let nth = state.passes;
        state.trusted.insert(own, nth);
        if state.trusted.len() > MAX_TRUSTED
            && let Some(oldest) = state
                .trusted
                .iter()
                .min_by_key(|(_, n)| **n)
                .map(|(k, _)| *k)
        {
            state.trusted.remove(&oldest);
        }
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

    fn v4(n: u32) -> Client {
        Client(Some(IpAddr::V4(n.into())))
    }

    /// Five wrong tokens from each of `clients`.
    fn flood(t: &Throttle, clients: &[Client], now: Instant) {
        for c in clients {
            for _ in 0..FREE {
                let _ = t.attempt(*c, now);
            }
        }
    }

    #[test]
    fn memory_is_bounded_however_many_clients() {
        let t = Throttle::default();
        let now = Instant::now();
        // Spread over every /8: 60,000 addresses, 5 wrong tokens each.
        let clients: Vec<Client> = (0..60_000u32)
            .map(|i| v4(i.wrapping_mul(2_654_435_761)))
            .collect();
        flood(&t, &clients, now);
        let len = t.lock().entries.len();
        assert!(len <= MAX_CLIENTS, "{len} entries");
        // Every one of them is still slowed.
        for c in clients.iter().step_by(97) {
            assert!(t.attempt(*c, now).is_err(), "{c:?}");
        }
        // Once forgotten, they start afresh.
        let later = now + FORGET + LONGEST;
        for c in clients.iter().step_by(97) {
            assert!(t.attempt(*c, later).is_ok(), "{c:?}");
        }
    }

    /// Merging takes the network with the most entries: a flooding /24
    /// becomes one client, refused whole, fresh addresses of it included;
    /// an address that gave the right token stays its own client in it.
    #[test]
    fn the_flooding_network_is_merged_and_the_trusted_address_in_it_is_not() {
        let t = Throttle::default();
        let now = Instant::now();
        let operator = at("10.0.0.7");
        assert!(t.attempt(operator, now).is_ok());
        t.passed(operator);
        // 10.0.0.0/24 (but the operator) and one address of each of 3,900
        // /24s elsewhere.
        let mut clients: Vec<Client> = (1..255u32)
            .filter(|i| *i != 7)
            .map(|i| v4(0x0a00_0000 + i))
            .collect();
        clients.extend((0..3900u32).map(|i| v4(0x0b00_0001 + (i << 8))));
        flood(&t, &clients, now);
        assert!(t.lock().entries.len() <= MAX_CLIENTS);
        assert!(
            t.lock()
                .entries
                .contains_key(&net("10.0.0.0".parse().unwrap(), 24))
        );
        assert!(
            t.attempt(at("10.0.0.255"), now).is_err(),
            "a fresh address of it"
        );
        for _ in 0..FREE {
            assert!(t.attempt(operator, now).is_ok(), "the operator");
        }
        assert!(
            t.attempt(operator, now).is_err(),
            "the operator's own back-off"
        );
        assert!(t.attempt(at("10.0.1.1"), now).is_ok(), "the next /24");
        // The right token from inside the merged network does not reset it.
        t.passed(at("10.0.0.255"));
        assert!(t.attempt(at("10.0.0.254"), now).is_err());
    }

    /// Issue 36's flood: 4,100 addresses of 127.0.0.0/8, 5 wrong tokens
    /// each (2.5 s of traffic). A client that has not failed is still
    /// checked, from a fresh address, or an IPv6 /64 beside it; every
    /// address of the flood stays refused unchecked.
    #[test]
    fn a_flood_of_new_addresses_locks_out_no_client_that_has_not_failed() {
        let t = Throttle::default();
        let now = Instant::now();
        let clients: Vec<Client> = (0..4100u32).map(|i| v4(0x7f00_0001 + i)).collect();
        flood(&t, &clients, now);
        assert!(t.lock().entries.len() <= MAX_CLIENTS);
        for fresh in ["127.1.0.1", "127.0.200.9", "192.0.2.1", "2001:db8:1::1"] {
            assert!(t.attempt(at(fresh), now).is_ok(), "{fresh} locked out");
        }
        for c in &clients {
            assert!(t.attempt(*c, now).is_err(), "{c:?} not slowed");
        }
    }

    /// One IPv6 /52 (4,096 /64s and more): the same.
    #[test]
    fn a_flood_from_one_ipv6_network_locks_out_no_other_network() {
        let t = Throttle::default();
        let now = Instant::now();
        let base = u128::from("2001:db8:0:0::".parse::<std::net::Ipv6Addr>().unwrap());
        let clients: Vec<Client> = (0..4100u128)
            .map(|i| Client(Some(IpAddr::V6((base + (i << 64) + 1).into()))))
            .collect();
        flood(&t, &clients, now);
        assert!(t.lock().entries.len() <= MAX_CLIENTS);
        for fresh in ["2001:db8:1::1", "2001:db9::1", "127.0.0.1"] {
            assert!(t.attempt(at(fresh), now).is_ok(), "{fresh} locked out");
        }
        for c in &clients {
            assert!(t.attempt(*c, now).is_err(), "{c:?} not slowed");
        }
    }
}

//! Which names the console answers to (the `Host` allowlist that defeats
//! DNS rebinding) and which origins its forms may come from besides its
//! own (the public origin behind a reverse proxy that rewrites `Host`).
//!
//! A page on another site can point a name of its own at the console's
//! address (DNS rebinding) and then read the console as its own origin:
//! the browser then sends that name as `Host`. So the console answers only
//! to names that cannot be pointed elsewhere: IP addresses and `localhost`
//! by default, and the names it was given (`Console::allowed_host`, `idem
//! serve --allowed-host`, the host of each public origin).

use crate::Shared;
use crate::error::PageError;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use idem_runtime::Operable;

/// An allowed host or a public origin that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostError {
    what: &'static str,
    reason: String,
}

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unusable {}: {}", self.what, self.reason)
    }
}

impl std::error::Error for HostError {}

/// A host name (lowercase, without a trailing dot; an IPv6 address in
/// brackets) and its port, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostPort {
    name: String,
    port: Option<u16>,
}

/// `name`, `name:port`, `[v6]` or `[v6]:port`, as a `Host` header or an
/// origin's authority holds it.
fn parse_host(s: &str) -> Option<HostPort> {
    let (name, port) = if let Some(rest) = s.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        v6.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (format!("[{v6}]"), port)
    } else {
        match s.rsplit_once(':') {
            Some((name, port)) => (name.to_string(), Some(port)),
            None => (s.to_string(), None),
        }
    };
    let port = match port {
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => Some(p.parse().ok()?),
        Some(_) => return None,
        None => None,
    };
    let name = name.strip_suffix('.').unwrap_or(&name).to_ascii_lowercase();
    let plain = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_';
    if name.is_empty() || !(name.starts_with('[') || name.chars().all(plain)) {
        return None;
    }
    Some(HostPort { name, port })
}

/// A name no one can point at another address: an IP address, or
/// `localhost` (which resolvers keep on the loopback interface).
fn unreboundable(name: &str) -> bool {
    name == "localhost"
        || name.parse::<std::net::Ipv4Addr>().is_ok()
        || (name.starts_with('[') && name.ends_with(']'))
}

/// An origin (`scheme://host[:port]`), the default port left out as
/// browsers do.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    scheme: &'static str,
    host: HostPort,
}

fn parse_origin(s: &str) -> Option<Origin> {
    let (scheme, rest, default) = if let Some(r) = s.strip_prefix("https://") {
        ("https", r, 443)
    } else if let Some(r) = s.strip_prefix("http://") {
        ("http", r, 80)
    } else {
        return None;
    };
    let mut host = parse_host(rest)?;
    if host.port == Some(default) {
        host.port = None;
    }
    Some(Origin { scheme, host })
}

/// The names and origins the console answers to.
#[derive(Debug, Clone, Default)]
pub(crate) struct Site {
    hosts: Vec<HostPort>,
    origins: Vec<Origin>,
}

impl Site {
    /// Also answers to `host` (`name` at any port, or `name:port`).
    pub(crate) fn allow_host(&mut self, host: &str) -> Result<(), HostError> {
        let shown: String = host.chars().take(80).collect();
        let parsed = parse_host(host.trim()).ok_or_else(|| HostError {
            what: "allowed host",
            reason: format!(
                "{shown:?} is not a host name, optionally with a port (such as \
                 console.example.com or console.example.com:8443)"
            ),
        })?;
        self.hosts.push(parsed);
        Ok(())
    }

    /// Accepts forms from `origin` (`https://console.example.com`), and
    /// answers to its host.
    pub(crate) fn public_origin(&mut self, origin: &str) -> Result<(), HostError> {
        let shown: String = origin.chars().take(80).collect();
        let trimmed = origin.trim();
        let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
        let parsed = parse_origin(trimmed).ok_or_else(|| HostError {
            what: "public origin",
            reason: format!(
                "{shown:?} is not an origin: write the scheme and host users reach the \
                 console at, with the port if not the scheme's default and no path \
                 (such as https://console.example.com)"
            ),
        })?;
        self.hosts.push(HostPort {
            name: parsed.host.name.clone(),
            port: None,
        });
        self.origins.push(parsed);
        Ok(())
    }

    /// Whether a request with this `Host` is answered.
    pub(crate) fn allows_host(&self, host: &str) -> bool {
        let Some(h) = parse_host(host) else {
            return false;
        };
        unreboundable(&h.name)
            || self
                .hosts
                .iter()
                .any(|a| a.name == h.name && (a.port.is_none() || a.port == h.port))
    }

    /// Whether `origin` is one of the public origins.
    pub(crate) fn is_public_origin(&self, origin: &str) -> bool {
        parse_origin(origin).is_some_and(|o| self.origins.contains(&o))
    }
}

/// Refuses (421) a request whose `Host` the console does not answer to,
/// before any page reads anything.
pub(crate) async fn guard<DB: Operable>(
    State(c): State<Shared<DB>>,
    req: Request,
    next: Next,
) -> Response {
    let host = match req.headers().get(header::HOST) {
        Some(h) => Some(String::from_utf8_lossy(h.as_bytes()).into_owned()),
        None => req.uri().authority().map(|a| a.to_string()),
    };
    if let Some(h) = &host
        && c.site.allows_host(h)
    {
        return next.run(req).await;
    }
    metrics::counter!("idem_console_refused_hosts_total").increment(1);
    let message = match host {
        Some(h) => {
            let shown: String = h.chars().take(100).collect();
            let name = parse_host(&shown).map_or(shown.clone(), |p| p.name);
            format!(
                "this console does not answer to the host {shown:?}: a page of another site \
                 may be trying to read it through a name of its own pointed at this address \
                 (DNS rebinding). It answers to IP addresses, localhost and the hosts it was \
                 given: if {name} is the name you reach it at, start it with --allowed-host \
                 {name} (idem serve) or Console::allowed_host."
            )
        }
        None => "the request names no host (Host header): this console answers only to IP \
                 addresses, localhost and the hosts it was given (--allowed-host)"
            .to_string(),
    };
    PageError::Misdirected(message).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_default_ip_addresses_and_localhost_are_answered() {
        let s = Site::default();
        for ok in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "localhost:8080",
            "LOCALHOST",
            "localhost.:8080",
            "[::1]:8080",
            "10.0.0.5:9000",
            "[fe80::1]",
        ] {
            assert!(s.allows_host(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.nip.io:8080",
            "",
            "[::1",
            "a b",
            "host:port",
            "[not-v6]:80",
        ] {
            assert!(!s.allows_host(bad), "{bad}");
        }
    }

    #[test]
    fn allowed_hosts_match_their_port_when_they_name_one() {
        let mut s = Site::default();
        s.allow_host("Console.Example.com").unwrap();
        s.allow_host("ops.example.com:8443").unwrap();
        assert!(s.allows_host("console.example.com"));
        assert!(s.allows_host("console.example.com:8080"));
        assert!(s.allows_host("ops.example.com:8443"));
        assert!(!s.allows_host("ops.example.com"));
        assert!(!s.allows_host("ops.example.com:8080"));
        assert!(!s.allows_host("example.com"));
        for bad in ["", "a/b", "https://x", "x:y", "a b"] {
            let e = s.allow_host(bad).unwrap_err();
            assert!(e.to_string().starts_with("unusable allowed host"), "{e}");
        }
    }

    #[test]
    fn public_origins_are_normalised_and_answered() {
        let mut s = Site::default();
        s.public_origin("https://Console.Example.com:443/").unwrap();
        s.public_origin("http://10.0.0.5:8080").unwrap();
        assert!(s.is_public_origin("https://console.example.com"));
        assert!(s.is_public_origin("http://10.0.0.5:8080"));
        assert!(!s.is_public_origin("http://console.example.com"));
        assert!(!s.is_public_origin("https://console.example.com:8443"));
        assert!(!s.is_public_origin("null"));
        assert!(s.allows_host("console.example.com"));
        for bad in [
            "console.example.com",
            "https://x/path",
            "ftp://x",
            "https://",
        ] {
            let e = s.public_origin(bad).unwrap_err();
            assert!(e.to_string().starts_with("unusable public origin"), "{e}");
        }
    }
}

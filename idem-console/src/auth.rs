//! Who may change what: the write token, the signed session cookie that
//! stands for it in a browser, and the CSRF token every form carries.
//!
//! A session cookie is `<issued>.<nonce>.<mac>`, its MAC keyed by a
//! secret drawn at start-up, and a session's CSRF token is a MAC of its
//! nonce under the same key; a session is valid only while the server
//! holds its nonce ([`Sessions`]), so that signing out ends it there, not
//! only in the browser, and a restart or another write token (a new
//! [`Auth`], a new key, no sessions) ends every one. Comparisons of tokens
//! and MACs run in constant time (`Mac::verify_slice`). Token checks are
//! throttled per client ([`crate::throttle`]), and a token easy to guess
//! is refused at start-up.

use crate::error::PageError;
use crate::host::Site;
use crate::throttle::{self, Client, Throttle};
use crate::viewer::Viewer;
use axum::http::{HeaderMap, header};
use hmac::{KeyInit, Mac};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The cookie holding a signed-in session.
pub(crate) const COOKIE: &str = "idem_session";
/// How long a session lasts.
const SESSION_SECS: u64 = 12 * 3600;
/// The most sessions held at once (see [`Sessions`]).
const MAX_SESSIONS: usize = 1024;
/// The shortest write token accepted.
const MIN_TOKEN: usize = 16;
/// The fewest bits of guessing a write token must take ([`strength_bits`]).
const MIN_BITS: f64 = 64.0;
/// How to make a good token, for the errors that refuse one.
const MAKE_ONE: &str = "make one with `openssl rand -hex 16`";

/// A write token that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenError {
    reason: String,
}

impl std::fmt::Display for TokenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unusable write token: {}", self.reason)
    }
}

impl std::error::Error for TokenError {}

pub(crate) struct Auth {
    key: [u8; 32],
    /// MAC of the write token (none: read-only).
    token_tag: Option<Vec<u8>>,
    /// The back-offs of clients that sent wrong tokens.
    throttle: Throttle,
    /// The sessions signed in and not yet ended.
    sessions: Sessions,
}

/// The sessions the console holds: nonce → when it was issued. A cookie
/// whose MAC is right is still refused unless its nonce is here, so that
/// `/logout` ends a session for whoever holds a copy of its cookie (OWASP
/// ASVS 3.3.1), not only in the browser that signed out.
///
/// A table of live sessions rather than a signed cookie plus a set of
/// revoked ones: it fails closed. Memory stays bounded by dropping
/// sessions (expired ones first, then the oldest), and a dropped session
/// is one signed out, whereas a revocation set kept bounded would have to
/// forget a revocation and so bring a signed-out cookie back to life. The
/// cookie keeps its MAC: a forged or foreign cookie is refused, in
/// constant time, before the table is looked at, so the lookups only
/// ever see nonces the console drew. Only the write token's holders
/// create sessions, so the bound is for a script signing in again and
/// again: past [`MAX_SESSIONS`], its oldest sessions end.
#[derive(Debug, Default)]
struct Sessions(Mutex<Held>);

/// Nonce → (issued, in Unix seconds; the how-manyth session it is).
#[derive(Debug, Default)]
struct Held {
    sessions: HashMap<String, (u64, u64)>,
    issued: u64,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, nonce: String, issued: u64) {
        let mut held = self.lock();
        if held.sessions.len() >= MAX_SESSIONS {
            held.sessions.retain(|_, (at, _)| !expired(*at, issued));
        }
        while held.sessions.len() >= MAX_SESSIONS {
            let Some(oldest) = held
                .sessions
                .iter()
                .min_by_key(|(_, (_, nth))| *nth)
                .map(|(n, _)| n.clone())
            else {
                break;
            };
            held.sessions.remove(&oldest);
        }
        held.issued += 1;
        let nth = held.issued;
        held.sessions.insert(nonce, (issued, nth));
    }

    fn holds(&self, nonce: &str) -> bool {
        self.lock().sessions.contains_key(nonce)
    }

    fn end(&self, nonce: &str) {
        self.lock().sessions.remove(nonce);
    }
}

/// Whether a session issued `at` is over `now` (or issued in the future).
fn expired(at: u64, now: u64) -> bool {
    at > now + 60 || now - at.min(now) > SESSION_SECS
}

/// A valid session cookie.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    nonce: String,
}

fn random_key() -> [u8; 32] {
    let mut key = [0u8; 32];
    // No entropy source at all is a broken machine; the console must not
    // then sign sessions with a known key.
    getrandom::getrandom(&mut key).expect("the operating system's random source");
    key
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// About how many bits of guessing `token` takes: each character is worth
/// the bits of the classes of characters the token uses (lower case, upper
/// case, digits, others), except that one repeating or continuing the one
/// before (`aa`, `ab`, `ba`, `12`) is worth one bit. A random token is
/// worth about its length times its classes' bits (`openssl rand -hex 16`:
/// about 140); `aaaaaaaaaaaaaaaa` or `0123456789abcdef`, about 20. Words
/// are not recognised: this catches the lazy token, not every weak one.
fn strength_bits(token: &str) -> f64 {
    let has = |class: fn(&char) -> bool| token.chars().any(|c| class(&c));
    let mut alphabet: f64 = 0.0;
    for (class, size) in [
        (char::is_ascii_lowercase as fn(&char) -> bool, 26.0),
        (char::is_ascii_uppercase, 26.0),
        (char::is_ascii_digit, 10.0),
    ] {
        if has(class) {
            alphabet += size;
        }
    }
    if token.chars().any(|c| !c.is_ascii_alphanumeric()) {
        alphabet += 33.0;
    }
    let per_char = alphabet.max(2.0).log2();
    let mut bits = 0.0;
    let mut prev: Option<char> = None;
    for c in token.chars() {
        let continues =
            prev.is_some_and(|p| (i64::from(u32::from(c)) - i64::from(u32::from(p))).abs() <= 1);
        bits += if continues { 1.0 } else { per_char };
        prev = Some(c);
    }
    bits
}

/// The refusal of a client in its back-off (429, `Retry-After`).
fn throttled(wait: Duration) -> PageError {
    metrics::counter!("idem_console_throttled_total").increment(1);
    let secs = throttle::retry_after(wait);
    PageError::TooManyRequests {
        message: format!(
            "Too many wrong tokens from here: wait {secs} s before trying again (each further \
             wrong token doubles the wait)."
        ),
        retry_after: secs,
    }
}

impl Auth {
    pub(crate) fn read_only() -> Self {
        Auth {
            key: random_key(),
            token_tag: None,
            throttle: Throttle::default(),
            sessions: Sessions::default(),
        }
    }

    pub(crate) fn with_token(token: &str) -> Result<Self, TokenError> {
        let bad = |reason: &str| {
            Err(TokenError {
                reason: reason.into(),
            })
        };
        if token.chars().count() < MIN_TOKEN {
            return bad(&format!(
                "it must be at least {MIN_TOKEN} characters long: {MAKE_ONE}"
            ));
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return bad(&format!(
                "it must not hold spaces or control characters: {MAKE_ONE}"
            ));
        }
        let bits = strength_bits(token);
        if bits < MIN_BITS {
            return bad(&format!(
                "it is easy to guess (repeated or consecutive characters, few kinds of \
                 character: about {bits:.0} bits, at least {MIN_BITS:.0} needed): {MAKE_ONE}"
            ));
        }
        let mut auth = Auth::read_only();
        auth.token_tag = Some(auth.mac(&[b"token", token.as_bytes()]).to_vec());
        Ok(auth)
    }

    pub(crate) fn writable(&self) -> bool {
        self.token_tag.is_some()
    }

    fn hmac(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut m = <HmacSha256 as KeyInit>::new_from_slice(&self.key).expect("HMAC takes any key");
        for p in parts {
            m.update(&(p.len() as u64).to_be_bytes());
            m.update(p);
        }
        m
    }

    fn mac(&self, parts: &[&[u8]]) -> Vec<u8> {
        self.hmac(parts).finalize().into_bytes().to_vec()
    }

    fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        self.hmac(parts).verify_slice(tag).is_ok()
    }

    /// Whether `given` is the write token (false when there is none).
    fn token_matches(&self, given: &str) -> bool {
        match &self.token_tag {
            Some(tag) => self.verify(&[b"token", given.as_bytes()], tag),
            None => false,
        }
    }

    /// Whether `given`, from `client`, is the write token; refused (429)
    /// without a look at it while the client is in its back-off.
    pub(crate) fn check_token(&self, given: &str, client: Client) -> Result<bool, PageError> {
        self.throttle
            .attempt(client, Instant::now())
            .map_err(throttled)?;
        let ok = self.token_matches(given);
        if ok {
            self.throttle.passed(client);
        }
        Ok(ok)
    }

    /// A fresh session (held until it ends): its cookie's value.
    pub(crate) fn new_session(&self) -> String {
        let mut nonce = [0u8; 16];
        getrandom::getrandom(&mut nonce).expect("the operating system's random source");
        let now = now_secs();
        let (issued, nonce) = (now.to_string(), hex(&nonce));
        let mac = hex(&self.mac(&[b"session", issued.as_bytes(), nonce.as_bytes()]));
        let value = format!("{issued}.{nonce}.{mac}");
        self.sessions.insert(nonce, now);
        value
    }

    /// Ends `s` on the server: its cookie, wherever copied, is refused
    /// from now on.
    pub(crate) fn end_session(&self, s: &Session) {
        self.sessions.end(&s.nonce);
    }

    /// The `Set-Cookie` value of a session.
    /// `path`: where the console is mounted.
    pub(crate) fn set_cookie(value: &str, path: &str) -> String {
        format!("{COOKIE}={value}; Path={path}; HttpOnly; SameSite=Strict; Max-Age={SESSION_SECS}")
    }

    /// The `Set-Cookie` value ending a session.
    pub(crate) fn clear_cookie(path: &str) -> String {
        format!("{COOKIE}=; Path={path}; HttpOnly; SameSite=Strict; Max-Age=0")
    }

    /// The request's session, when its cookie is valid, not expired and
    /// not ended (and the console is writable: a read-only console has no
    /// sessions).
    pub(crate) fn session(&self, headers: &HeaderMap) -> Option<Session> {
        if !self.writable() {
            return None;
        }
        let value = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|kv| kv.trim().split_once('='))
            .find(|(k, _)| *k == COOKIE)
            .map(|(_, v)| v)?;
        let mut parts = value.split('.');
        let (issued, nonce, mac) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let tag = unhex(mac)?;
        if !self.verify(&[b"session", issued.as_bytes(), nonce.as_bytes()], &tag) {
            return None;
        }
        let at: u64 = issued.parse().ok()?;
        if expired(at, now_secs()) || !self.sessions.holds(nonce) {
            return None;
        }
        Some(Session {
            nonce: nonce.to_string(),
        })
    }

    /// The CSRF token of a session.
    pub(crate) fn csrf(&self, s: &Session) -> String {
        hex(&self.mac(&[b"csrf", s.nonce.as_bytes()]))
    }

    /// What the request's sender may do.
    pub(crate) fn viewer(&self, headers: &HeaderMap) -> Viewer {
        Viewer {
            writable: self.writable(),
            csrf: self.session(headers).map(|s| self.csrf(&s)),
        }
    }

    /// Lets a state-changing request through, or says why not: the console
    /// is read-only; the request comes from another origin than this host
    /// or one of `site`'s public origins; it carries
    /// neither the token as a bearer nor a session with its CSRF token;
    /// its client is in its back-off after wrong tokens.
    pub(crate) fn authorize(
        &self,
        headers: &HeaderMap,
        form_csrf: Option<&str>,
        client: Client,
        site: &Site,
    ) -> Result<(), PageError> {
        if !self.writable() {
            return Err(PageError::Forbidden(
                "this console is read-only: start it with a write token (idem serve \
                 --write-token, or IDEM_WRITE_TOKEN) to change anything"
                    .into(),
            ));
        }
        same_origin(headers, site)?;
        if let Some(given) = bearer(headers) {
            return if self.check_token(given, client)? {
                Ok(())
            } else {
                Err(PageError::Forbidden("wrong write token".into()))
            };
        }
        let Some(session) = self.session(headers) else {
            return Err(PageError::Forbidden(
                "sign in with the write token first (/login)".into(),
            ));
        };
        // `verify_slice` compares in constant time.
        let ok = form_csrf
            .and_then(unhex)
            .is_some_and(|given| self.verify(&[b"csrf", session.nonce.as_bytes()], &given));
        if ok {
            Ok(())
        } else {
            Err(PageError::Forbidden(
                "the form's CSRF token is missing or wrong: reload the page and try again".into(),
            ))
        }
    }

    /// Who sent an authorized request, for the audit log and a message's
    /// attempt log: `console`, then how it was let in (`bearer`, or
    /// `session-` and 8 hex digits standing for the session: a MAC of its
    /// nonce, which tells sessions apart without showing anything that
    /// signs in), then `@` and the client's address when the server gives
    /// it: `console:session-1f3a9c0e@192.0.2.7`. The token is shared, so
    /// this names a sign-in, not a person.
    pub(crate) fn actor(&self, headers: &HeaderMap, client: Client) -> String {
        let how = if bearer(headers).is_some() {
            "bearer".to_string()
        } else if let Some(s) = self.session(headers) {
            let tag = hex(&self.mac(&[b"actor", s.nonce.as_bytes()]));
            format!("session-{}", &tag[..8])
        } else {
            "unknown".to_string()
        };
        match client.ip() {
            Some(ip) => format!("console:{how}@{ip}"),
            None => format!("console:{how}"),
        }
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Refuses a request a browser sent from another origin: its `Origin`
/// must be one of the public origins (behind a reverse proxy that
/// rewrites `Host`) or name this host (as the `Host` header gives it), and
/// `Sec-Fetch-Site`, when present, must not say cross-site. Requests with
/// neither header (curl, scripts) pass on to the token checks.
pub(crate) fn same_origin(headers: &HeaderMap, site: &Site) -> Result<(), PageError> {
    let refuse = || {
        Err(PageError::Forbidden(
            "cross-origin request refused: submit the console's own forms. Behind a reverse \
             proxy that rewrites Host (nginx's default), start the console with \
             --public-origin and the origin users reach it at (Console::public_origin)"
                .into(),
        ))
    };
    if let Some(site) = headers.get("sec-fetch-site")
        && !matches!(site.to_str(), Ok("same-origin" | "none"))
    {
        return refuse();
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    if origin.to_str().is_ok_and(|o| site.is_public_origin(o)) {
        return Ok(());
    }
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin_host = origin.to_str().ok().and_then(|o| {
        o.strip_prefix("http://")
            .or_else(|| o.strip_prefix("https://"))
    });
    match (origin_host, host) {
        (Some(o), Some(h)) if o.eq_ignore_ascii_case(h) => Ok(()),
        _ => refuse(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn cookie(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {COOKIE}={value}")).unwrap(),
        );
        h
    }

    /// A token of the tests, random enough.
    const TOKEN: &str = "5d0c9a7e31f84b26";

    #[test]
    fn short_spaced_or_guessable_tokens_are_refused() {
        let refused = |t: &str| Auth::with_token(t).err().map(|e| e.to_string());
        assert!(refused("short").unwrap().contains("at least 16 characters"));
        assert!(refused("sixteen chars ok").unwrap().contains("spaces"));
        for weak in [
            "aaaaaaaaaaaaaaaa",
            "0123456789abcdef",
            "abcdefghijklmnopqrstuvwxyz",
            "password12345678",
            "abababababababababab",
        ] {
            let e = refused(weak).unwrap_or_else(|| panic!("{weak} accepted"));
            assert!(
                e.contains("easy to guess") && e.contains("openssl rand -hex 16"),
                "{e}"
            );
        }
        for strong in [
            TOKEN,
            "ac457a4b69173f7967c2b78204bc04da",
            "test-write-token-0123456789",
        ] {
            assert!(refused(strong).is_none(), "{strong}: {:?}", refused(strong));
        }
        assert!(strength_bits("ac457a4b69173f7967c2b78204bc04da") > 120.0);
        assert!(strength_bits("aaaaaaaaaaaaaaaa") < 25.0);
    }

    #[test]
    fn the_token_matches_only_itself() {
        let a = Auth::with_token(TOKEN).unwrap();
        assert!(a.token_matches(TOKEN));
        assert!(!a.token_matches("5d0c9a7e31f84b2F"));
        assert!(!a.token_matches(""));
        assert!(!Auth::read_only().token_matches(TOKEN));
    }

    #[test]
    fn sessions_are_signed_and_carry_their_csrf_token() {
        let a = Auth::with_token(TOKEN).unwrap();
        let v = a.new_session();
        let s = a.session(&cookie(&v)).expect("own cookie");
        let csrf = a.csrf(&s);
        let c = Client::unknown();
        let site = Site::default();
        assert!(a.authorize(&cookie(&v), Some(&csrf), c, &site).is_ok());
        assert!(a.authorize(&cookie(&v), None, c, &site).is_err());
        assert!(a.authorize(&cookie(&v), Some("00"), c, &site).is_err());
        // Another console's cookie (another key), or a tampered one.
        let b = Auth::with_token(TOKEN).unwrap();
        assert!(b.session(&cookie(&v)).is_none());
        let mut forged = v.clone();
        forged.replace_range(0..1, "9");
        assert!(a.session(&cookie(&forged)).is_none());
        assert!(a.session(&cookie("1.2")).is_none());
    }

    #[test]
    fn a_session_ended_is_refused_and_the_oldest_go_past_the_bound() {
        let a = Auth::with_token(TOKEN).unwrap();
        let v = a.new_session();
        let other = a.new_session();
        let s = a.session(&cookie(&v)).expect("signed in");
        let csrf = a.csrf(&s);
        a.end_session(&s);
        assert!(a.session(&cookie(&v)).is_none(), "a copy of the cookie");
        let (c, site) = (Client::unknown(), Site::default());
        assert!(a.authorize(&cookie(&v), Some(&csrf), c, &site).is_err());
        assert!(a.session(&cookie(&other)).is_some(), "another session");
        // Bounded: past MAX_SESSIONS, the oldest end.
        let all: Vec<String> = (0..MAX_SESSIONS).map(|_| a.new_session()).collect();
        assert_eq!(a.sessions.lock().sessions.len(), MAX_SESSIONS);
        assert!(a.session(&cookie(&all[MAX_SESSIONS - 1])).is_some());
        let held = all.iter().filter(|v| a.session(&cookie(v)).is_some());
        assert_eq!(held.count(), MAX_SESSIONS);
        assert!(a.session(&cookie(&other)).is_none(), "the oldest ended");
    }

    #[test]
    fn cross_origin_posts_are_refused() {
        let site = Site::default();
        let same_origin = |h: &HeaderMap| same_origin(h, &site);
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert!(same_origin(&h).is_ok());
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(same_origin(&h).is_ok());
        h.insert(header::ORIGIN, HeaderValue::from_static("http://evil.test"));
        assert!(same_origin(&h).is_err());
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(same_origin(&h).is_err());
        let mut h = HeaderMap::new();
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(same_origin(&h).is_err());
    }

    #[test]
    fn behind_a_proxy_the_public_origin_is_the_consoles() {
        let mut site = Site::default();
        site.public_origin("https://console.example.com").unwrap();
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://console.example.com"),
        );
        assert!(same_origin(&h, &site).is_ok());
        assert!(same_origin(&h, &Site::default()).is_err());
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.test"),
        );
        assert!(same_origin(&h, &site).is_err());
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(same_origin(&h, &site).is_ok(), "its own host still");
    }

    /// Issue 36's flood through the token checks: after 4,100 addresses
    /// sent 5 wrong tokens each, the right token from a fresh address
    /// signs in, and a bearer from another is let through.
    #[test]
    fn after_a_flood_of_wrong_tokens_a_fresh_address_signs_in_and_a_bearer_passes() {
        let a = Auth::with_token(TOKEN).unwrap();
        let ip = |n: u32| Client::at(std::net::IpAddr::V4(n.into()));
        for i in 0..4100u32 {
            for _ in 0..crate::throttle::FREE {
                let _ = a.check_token("wrong-token-0123456789", ip(0x7f00_0001 + i));
            }
        }
        assert!(
            a.check_token("wrong-token-0123456789", ip(0x7f00_0001))
                .is_err(),
            "the flood is slowed"
        );
        let fresh = ip(0x7f01_0001);
        assert!(matches!(a.check_token(TOKEN, fresh), Ok(true)));
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {TOKEN}")).unwrap(),
        );
        let other = ip(0x7f02_0001);
        assert!(a.authorize(&h, None, other, &Site::default()).is_ok());
    }
}

//! The `Idempotency-Key` request header: its syntax, its limits, and the
//! record key it becomes once scoped by the caller.

use axum::http::HeaderMap;

/// The request header's name (lower case, as `http` stores it).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The longest key accepted, in bytes (a UUID is 36).
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 128;

/// A well-formed `Idempotency-Key` value: 1 to
/// [`MAX_IDEMPOTENCY_KEY_LEN`] bytes of printable ASCII.
///
/// The draft makes the field a Structured Field String (`"…"`, with `\"`
/// and `\\` escapes); the bare form (`Idempotency-Key: 8e03-…`), which many
/// clients send, is accepted too when it holds only visible ASCII other
/// than `"`, `\`, `,` and `;` (a comma would be two fields folded into
/// one; parameters are not accepted).
///
/// ```
/// use idem_runtime::http::IdempotencyKey;
/// assert_eq!(IdempotencyKey::parse(b"\"a-1\"").unwrap().as_str(), "a-1");
/// assert_eq!(IdempotencyKey::parse(b"a-1").unwrap().as_str(), "a-1");
/// assert!(IdempotencyKey::parse(b"\"unterminated").is_err());
/// assert!(IdempotencyKey::parse("cl\u{e9}".as_bytes()).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why an `Idempotency-Key` header was refused (each one a 400).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// No `Idempotency-Key` on a route that requires one.
    Missing,
    /// More than one `Idempotency-Key` field.
    Repeated,
    /// Not a key: what is wrong with it.
    Malformed(String),
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyError::Missing => f.write_str("this operation requires an Idempotency-Key header"),
            KeyError::Repeated => f.write_str("the Idempotency-Key header is repeated"),
            KeyError::Malformed(why) => write!(f, "the Idempotency-Key header is malformed: {why}"),
        }
    }
}

impl std::error::Error for KeyError {}

impl IdempotencyKey {
    /// Parses one header value (see the type's documentation).
    pub fn parse(value: &[u8]) -> Result<Self, KeyError> {
        let bad = |why: &str| Err(KeyError::Malformed(why.to_owned()));
        let value = trim_ows(value);
        let key = if let Some(rest) = value.strip_prefix(b"\"") {
            let mut key = Vec::with_capacity(rest.len());
            let mut bytes = rest.iter();
            loop {
                match bytes.next() {
                    None => return bad("the quoted string is not terminated"),
                    Some(b'"') => break,
                    Some(b'\\') => match bytes.next() {
                        Some(&c @ (b'"' | b'\\')) => key.push(c),
                        _ => return bad("only \\\" and \\\\ may be escaped"),
                    },
                    Some(&c) if (0x20..=0x7e).contains(&c) => key.push(c),
                    Some(_) => return bad("only printable ASCII is allowed"),
                }
            }
            if bytes.next().is_some() {
                return bad("nothing may follow the quoted string (parameters are not accepted)");
            }
            key
        } else {
            if let Some(c) = value.iter().find(|c| !(0x21..=0x7e).contains(*c)) {
                return if *c == b' ' || *c == b'\t' {
                    bad("a bare key may not contain white space (quote it)")
                } else {
                    bad("only printable ASCII is allowed")
                };
            }
            if value
                .iter()
                .any(|c| matches!(c, b'"' | b'\\' | b',' | b';'))
            {
                return bad("a bare key may not contain '\"', '\\', ',' or ';' (quote it)");
            }
            value.to_vec()
        };
        if key.is_empty() {
            return bad("the key is empty");
        }
        if key.len() > MAX_IDEMPOTENCY_KEY_LEN {
            return Err(KeyError::Malformed(format!(
                "the key is {} bytes long; at most {MAX_IDEMPOTENCY_KEY_LEN} are accepted",
                key.len()
            )));
        }
        // Printable ASCII only, checked above: valid UTF-8.
        Ok(IdempotencyKey(String::from_utf8(key).expect("ASCII")))
    }

    /// The key of a request: `None` without the header.
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<Self>, KeyError> {
        let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
        let Some(first) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(KeyError::Repeated);
        }
        Self::parse(first.as_bytes()).map(Some)
    }

    /// The key as the client sent it (unquoted).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// The record's key (see [`idem_core::requests::record_key`]).
pub(super) fn record_key(identity: &str, key: &IdempotencyKey) -> String {
    idem_core::requests::record_key(identity, &key.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<String, KeyError> {
        IdempotencyKey::parse(s.as_bytes()).map(|k| k.0)
    }

    #[test]
    fn quoted_and_bare() {
        assert_eq!(parse("\"8e03978e-40d5\"").unwrap(), "8e03978e-40d5");
        assert_eq!(parse("  \"a b\"\t").unwrap(), "a b");
        assert_eq!(parse(r#""q\"x\\""#).unwrap(), "q\"x\\");
        assert_eq!(parse("abc_DEF.123~").unwrap(), "abc_DEF.123~");
    }

    #[test]
    fn refused() {
        for bad in [
            "",
            "\"\"",
            "\"open",
            "\"a\";p=1",
            "\"a\" x",
            r#""\n""#,
            "a b",
            "a,b",
            "a;b",
            "\"\u{e9}\"",
            "tab\there",
        ] {
            assert!(matches!(parse(bad), Err(KeyError::Malformed(_))), "{bad:?}");
        }
        assert!(parse(&"k".repeat(MAX_IDEMPOTENCY_KEY_LEN)).is_ok());
        let long = parse(&"k".repeat(MAX_IDEMPOTENCY_KEY_LEN + 1)).unwrap_err();
        assert!(long.to_string().contains("129 bytes"), "{long}");
        assert!(parse("\"\x01\"").is_err());
    }

    #[test]
    fn headers() {
        let mut h = HeaderMap::new();
        assert_eq!(IdempotencyKey::from_headers(&h), Ok(None));
        h.append(IDEMPOTENCY_KEY, "\"k\"".parse().unwrap());
        assert_eq!(
            IdempotencyKey::from_headers(&h).unwrap().unwrap().as_str(),
            "k"
        );
        h.append(IDEMPOTENCY_KEY, "\"k\"".parse().unwrap());
        assert_eq!(IdempotencyKey::from_headers(&h), Err(KeyError::Repeated));
    }

    #[test]
    fn record_keys_are_scoped_and_fixed_length() {
        let k = IdempotencyKey("k".into());
        let a = record_key("alice", &k);
        assert_eq!(a.len(), 5 + 64);
        assert_ne!(a, record_key("bob", &k));
        // Length-prefixed: ("ab", "c") and ("a", "bc") differ.
        assert_ne!(
            record_key("ab", &IdempotencyKey("c".into())),
            record_key("a", &IdempotencyKey("bc".into()))
        );
    }
}

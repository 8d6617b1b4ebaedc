//! Idempotency keys: stable encodings of key parts, and run-time checks.
//!
//! A key is derived from the handler's `key = "..."` template. Each
//! `{placeholder}` is encoded by [`KeyPart`], whose encodings are stable
//! across processes, versions and retries, then percent-encoded
//! ([`escape_part`]) so that a part never contains a separator: distinct
//! parts always give distinct keys. The finished key is checked at run time:
//! every part non-empty and free of control characters, at most
//! [`MAX_KEY_LEN`] bytes once encoded, and the handler's optional `validate`
//! function.

use crate::Error;
use std::borrow::Cow;
use std::fmt::Write as _;

/// The longest key accepted, in bytes of the encoded key (the record
/// table's key column): a part of `n` bytes outside `[A-Za-z0-9-._~]`
/// takes `3n`.
pub const MAX_KEY_LEN: usize = 128;

/// A value with a stable, canonical text encoding, usable in a key template.
///
/// What [`write_key_part`](KeyPart::write_key_part) writes is the part's raw
/// text; [`KeyBuilder::part`] then percent-encodes it ([`escape_part`]), so
/// an implementation need not (and must not) escape anything itself.
///
/// Implemented for integers, `bool`, `char`, strings and (with the `uuid`
/// feature) UUIDs. Implement it for your own newtypes:
///
/// ```
/// struct OrderNo(String);
///
/// impl idem_runtime::KeyPart for OrderNo {
///     fn write_key_part(&self, out: &mut String) {
///         self.0.write_key_part(out)
///     }
/// }
/// ```
///
/// Deliberately not implemented: floats (no canonical text: `0.1 + 0.2`,
/// `-0.0`, `NaN`), `Option` (`None` would silently collide across
/// messages), time types (precision and time zone change between retries),
/// and hash maps (no stable order).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of an idempotency key",
    label = "this key placeholder has type `{Self}`, which has no stable key encoding",
    note = "key parts must encode the same way on every retry: integers, strings, UUIDs and newtypes implementing `idem_runtime::KeyPart` do",
    note = "floats have no canonical text, `Option` makes `None` collide, time types change precision and zone, hash maps have no stable order"
)]
pub trait KeyPart {
    /// Appends the canonical encoding of `self` to `out`.
    fn write_key_part(&self, out: &mut String);
}

macro_rules! int_key_part {
    ($($t:ty),*) => {$(
        impl KeyPart for $t {
            fn write_key_part(&self, out: &mut String) {
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
int_key_part!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, bool, char
);

impl KeyPart for str {
    fn write_key_part(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl KeyPart for String {
    fn write_key_part(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl KeyPart for Cow<'_, str> {
    fn write_key_part(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for &T {
    fn write_key_part(&self, out: &mut String) {
        (**self).write_key_part(out)
    }
}

impl<T: KeyPart + ?Sized> KeyPart for Box<T> {
    fn write_key_part(&self, out: &mut String) {
        (**self).write_key_part(out)
    }
}

impl<T: KeyPart + ?Sized> KeyPart for std::sync::Arc<T> {
    fn write_key_part(&self, out: &mut String) {
        (**self).write_key_part(out)
    }
}

#[cfg(feature = "uuid")]
impl KeyPart for uuid::Uuid {
    fn write_key_part(&self, out: &mut String) {
        // Lower-case hyphenated: the one canonical form.
        let _ = write!(out, "{}", self.hyphenated());
    }
}

/// Builds a key from a template's literal text and placeholders.
///
/// Used by the code `#[idempotent]` generates; public so that the same
/// checks can be applied to keys built by hand.
///
/// # Encoding
///
/// Literal text is copied as is. Each part is written by its [`KeyPart`]
/// impl, then percent-encoded: every byte of its UTF-8 outside the RFC 3986
/// unreserved set `[A-Za-z0-9-._~]` becomes `%XX` (upper-case hex). Ordinary
/// IDs (`ORD-1`, `42`, `-7`, UUIDs) are unchanged; `a:b` becomes `a%3Ab` and
/// `%` becomes `%25`. `#[idempotent]` also requires, at compile time, that
/// the text after a placeholder starts with a separator (a character outside
/// `[A-Za-z0-9-._~%]`, such as `:` `/` `|` `#` `@` `,`) and that two
/// placeholders never touch. Together these make the key injective: each
/// part is the maximal run of unreserved characters and `%XX` escapes,
/// ended by a separator or the end, so `"coupon:{m.topic}:{m.msg_id}"` gives
/// `coupon:a%3Ab:c` for (`a:b`, `c`) and `coupon:a:b%3Ac` for (`a`, `b:c`),
/// where parts spliced raw would both give `coupon:a:b:c`.
///
/// [`MAX_KEY_LEN`] counts the encoded key. Keys whose parts contain
/// characters outside the unreserved set differ from those of idem 0.1,
/// which spliced parts raw: drain the records and outbox messages in flight
/// that have such parts before upgrading, or their retries will not be
/// recognised as duplicates.
///
/// ```
/// use idem_runtime::KeyBuilder;
/// let key = KeyBuilder::new()
///     .lit("coupon:")
///     .part("msg.id", &42u64)
///     .finish(None)
///     .unwrap();
/// assert_eq!(key, "coupon:42");
///
/// let key = KeyBuilder::new()
///     .lit("coupon:")
///     .part("msg.topic", "a:b")
///     .lit(":")
///     .part("msg.msg_id", "c")
///     .finish(None)
///     .unwrap();
/// assert_eq!(key, "coupon:a%3Ab:c");
///
/// let err = KeyBuilder::new().lit("coupon:").part("msg.id", "").finish(None);
/// assert!(err.is_err());
/// ```
#[derive(Debug, Default)]
pub struct KeyBuilder {
    key: String,
    /// The part being encoded, before escaping.
    scratch: String,
    empty_part: Option<&'static str>,
    /// The first part with a control character, and the character.
    control_part: Option<(&'static str, char)>,
}

/// A user-supplied key validator: `validate = path::to::fn` in the attribute.
pub type Validator = fn(&str) -> Result<(), String>;

impl KeyBuilder {
    /// A new, empty key.
    pub fn new() -> Self {
        KeyBuilder {
            key: String::with_capacity(64),
            scratch: String::new(),
            empty_part: None,
            control_part: None,
        }
    }

    /// Appends literal template text.
    pub fn lit(mut self, text: &str) -> Self {
        self.key.push_str(text);
        self
    }

    /// Appends a placeholder's value, percent-encoded (see [`escape_part`]);
    /// `name` is the placeholder as written.
    pub fn part<T: KeyPart + ?Sized>(mut self, name: &'static str, value: &T) -> Self {
        self.scratch.clear();
        value.write_key_part(&mut self.scratch);
        if self.scratch.is_empty() && self.empty_part.is_none() {
            self.empty_part = Some(name);
        }
        // Escaping would make a control character harmless to the key, but
        // an ID carrying one is malformed: still rejected, as before.
        if self.control_part.is_none()
            && let Some(c) = self.scratch.chars().find(|c| c.is_control())
        {
            self.control_part = Some((name, c));
        }
        escape_part(&self.scratch, &mut self.key);
        self
    }

    /// Checks and returns the key.
    pub fn finish(self, validate: Option<Validator>) -> Result<String, Error> {
        let invalid = |key: &str, reason: String| Error::InvalidKey {
            key: display_key(key),
            reason,
        };
        if let Some(name) = self.empty_part {
            return Err(invalid(
                &self.key,
                format!("placeholder `{{{name}}}` is empty"),
            ));
        }
        if let Some((name, c)) = self.control_part {
            return Err(invalid(
                &self.key,
                format!("placeholder `{{{name}}}` contains the control character {c:?}"),
            ));
        }
        check_key(&self.key)?;
        if let Some(v) = validate {
            v(&self.key).map_err(|reason| invalid(&self.key, reason))?;
        }
        Ok(self.key)
    }
}

/// Appends `raw` percent-encoded to `out`: every byte of its UTF-8 outside
/// the RFC 3986 unreserved set `[A-Za-z0-9-._~]` becomes `%XX` (upper-case
/// hex). `ORD-1`, `42`, `-7` and UUIDs stay as they are; `a:b` becomes
/// `a%3Ab`, `%` becomes `%25`, `é` becomes `%C3%A9`.
///
/// This is what makes keys injective: a part never contains a separator,
/// and the template's text after a placeholder starts with one (checked at
/// compile time), so a key says where each part ends.
///
/// ```
/// let mut key = String::from("coupon:");
/// idem_runtime::escape_part("a:b", &mut key);
/// assert_eq!(key, "coupon:a%3Ab");
/// ```
pub fn escape_part(raw: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in raw.as_bytes() {
        if is_unreserved(b) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xF)] as char);
        }
    }
}

/// RFC 3986 unreserved: `[A-Za-z0-9-._~]`.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The run-time checks every key passes: non-empty, at most
/// [`MAX_KEY_LEN`] bytes (of the encoded key), no control characters.
pub fn check_key(key: &str) -> Result<(), Error> {
    let reason = if key.is_empty() {
        "the key is empty".to_string()
    } else if key.len() > MAX_KEY_LEN {
        format!(
            "the key is {} bytes long once its parts are percent-encoded, at most \
             {MAX_KEY_LEN} are allowed",
            key.len()
        )
    } else if let Some(c) = key.chars().find(|c| c.is_control()) {
        format!("the key contains the control character {c:?}")
    } else {
        return Ok(());
    };
    Err(Error::InvalidKey {
        key: display_key(key),
        reason,
    })
}

fn display_key(key: &str) -> String {
    let mut shown: String = key
        .chars()
        .take(160)
        .flat_map(char::escape_default)
        .collect();
    if key.chars().count() > 160 {
        shown.push('…');
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_parts_canonically() {
        let k = KeyBuilder::new()
            .lit("a:")
            .part("x", &-7i32)
            .lit(":")
            .part("y", "q")
            .finish(None)
            .unwrap();
        assert_eq!(k, "a:-7:q");
    }

    /// Issue 8, item 4: parts were spliced raw, so an ID containing the
    /// template's separator could forge another message's key.
    #[test]
    fn crafted_ids_do_not_collide() {
        let key = |topic: &str, id: &str| {
            KeyBuilder::new()
                .lit("coupon:")
                .part("msg.topic", topic)
                .lit(":")
                .part("msg.msg_id", id)
                .finish(None)
                .unwrap()
        };
        assert_ne!(key("a:b", "c"), key("a", "b:c"));
    }

    #[test]
    fn rejects_bad_keys() {
        assert!(check_key("").is_err());
        assert!(check_key(&"k".repeat(129)).is_err());
        assert!(check_key(&"k".repeat(128)).is_ok());
        assert!(check_key("a\nb").is_err());
        let e = KeyBuilder::new()
            .lit("a:")
            .part("m.id", "")
            .finish(None)
            .unwrap_err();
        assert!(e.to_string().contains("{m.id}"), "{e}");
        assert!(!e.is_retryable());
    }

    #[test]
    fn runs_the_validator() {
        fn digits(k: &str) -> Result<(), String> {
            if k.bytes().all(|b| b.is_ascii_digit()) {
                Ok(())
            } else {
                Err("not all digits".into())
            }
        }
        assert!(
            KeyBuilder::new()
                .part("a", "123")
                .finish(Some(digits))
                .is_ok()
        );
        let e = KeyBuilder::new()
            .part("a", "12x")
            .finish(Some(digits))
            .unwrap_err();
        assert!(e.to_string().contains("not all digits"));
    }

    #[test]
    fn escapes_what_is_not_unreserved() {
        let enc = |raw: &str| {
            let mut out = String::new();
            escape_part(raw, &mut out);
            out
        };
        // Ordinary IDs stay readable.
        for id in [
            "ORD-1",
            "42",
            "-7",
            "a.b_c~d",
            "67e55044-10b1-426f-9247-bb680e5fe0c8",
        ] {
            assert_eq!(enc(id), id);
        }
        assert_eq!(enc("a:b"), "a%3Ab");
        assert_eq!(enc("%"), "%25");
        assert_eq!(enc("a b/c"), "a%20b%2Fc");
        assert_eq!(enc("é"), "%C3%A9");
        assert_eq!(enc("\n"), "%0A");
        let e = KeyBuilder::new()
            .lit("k:")
            .part("m.id", "evil\u{0}id")
            .finish(None)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("{m.id}` contains the control character"),
            "{e}"
        );
        // Custom `KeyPart` impls are encoded too.
        struct Pair(u8, u8);
        impl KeyPart for Pair {
            fn write_key_part(&self, out: &mut String) {
                let _ = write!(out, "{}:{}", self.0, self.1);
            }
        }
        let k = KeyBuilder::new()
            .lit("p:")
            .part("p", &Pair(1, 2))
            .finish(None)
            .unwrap();
        assert_eq!(k, "p:1%3A2");
    }

    #[test]
    fn the_length_limit_counts_the_encoded_key() {
        // 43 raw bytes, 2 + 129 encoded.
        let raw = ":".repeat(43);
        let e = KeyBuilder::new()
            .lit("k:")
            .part("p", raw.as_str())
            .finish(None)
            .unwrap_err();
        assert!(e.to_string().contains("131 bytes"), "{e}");
        let raw = ":".repeat(42);
        assert!(
            KeyBuilder::new()
                .lit("k:")
                .part("p", raw.as_str())
                .finish(None)
                .is_ok()
        );
    }

    /// Injectivity over random templates that obey the compile-time rules
    /// (a separator after every placeholder but the last, which may end
    /// the template) and random part values.
    mod injective {
        use super::super::*;
        use proptest::prelude::*;

        /// A template: leading text, then each placeholder with the text after it.
        #[derive(Debug, Clone)]
        struct Template {
            head: String,
            tails: Vec<String>,
        }

        const SEPARATORS: &str = ":/|#@,";

        fn text() -> impl Strategy<Value = String> {
            "[a-zA-Z0-9:/|#@,._~%-]{0,5}"
        }

        fn separated() -> impl Strategy<Value = String> {
            ("[:/|#@,]", text()).prop_map(|(s, t)| s + &t)
        }

        fn template() -> impl Strategy<Value = Template> {
            (
                text(),
                proptest::collection::vec(separated(), 1..5),
                any::<bool>(),
            )
                .prop_map(|(head, mut tails, open_end)| {
                    if open_end {
                        tails.last_mut().expect("one part at least").clear();
                    }
                    Template { head, tails }
                })
        }

        fn value() -> impl Strategy<Value = String> {
            prop_oneof![
                "[a:b%/._~|#@, -]{1,6}",
                any::<String>().prop_filter("non-empty", |s| !s.is_empty()),
                "[A-Za-z0-9-]{1,8}",
            ]
        }

        fn with_values(n: usize) -> impl Strategy<Value = Vec<String>> {
            proptest::collection::vec(value(), n)
        }

        fn encode(t: &Template, parts: &[String]) -> String {
            let mut b = KeyBuilder::new().lit(&t.head);
            for (part, tail) in parts.iter().zip(&t.tails) {
                b = b.part("p", part.as_str()).lit(tail);
            }
            // The key before `finish`: its length and control-character
            // checks are not what is tested here.
            b.key
        }

        /// Reads the parts back: each is the maximal run of unreserved
        /// characters and `%XX` escapes, ended by a separator or the end.
        fn decode(t: &Template, key: &str) -> Option<Vec<String>> {
            let mut rest = key.strip_prefix(t.head.as_str())?;
            let mut parts = Vec::new();
            for tail in &t.tails {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || "-._~%".contains(c)))
                    .unwrap_or(rest.len());
                let (encoded, after) = rest.split_at(end);
                let mut bytes = Vec::new();
                let mut it = encoded.bytes();
                while let Some(b) = it.next() {
                    if b == b'%' {
                        let hex = [it.next()?, it.next()?];
                        bytes.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
                    } else {
                        bytes.push(b);
                    }
                }
                parts.push(String::from_utf8(bytes).ok()?);
                rest = after.strip_prefix(tail.as_str())?;
            }
            rest.is_empty().then_some(parts)
        }

        fn template_and_values() -> impl Strategy<Value = (Template, Vec<String>, Vec<String>)> {
            template().prop_flat_map(|t| {
                let n = t.tails.len();
                (Just(t), with_values(n), with_values(n))
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(5_000))]

            #[test]
            fn keys_decode_to_their_parts((t, a, b) in template_and_values()) {
                for tail in &t.tails[..t.tails.len() - 1] {
                    prop_assert!(SEPARATORS.contains(tail.chars().next().unwrap()));
                }
                let (ka, kb) = (encode(&t, &a), encode(&t, &b));
                prop_assert_eq!(decode(&t, &ka), Some(a.clone()));
                prop_assert_eq!(decode(&t, &kb), Some(b.clone()));
                // And directly: distinct parts, distinct keys.
                prop_assert_eq!(a == b, ka == kb, "{:?} {:?} → {} {}", a, b, ka, kb);
            }

            /// Part tuples that differ only by where a separator falls, the
            /// attack of issue 8: `a:b` + `c` against `a` + `b:c`.
            #[test]
            fn moved_separators_do_not_collide(
                t in template(),
                left in "[a-z]{1,4}",
                right in "[a-z]{1,4}",
                sep in "[:/|#@,%]",
            ) {
                if t.tails.len() >= 2 {
                    let sep0 = t.tails[0].clone();
                    let mut a: Vec<String> = vec!["x".into(); t.tails.len()];
                    let mut b = a.clone();
                    a[0] = format!("{left}{sep0}{right}");
                    a[1] = "c".into();
                    b[0] = left.clone();
                    b[1] = format!("{right}{sep}c");
                    if a != b {
                        prop_assert_ne!(encode(&t, &a), encode(&t, &b));
                    }
                }
            }
        }
    }
}

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
#[path = "key_tests.rs"]
mod tests;

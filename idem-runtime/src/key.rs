//! Idempotency keys: stable encodings of key parts, and run-time checks.
//!
//! A key is derived from the handler's `key = "..."` template. Each
//! `{placeholder}` is encoded by [`KeyPart`], whose encodings are stable
//! across processes, versions and retries. The finished key is checked at
//! run time: every part non-empty, at most [`MAX_KEY_LEN`] bytes, no control
//! characters, and the handler's optional `validate` function.

use crate::Error;
use std::borrow::Cow;
use std::fmt::Write as _;

/// The longest key accepted, in bytes (the record table's key column).
pub const MAX_KEY_LEN: usize = 128;

/// A value with a stable, canonical text encoding, usable in a key template.
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
/// ```
/// use idem_runtime::KeyBuilder;
/// let key = KeyBuilder::new()
///     .lit("coupon:")
///     .part("msg.id", &42u64)
///     .finish(None)
///     .unwrap();
/// assert_eq!(key, "coupon:42");
///
/// let err = KeyBuilder::new().lit("coupon:").part("msg.id", "").finish(None);
/// assert!(err.is_err());
/// ```
#[derive(Debug, Default)]
pub struct KeyBuilder {
    key: String,
    empty_part: Option<&'static str>,
}

/// A user-supplied key validator: `validate = path::to::fn` in the attribute.
pub type Validator = fn(&str) -> Result<(), String>;

impl KeyBuilder {
    /// A new, empty key.
    pub fn new() -> Self {
        KeyBuilder {
            key: String::with_capacity(64),
            empty_part: None,
        }
    }

    /// Appends literal template text.
    pub fn lit(mut self, text: &str) -> Self {
        self.key.push_str(text);
        self
    }

    /// Appends a placeholder's value; `name` is the placeholder as written.
    pub fn part<T: KeyPart + ?Sized>(mut self, name: &'static str, value: &T) -> Self {
        let before = self.key.len();
        value.write_key_part(&mut self.key);
        if self.key.len() == before && self.empty_part.is_none() {
            self.empty_part = Some(name);
        }
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
        check_key(&self.key)?;
        if let Some(v) = validate {
            v(&self.key).map_err(|reason| invalid(&self.key, reason))?;
        }
        Ok(self.key)
    }
}

/// The run-time checks every key passes: non-empty, at most
/// [`MAX_KEY_LEN`] bytes, no control characters.
pub fn check_key(key: &str) -> Result<(), Error> {
    let reason = if key.is_empty() {
        "the key is empty".to_string()
    } else if key.len() > MAX_KEY_LEN {
        format!(
            "the key is {} bytes long, at most {MAX_KEY_LEN} are allowed",
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
}

//! Pieces shared by `idem-macros` (at compile time) and `idem-runtime` (at
//! run time), so that both apply exactly the same rule: what a plain SQL
//! identifier is, how `?` placeholders become PostgreSQL's `$n`, and the
//! one grammar of durations ([`duration`]).
//!
//! No dependencies: a proc-macro crate can use it without pulling the
//! runtime in.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod duration;

/// The longest identifier PostgreSQL keeps without truncating it.
pub const MAX_IDENTIFIER_LEN: usize = 63;

/// Whether `s` is a plain SQL identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most
/// [`MAX_IDENTIFIER_LEN`] bytes), optionally qualified once
/// (`schema.table`).
///
/// ```
/// use idem_syntax::is_identifier;
/// assert!(is_identifier("coupon"));
/// assert!(is_identifier("shop.coupon"));
/// assert!(!is_identifier("coupon; DROP TABLE x"));
/// assert!(!is_identifier("a.b.c"));
/// ```
pub fn is_identifier(s: &str) -> bool {
    let plain = |p: &str| {
        let mut b = p.bytes();
        matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
            && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
            && p.len() <= MAX_IDENTIFIER_LEN
    };
    match s.split_once('.') {
        Some((a, b)) => plain(a) && plain(b),
        None => plain(s),
    }
}

/// Rewrites the `?` placeholders of `sql` as PostgreSQL's `$1`, `$2`, …,
/// skipping `?` inside single-quoted string literals and double-quoted
/// identifiers.
///
/// ```
/// use idem_syntax::numbered_placeholders;
/// assert_eq!(
///     numbered_placeholders("SELECT a FROM t WHERE b = ? AND c = '?' AND d = ?"),
///     "SELECT a FROM t WHERE b = $1 AND c = '?' AND d = $2"
/// );
/// ```
pub fn numbered_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let (mut n, mut quote) = (0, None::<char>);
    for c in sql.chars() {
        match (quote, c) {
            (None, '\'' | '"') => {
                quote = Some(c);
                out.push(c);
            }
            (Some(q), _) if c == q => {
                quote = None;
                out.push(c);
            }
            (None, '?') => {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        for ok in ["a", "_a1", "idem_outbox", "s.t", &"x".repeat(63)] {
            assert!(is_identifier(ok), "{ok}");
        }
        for bad in [
            "",
            "1a",
            "a-b",
            "a b",
            "a.",
            ".a",
            "a.b.c",
            "\"a\"",
            "a;",
            "é",
            &"x".repeat(64),
        ] {
            assert!(!is_identifier(bad), "{bad}");
        }
    }

    #[test]
    fn placeholders() {
        assert_eq!(numbered_placeholders("?, ?, ?"), "$1, $2, $3");
        assert_eq!(numbered_placeholders("no binds"), "no binds");
        // Escaped quotes ('') close and reopen: still inside the literal.
        assert_eq!(
            numbered_placeholders("x = 'it''s ?' AND y = ?"),
            "x = 'it''s ?' AND y = $1"
        );
        assert_eq!(numbered_placeholders(r#""a?b" = ?"#), r#""a?b" = $1"#);
    }
}

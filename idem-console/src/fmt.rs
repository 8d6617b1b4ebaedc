//! Numbers, ages and stored names as operators read them.

use maud::{Markup, html};
use std::borrow::Cow;

/// Seconds as `42s`, `3m 07s`, `2h 05m`, `3d 04h`.
pub(crate) fn age(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// Whether `v`'s spaces would hide in a page: at its ends, several in a
/// row, or another kind of space than U+0020 (or it is empty, or starts
/// with the quote [`label`] would add).
fn hides_spaces(v: &str) -> bool {
    v.is_empty()
        || v.starts_with(char::is_whitespace)
        || v.ends_with(char::is_whitespace)
        || v.starts_with('"')
        || v.contains("  ")
        || v.chars().any(|c| c.is_whitespace() && c != ' ')
}

/// A stored name (topic, key, type) as text that shows it exactly: as is,
/// unless [spaces would hide](hides_spaces) in it; then quoted, each space
/// a no-break space that HTML does not collapse, each other whitespace or
/// quote escaped (`"pay "` and `" pay"`, never two `pay`s).
pub(crate) fn label(v: &str) -> Cow<'_, str> {
    if !hides_spaces(v) {
        return Cow::Borrowed(v);
    }
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        match c {
            ' ' => s.push('\u{a0}'),
            '"' | '\\' => {
                s.push('\\');
                s.push(c);
            }
            c if c.is_whitespace() => s.extend(c.escape_unicode()),
            c => s.push(c),
        }
    }
    s.push('"');
    Cow::Owned(s)
}

/// [`label`] as markup: a name whose spaces would hide is marked
/// (`span.spaced`, with a title saying why it is quoted).
pub(crate) fn name(v: &str) -> Markup {
    if hides_spaces(v) {
        html! { span.spaced title="quoted: its spaces are part of it" { (label(v)) } }
    } else {
        html! { (v) }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ages_and_counts() {
        assert_eq!(super::age(0.4), "0s");
        assert_eq!(super::age(187.0), "3m 07s");
        assert_eq!(super::age(7500.0), "2h 05m");
        assert_eq!(super::age(3.0 * 86_400.0 + 4.0 * 3600.0), "3d 04h");
    }

    #[test]
    fn names_whose_spaces_would_hide_are_quoted() {
        use super::label;
        assert_eq!(label("pay"), "pay");
        assert_eq!(label("pay out"), "pay out");
        assert_eq!(label("pay "), "\"pay\u{a0}\"");
        assert_eq!(label(" pay"), "\"\u{a0}pay\"");
        assert_eq!(label("pay  out"), "\"pay\u{a0}\u{a0}out\"");
        assert_eq!(label("pay\u{a0}"), "\"pay\\u{a0}\"");
        assert_eq!(label("\"pay\""), "\"\\\"pay\\\"\"");
        assert_ne!(label("pay "), label(" pay"));
        assert!(
            super::name("pay ")
                .into_string()
                .contains("class=\"spaced\"")
        );
        assert_eq!(super::name("pay").into_string(), "pay");
    }
}

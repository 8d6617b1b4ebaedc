//! Settings read from the environment, where set-but-empty means unset.

/// The value of the environment variable `name`, trimmed; `None` when it
/// is unset, empty or only whitespace. `DATABASE_URL=` (common in shells,
/// `.env` and CI files) then means "not set, use the default", not a URL
/// of no characters. A value that is not Unicode counts as unset too.
///
/// ```
/// assert_eq!(idem_testkit::env_setting("IDEM_TESTKIT_NEVER_SET_42"), None);
/// ```
pub fn env_setting(name: &str) -> Option<String> {
    non_empty(std::env::var(name).ok()?)
}

/// `value` trimmed, unless nothing is left.
fn non_empty(value: String) -> Option<String> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        None
    } else if trimmed.len() == value.len() {
        Some(value)
    } else {
        Some(trimmed.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_blank_values_are_unset() {
        assert_eq!(non_empty(String::new()), None);
        assert_eq!(non_empty("  \t".into()), None);
        assert_eq!(
            non_empty("sqlite::memory:".into()).as_deref(),
            Some("sqlite::memory:")
        );
        assert_eq!(
            non_empty(" postgres://h/db\n".into()).as_deref(),
            Some("postgres://h/db")
        );
    }
}

//! The guide's errors chapter: what an `Error` displays, and its kind.

/// The chapter's block, run by `tests::the_errors_chapter_runs`.
pub fn display_and_kind() {
    // README: errors
    use idem_runtime::{Error, ErrorKind};

    let e = Error::retryable(std::io::Error::other("downstream timed out"));
    assert_eq!(e.to_string(), "handler failed");
    assert_eq!(format!("{e:#}"), "handler failed: downstream timed out");
    assert_eq!(e.kind(), ErrorKind::Handler);
    assert!(e.is_retryable());
    // README: end
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_errors_chapter_runs() {
        super::display_and_kind();
    }
}

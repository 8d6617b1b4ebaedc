//! What the front cache stores for a committed call, and how a marker is
//! read back.

/// The cache marker of a call without a stored result.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) const PLAIN_MARKER: &str = "1";

/// The cache marker of a record-strategy call: its payload fingerprint and
/// its stored result, so that a cache hit answers only what the database
/// would (`<fingerprint>:<result JSON>`).
pub(crate) fn replay_marker(fingerprint: &str, result: &str) -> String {
    format!("{fingerprint}:{result}")
}

/// The stored result in a marker, if the marker carries `fingerprint`.
pub(crate) fn replay_of<'m>(marker: &'m str, fingerprint: &str) -> Option<&'m str> {
    marker
        .strip_prefix(fingerprint)
        .and_then(|rest| rest.strip_prefix(':'))
}

#[cfg(test)]
mod tests {
    use super::{replay_marker, replay_of};

    #[test]
    fn replay_markers_answer_only_their_own_payload() {
        let fp = "ab".repeat(32);
        let m = replay_marker(&fp, r#"{"channel":"sms"}"#);
        assert_eq!(replay_of(&m, &fp), Some(r#"{"channel":"sms"}"#));
        assert_eq!(replay_of(&m, &"cd".repeat(32)), None);
        // A marker written before fingerprints were stored: no answer.
        assert_eq!(replay_of(r#"{"channel":"sms"}"#, &fp), None);
        assert_eq!(replay_of("", &fp), None);
    }
}

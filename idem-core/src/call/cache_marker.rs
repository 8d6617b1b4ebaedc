//! What the front cache stores for a committed call, how a marker is read
//! back, and how long it may live.

use super::CallState;
use crate::backend::Backend;
use std::time::Instant;

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

impl<DB: Backend> CallState<'_, DB> {
    /// Whether this call writes a front-cache marker after its commit (see
    /// [`MarkerHook::writes`](super::front::MarkerHook::writes)).
    pub(crate) fn writes_marker(&self) -> bool {
        self.front.writes(self.tx.nested())
    }

    /// Bounds the marker by its record's expiry (see
    /// [`MarkerHook::bound`](super::front::MarkerHook::bound)).
    pub(crate) fn bound_marker(&mut self, asked: Instant, left_ms: Option<i64>) {
        self.front.bound(asked, left_ms);
    }
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

//! What the front cache stores for a committed call, how a marker is read
//! back, and how long it may live.

use super::Call;
use crate::backend::Backend;
use std::time::Instant;

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

impl<DB: Backend, G> Call<'_, DB, G> {
    /// Whether this call writes a front-cache marker after its commit: it
    /// has a cache, and runs in its own transaction or in a relay batch
    /// (whose markers are written after the batch's commit). A call inside
    /// a caller's transaction writes none.
    pub(crate) fn writes_marker(&self) -> bool {
        #[cfg(feature = "redis")]
        {
            self.state.cache.is_some() && (!self.state.tx.nested() || self.state.deferred.is_some())
        }
        #[cfg(not(feature = "redis"))]
        false
    }

    /// Bounds the marker by its record's expiry: `left_ms` is what was left
    /// of the record's ttl by the database's clock at a statement sent at
    /// `asked` (`None`: no record seen, so no marker). The database read
    /// its clock after `asked`, so the bound is never past the record's
    /// expiry.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(crate) fn bound_marker(&mut self, asked: Instant, left_ms: Option<i64>) {
        #[cfg(feature = "redis")]
        {
            let left =
                std::time::Duration::from_millis(left_ms.map_or(0, |ms| ms.max(0).unsigned_abs()));
            self.state.marker_not_after = Some(asked + left);
        }
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

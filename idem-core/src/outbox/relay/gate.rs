//! Topics held back after an outage. An attempt that failed in an outage
//! (the topic's broker, or its handler's database, unreachable) closes
//! its topic's gate for about [`Relay::outage_retry`](super::Relay::outage_retry):
//! until it opens, the relay's claims leave that topic's messages alone,
//! so an outage costs one claimed batch of the topic per `outage_retry`
//! instead of claiming and giving back the whole backlog over and over (a
//! stream of writes on the outbox while the broker is down). The other
//! topics keep their full throughput; the topic's messages are due again
//! when the gate opens, so the relay drains within about `outage_retry`
//! of the server's return.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// The closed gates: each topic's reopening time.
#[derive(Debug, Default)]
pub(super) struct Gates {
    until: Mutex<HashMap<String, Instant>>,
    /// Whether any gate may be closed (a claim's fast path skips the map).
    any: AtomicBool,
}

impl Gates {
    /// Closes `topic`'s gate for `hold` from now (a gate already closed
    /// for longer stays so).
    pub(super) fn close(&self, topic: &str, hold: Duration) {
        self.close_at(topic, Instant::now(), hold);
    }

    fn close_at(&self, topic: &str, now: Instant, hold: Duration) {
        if crate::probe::broken(crate::probe::Break::OutageUngated) {
            return;
        }
        let at = now + hold;
        let mut until = self.until.lock().unwrap_or_else(|e| e.into_inner());
        let slot = until.entry(topic.to_owned()).or_insert(at);
        *slot = (*slot).max(at);
        self.any.store(true, Ordering::Relaxed);
    }

    /// `topics` with each closed one replaced by `""`, a topic no message
    /// has (`enqueue` refuses it): the claim statement, rendered for the
    /// full list, then matches only the open ones.
    pub(super) fn open<'a>(&self, topics: &'a [String]) -> Cow<'a, [String]> {
        self.open_at(topics, Instant::now())
    }

    fn open_at<'a>(&self, topics: &'a [String], now: Instant) -> Cow<'a, [String]> {
        if !self.any.load(Ordering::Relaxed) {
            return Cow::Borrowed(topics);
        }
        let mut until = self.until.lock().unwrap_or_else(|e| e.into_inner());
        until.retain(|_, at| *at > now);
        if until.is_empty() {
            self.any.store(false, Ordering::Relaxed);
            return Cow::Borrowed(topics);
        }
        Cow::Owned(
            topics
                .iter()
                .map(|t| match until.contains_key(t) {
                    true => String::new(),
                    false => t.clone(),
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_topic_is_left_out_until_its_gate_opens() {
        let gates = Gates::default();
        let topics = vec!["a".to_owned(), "b".to_owned()];
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert!(matches!(gates.open_at(&topics, t0), Cow::Borrowed(_)));
        gates.close_at("a", t0, ms(1000));
        gates.close_at("a", t0, ms(10));
        assert_eq!(gates.open_at(&topics, t0).as_ref(), ["", "b"]);
        let held = gates.open_at(&topics, t0 + ms(999));
        assert_eq!(held.as_ref(), ["", "b"], "the longer hold stays");
        assert!(matches!(
            gates.open_at(&topics, t0 + ms(1001)),
            Cow::Borrowed(_)
        ));
    }
}

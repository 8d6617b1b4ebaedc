//! Per-topic limits (see [`Relay::topic_limit`](super::Relay::topic_limit)):
//! how many of a topic's messages run at once, and how many start per
//! second. A topic at its limit is left out of the relay's claims (as a
//! gated topic is), so its backlog stays in the outbox for any relay
//! rather than queued here, and the other topics keep their full
//! throughput.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// A topic's limits: at most `concurrency` of its messages running at
/// once, at most `per_second` of them started per second (spread evenly:
/// no burst).
///
/// ```
/// use idem_runtime::outbox::TopicLimit;
/// // An SMS provider allowing 20 requests a second, 4 at once.
/// let sms = TopicLimit::new().concurrency(4).per_second(20.0);
/// # let _ = sms;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TopicLimit {
    concurrency: Option<usize>,
    per_second: Option<f64>,
}

impl TopicLimit {
    /// No limit yet: set [`concurrency`](Self::concurrency),
    /// [`per_second`](Self::per_second) or both.
    pub fn new() -> Self {
        Self::default()
    }

    /// At most `n` of the topic's messages running at once (at least 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = Some(n.max(1));
        self
    }

    /// At most `rate` of the topic's messages started per second, one
    /// every `1 / rate` seconds (a rate that is not a positive number is
    /// no rate limit).
    pub fn per_second(mut self, rate: f64) -> Self {
        self.per_second = (rate.is_finite() && rate > 0.0).then_some(rate);
        self
    }
}

/// The limits of a relay's topics, and what each topic holds now.
#[derive(Debug, Default)]
pub(super) struct Limits {
    by_topic: HashMap<String, Arc<Limiter>>,
}

/// One topic's limiter.
#[derive(Debug)]
struct Limiter {
    slots: Option<Arc<Semaphore>>,
    /// One start every `interval`, the next at `next` at the earliest.
    interval: Option<Duration>,
    next: Mutex<Option<Instant>>,
    /// The topic's messages this relay holds: claimed and not yet settled.
    held: AtomicUsize,
    /// The most it holds before its claims leave the topic out.
    cap: usize,
}

/// A message's hold on its topic's limits, until it is settled.
#[derive(Debug)]
pub(super) struct Held {
    limiter: Arc<Limiter>,
    _slot: Option<OwnedSemaphorePermit>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.limiter.held.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Limits {
    /// Sets `topic`'s limits.
    pub(super) fn set(&mut self, topic: String, limit: TopicLimit) {
        let interval = limit
            .per_second
            .map(|rate| Duration::from_secs_f64(1.0 / rate));
        // What the relay holds of a rate-limited topic: the starts of the
        // next second (or its concurrency), so a claim never takes much
        // more than the topic can start before the claim after it.
        let by_rate = limit.per_second.map(|r| r.ceil().max(1.0) as usize);
        let cap = match (limit.concurrency, by_rate) {
            (Some(c), Some(r)) => c.min(r),
            (Some(c), None) => c,
            (None, Some(r)) => r,
            (None, None) => usize::MAX,
        };
        let limiter = Limiter {
            slots: limit.concurrency.map(|n| Arc::new(Semaphore::new(n))),
            interval,
            next: Mutex::new(None),
            held: AtomicUsize::new(0),
            cap,
        };
        self.by_topic.insert(topic, Arc::new(limiter));
    }

    /// Whether any topic has limits.
    pub(super) fn any(&self) -> bool {
        !self.by_topic.is_empty()
    }

    /// Whether `topic` has limits.
    pub(super) fn limits(&self, topic: &str) -> bool {
        self.by_topic.contains_key(topic)
    }

    /// `topic`'s limiter, if it has limits.
    fn of(&self, topic: &str) -> Option<&Arc<Limiter>> {
        self.by_topic.get(topic)
    }

    /// `topics` with each one at its limit replaced by `""`, a topic no
    /// message has (see `Gates::open`).
    pub(super) fn open<'a>(&self, topics: Cow<'a, [String]>) -> Cow<'a, [String]> {
        if !self.any() {
            return topics;
        }
        let full = |t: &String| {
            self.of(t)
                .is_some_and(|l| l.held.load(Ordering::Relaxed) >= l.cap)
        };
        if !topics.iter().any(full) {
            return topics;
        }
        Cow::Owned(
            topics
                .iter()
                .map(|t| if full(t) { String::new() } else { t.clone() })
                .collect(),
        )
    }

    /// Counts a claimed message of `topic` as held, until the result (or
    /// what [`Held::acquire`] makes of it) drops: also when its task ends
    /// before it could start.
    pub(super) fn hold(&self, topic: &str) -> Option<Held> {
        let limiter = self.of(topic)?;
        limiter.held.fetch_add(1, Ordering::Relaxed);
        Some(Held {
            limiter: limiter.clone(),
            _slot: None,
        })
    }
}

impl Held {
    /// Waits for a slot of the topic and for the next start its rate
    /// allows.
    pub(super) async fn acquire(mut self) -> Held {
        let limiter = self.limiter.clone();
        if let Some(slots) = &limiter.slots {
            self._slot = Some(slots.clone().acquire_owned().await.expect("never closed"));
        }
        if let Some(interval) = limiter.interval {
            let at = {
                let mut next = limiter.next.lock().unwrap_or_else(|e| e.into_inner());
                let now = Instant::now();
                let at = next.map_or(now, |n| n.max(now));
                *next = Some(at + interval);
                at
            };
            tokio::time::sleep_until(at).await;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_at_its_cap_is_left_out() {
        let mut limits = Limits::default();
        limits.set("sms".into(), TopicLimit::new().concurrency(2));
        let topics = vec!["mail".to_owned(), "sms".to_owned()];
        assert!(matches!(
            limits.open(Cow::Borrowed(&topics)),
            Cow::Borrowed(_)
        ));
        let a = limits.hold("sms").unwrap();
        let _b = limits.hold("sms").unwrap();
        assert!(limits.hold("mail").is_none());
        assert_eq!(limits.open(Cow::Borrowed(&topics)).as_ref(), ["mail", ""]);
        drop(tokio_test_block(a.acquire()));
        assert_eq!(
            limits.open(Cow::Borrowed(&topics)).as_ref(),
            ["mail", "sms"]
        );
    }

    #[test]
    fn the_cap_of_a_rate_is_a_second_of_starts() {
        let mut limits = Limits::default();
        limits.set("a".into(), TopicLimit::new().per_second(2.5));
        limits.set(
            "b".into(),
            TopicLimit::new().per_second(100.0).concurrency(3),
        );
        limits.set("c".into(), TopicLimit::new().per_second(-1.0));
        assert_eq!(limits.of("a").unwrap().cap, 3);
        assert_eq!(limits.of("b").unwrap().cap, 3);
        assert_eq!(limits.of("c").unwrap().cap, usize::MAX);
    }

    #[test]
    fn starts_are_spread_by_the_rate() {
        let mut limits = Limits::default();
        limits.set("a".into(), TopicLimit::new().per_second(50.0));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let start = Instant::now();
            for _ in 0..11 {
                let held = limits.hold("a").unwrap().acquire().await;
                drop(held);
            }
            // The first at once, then one every 20 ms (virtual time).
            assert_eq!(start.elapsed(), Duration::from_millis(200));
        });
    }

    fn tokio_test_block<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(f)
    }
}

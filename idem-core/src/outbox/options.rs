//! What a message may carry besides its payload: an ordering key, a time
//! before which it is not delivered, and headers ([`EnqueueOptions`], for
//! [`enqueue_with`](super::enqueue_with)).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// The longest `topic` and the longest `msg_id`
/// [`enqueue`](super::enqueue) accepts, in bytes of UTF-8: the
/// `VARCHAR(128)` columns of PostgreSQL and MariaDB hold 128 characters,
/// so every backend takes the same ids (SQLite's `TEXT` would take more).
pub const MAX_ID_LEN: usize = 128;

/// A message's headers: names to values, both text. Handlers read them
/// with [`Delivery::headers`](super::Delivery::headers); the broker
/// publishers carry them as the broker's own headers (AMQP headers, NATS
/// and Kafka headers, RocketMQ properties, Redis Streams fields).
pub type Headers = BTreeMap<String, String>;

/// The most headers one message carries.
pub const MAX_HEADERS: usize = 64;

/// The longest header name, in bytes.
pub const MAX_HEADER_NAME_LEN: usize = 128;

/// The most bytes of header names and values together.
pub const MAX_HEADERS_LEN: usize = 64 * 1024;

/// The longest delay ([`EnqueueOptions::delay`]): about ten years.
pub const MAX_DELAY: Duration = Duration::from_secs(3650 * 24 * 3600);

/// How a message is enqueued: with an ordering key, a delay, headers.
/// The default is what [`enqueue`](super::enqueue) does: no key, due at
/// once, no headers.
///
/// ```
/// use idem_runtime::outbox::EnqueueOptions;
/// use std::time::Duration;
///
/// let options = EnqueueOptions::new()
///     .ordering_key("order-42")
///     .delay(Duration::from_secs(30 * 60))
///     .header("tenant", "acme");
/// assert_eq!(options.get_ordering_key(), Some("order-42"));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnqueueOptions {
    ordering_key: Option<String>,
    delay: Duration,
    not_before: Option<SystemTime>,
    headers: Headers,
}

impl EnqueueOptions {
    /// No key, due at once, no headers.
    pub fn new() -> Self {
        Self::default()
    }

    /// The **ordering key**: the messages of one key (of any topic) are
    /// delivered one at a time, in the order they were enqueued. A relay
    /// takes a keyed message only when it is its key's *head*: no earlier
    /// message of the key is still pending (waiting, running, or retrying
    /// after a failure). Messages of different keys, and messages without
    /// a key, run side by side as before.
    ///
    /// A failing head holds back its own key only, through its retries;
    /// once it is dead-lettered the rest of the key goes on, unless the
    /// relay says [`OnDeadHead::Hold`](super::OnDeadHead::Hold). At most
    /// [`MAX_ID_LEN`] bytes, no control characters.
    ///
    /// "Enqueue order" is commit order: enqueues of one key wait for each
    /// other's transactions (a lock on the key until the transaction
    /// ends), so the key's messages get their ids, and their turn, in the
    /// order their transactions committed.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Not due before `delay` from the enqueue (by the database's clock;
    /// at most [`MAX_DELAY`], rounded down to milliseconds). A relay does
    /// not claim it earlier; a failed attempt's back-off counts from the
    /// attempt as usual. Replaces [`not_before`](Self::not_before).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self.not_before = None;
        self
    }

    /// Not due before `at`: converted to a delay from now by this
    /// process's clock when it is enqueued (a time past is due at once).
    /// Replaces [`delay`](Self::delay).
    pub fn not_before(mut self, at: SystemTime) -> Self {
        self.not_before = Some(at);
        self.delay = Duration::ZERO;
        self
    }

    /// Adds the header `name: value` (a name given twice keeps the last
    /// value). Names are 1 to [`MAX_HEADER_NAME_LEN`] bytes without
    /// control characters; at most [`MAX_HEADERS`] headers and
    /// [`MAX_HEADERS_LEN`] bytes in all.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// The ordering key, if set.
    pub fn get_ordering_key(&self) -> Option<&str> {
        self.ordering_key.as_deref()
    }

    /// The headers set.
    pub fn get_headers(&self) -> &Headers {
        &self.headers
    }

    /// The delay from now, as enqueued.
    pub(crate) fn delay_now(&self) -> Duration {
        match self.not_before {
            Some(at) => at
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO),
            None => self.delay,
        }
    }

    /// Checks the options; the reason a message cannot be enqueued with
    /// them otherwise.
    pub(crate) fn check(&self) -> Result<(), String> {
        if let Some(key) = &self.ordering_key {
            check_text("ordering key", key)?;
        }
        if self.delay_now() > MAX_DELAY {
            return Err(format!(
                "the delay is {:?}, at most {MAX_DELAY:?} is allowed",
                self.delay_now()
            ));
        }
        if self.headers.len() > MAX_HEADERS {
            return Err(format!(
                "{} headers, at most {MAX_HEADERS} are allowed",
                self.headers.len()
            ));
        }
        let mut total = 0;
        for (name, value) in &self.headers {
            if name.is_empty() || name.len() > MAX_HEADER_NAME_LEN {
                return Err(format!(
                    "the header name `{}` is {} bytes long: 1 to {MAX_HEADER_NAME_LEN} are allowed",
                    name.escape_default(),
                    name.len()
                ));
            }
            if let Some(c) = name.chars().find(|c| c.is_control()) {
                return Err(format!(
                    "the header name `{}` contains the control character {c:?}",
                    name.escape_default()
                ));
            }
            total += name.len() + value.len();
        }
        if total > MAX_HEADERS_LEN {
            return Err(format!(
                "the headers are {total} bytes, at most {MAX_HEADERS_LEN} are allowed"
            ));
        }
        Ok(())
    }

    /// The headers as stored: a JSON object, or `None` without headers.
    /// With the feature `opentelemetry`, the current span's trace context
    /// is added (`traceparent`, `tracestate`) unless the caller set one.
    pub(crate) fn headers_json(&self) -> Option<String> {
        #[cfg(feature = "opentelemetry")]
        if let Some(traced) = crate::otel::with_current(&self.headers) {
            return Some(serde_json::to_string(&traced).expect("strings serialize"));
        }
        (!self.headers.is_empty())
            .then(|| serde_json::to_string(&self.headers).expect("strings serialize"))
    }
}

/// The headers of outbox row `id` as stored (`None`: none). A value that
/// is not a JSON object of strings (a row written by hand) is logged and
/// read as no headers: the message is still delivered.
pub(crate) fn headers_of(id: i64, stored: Option<&str>) -> Headers {
    let Some(text) = stored else {
        return Headers::new();
    };
    match serde_json::from_str(text) {
        Ok(headers) => headers,
        Err(error) => {
            tracing::warn!(id, %error, "an outbox message's headers are not a JSON object of strings; delivered without them");
            Headers::new()
        }
    }
}

/// The check of an identifier `what` of a message (its topic, its id, its
/// ordering key): 1 to [`MAX_ID_LEN`] bytes, no control characters.
pub(super) fn check_text(what: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        Err(format!("the {what} is empty"))
    } else if value.len() > MAX_ID_LEN {
        Err(format!(
            "the {what} is {} bytes long, at most {} are allowed",
            value.len(),
            MAX_ID_LEN
        ))
    } else if let Some(c) = value.chars().find(|c| c.is_control()) {
        Err(format!("the {what} contains the control character {c:?}"))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked() {
        assert!(EnqueueOptions::new().check().is_ok());
        let e = EnqueueOptions::new().ordering_key("").check().unwrap_err();
        assert!(e.contains("the ordering key is empty"), "{e}");
        let e = EnqueueOptions::new()
            .delay(MAX_DELAY + Duration::from_secs(1))
            .check()
            .unwrap_err();
        assert!(e.contains("the delay is"), "{e}");
        let e = EnqueueOptions::new().header("", "v").check().unwrap_err();
        assert!(e.contains("1 to 128"), "{e}");
        let e = EnqueueOptions::new()
            .header("a\nb", "v")
            .check()
            .unwrap_err();
        assert!(e.contains("control character"), "{e}");
        let big = "x".repeat(MAX_HEADERS_LEN);
        let e = EnqueueOptions::new().header("a", big).check().unwrap_err();
        assert!(e.contains("at most 65536"), "{e}");
        let many =
            (0..=MAX_HEADERS).fold(EnqueueOptions::new(), |o, n| o.header(n.to_string(), ""));
        assert!(many.check().unwrap_err().contains("65 headers"));
    }

    #[test]
    fn headers_round_trip_and_bad_ones_read_as_none() {
        let o = EnqueueOptions::new().header("b", "2").header("a", "1");
        let json = o.headers_json().unwrap();
        assert_eq!(json, r#"{"a":"1","b":"2"}"#);
        assert_eq!(&headers_of(1, Some(&json)), o.get_headers());
        assert!(headers_of(1, Some("[1]")).is_empty());
        assert!(headers_of(1, None).is_empty());
        assert!(EnqueueOptions::new().headers_json().is_none());
    }

    #[test]
    fn not_before_in_the_past_is_due_at_once() {
        let past = SystemTime::now() - Duration::from_secs(60);
        assert_eq!(
            EnqueueOptions::new().not_before(past).delay_now(),
            Duration::ZERO
        );
        let soon = SystemTime::now() + Duration::from_secs(60);
        assert!(EnqueueOptions::new().not_before(soon).delay_now() > Duration::from_secs(50));
    }
}

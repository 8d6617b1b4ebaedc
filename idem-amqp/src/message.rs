//! One delivery, as the handler sees it.

use crate::ORDERING_KEY_HEADER;
use crate::fields::header_str;
use crate::publisher::reserved;
use lapin::BasicProperties;
use lapin::types::AMQPValue;
use std::collections::BTreeMap;

/// One delivery, as the handler sees it. Its fields can be used in a key
/// template: `key = "mq:{m.queue}:{m.message_id}"`.
///
/// It serializes as its identity (`queue`, `message_id`) only, so a
/// `record` handler's default fingerprint stays the same across
/// redeliveries and retries (which change `redelivered`, `attempt` and the
/// properties).
#[derive(Debug, Clone)]
pub struct Message {
    /// The queue it was consumed from.
    pub queue: String,
    /// The AMQP `message_id` property (never empty: a delivery without one
    /// is dead-lettered before any handler runs).
    pub message_id: String,
    /// The routing key it was published with (kept across the retry
    /// queue).
    pub routing_key: String,
    /// The exchange it was published to (kept across the retry queue).
    pub exchange: String,
    /// The broker's redelivered flag: an earlier delivery of this copy was
    /// not acknowledged (a consumer died, or its channel closed).
    pub redelivered: bool,
    /// This attempt, from 1; retries through the retry queue increment it.
    pub attempt: u32,
    /// The payload.
    pub body: Vec<u8>,
    /// All AMQP properties, headers included.
    pub properties: BasicProperties,
}

impl Message {
    /// The idempotency key material: `"{queue}:{message_id}"`, what the
    /// template `"{m.queue}:{m.message_id}"` derives.
    pub fn key(&self) -> String {
        format!("{}:{}", self.queue, self.message_id)
    }

    /// The header `name` (case-sensitive, as in AMQP) when its value is
    /// text (a long or short string): a header the outbox message was
    /// enqueued with, or any other text header.
    pub fn header(&self, name: &str) -> Option<String> {
        header_str(&self.properties, name)
    }

    /// The text headers but idem's own (`x-idem-…`) and RabbitMQ's
    /// (`CC`, `BCC`, `x-death`, …): for a message the outbox
    /// [`Publisher`](crate::Publisher) sent, the headers it was enqueued
    /// with.
    pub fn user_headers(&self) -> BTreeMap<String, String> {
        let Some(table) = self.properties.headers() else {
            return BTreeMap::new();
        };
        table
            .inner()
            .iter()
            .filter(|(name, _)| !reserved(name.as_str()))
            .filter_map(|(name, value)| {
                let text = match value {
                    AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                    AMQPValue::ShortString(s) => s.to_string(),
                    _ => return None,
                };
                Some((name.to_string(), text))
            })
            .collect()
    }

    /// The ordering key the outbox message was enqueued with (the
    /// [`ORDERING_KEY_HEADER`] header), if any.
    pub fn ordering_key(&self) -> Option<String> {
        self.header(ORDERING_KEY_HEADER)
    }
}

impl idem_core::consume::Incoming for Message {
    fn body(&self) -> &[u8] {
        &self.body
    }
}

impl serde::Serialize for Message {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Message", 2)?;
        st.serialize_field("queue", &self.queue)?;
        st.serialize_field("message_id", &self.message_id)?;
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{FieldTable, LongString};

    #[test]
    fn headers_are_the_text_ones_but_idems() {
        let mut h = FieldTable::default();
        h.insert(
            "tenant".into(),
            AMQPValue::LongString(LongString::from("acme")),
        );
        h.insert("short".into(), AMQPValue::ShortString("s".into()));
        h.insert("n".into(), AMQPValue::LongInt(3));
        h.insert(
            ORDERING_KEY_HEADER.into(),
            AMQPValue::LongString(LongString::from("k-1")),
        );
        h.insert(
            "x-idem-topic".into(),
            AMQPValue::LongString(LongString::from("t")),
        );
        let m = Message {
            queue: "q".into(),
            message_id: "m-1".into(),
            routing_key: "rk".into(),
            exchange: "ex".into(),
            redelivered: false,
            attempt: 1,
            body: Vec::new(),
            properties: BasicProperties::default().with_headers(h),
        };
        assert_eq!(m.header("tenant").as_deref(), Some("acme"));
        assert_eq!(m.header("n"), None);
        assert_eq!(m.ordering_key().as_deref(), Some("k-1"));
        let all: Vec<(String, String)> = m.user_headers().into_iter().collect();
        assert_eq!(
            all,
            [
                ("short".into(), "s".into()),
                ("tenant".into(), "acme".into())
            ]
        );
    }

    #[test]
    fn message_key_and_identity_serialization() {
        let m = Message {
            queue: "q".into(),
            message_id: "m-1".into(),
            routing_key: "rk".into(),
            exchange: "ex".into(),
            redelivered: true,
            attempt: 3,
            body: b"{}".to_vec(),
            properties: BasicProperties::default(),
        };
        assert_eq!(m.key(), "q:m-1");
        assert!(m.user_headers().is_empty());
        assert_eq!(m.ordering_key(), None);
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"queue":"q","message_id":"m-1"}"#
        );
    }
}

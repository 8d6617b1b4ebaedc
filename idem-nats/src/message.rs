//! One JetStream delivery, as the handler sees it.

use crate::ORDERING_KEY_HEADER;
use crate::publisher::reserved;
use async_nats::{HeaderMap, HeaderName};
use std::collections::BTreeMap;

/// One JetStream delivery, as the handler sees it. Its fields can be used
/// in a key template: `key = "mq:{m.stream}:{m.message_id}"`.
///
/// It serializes as its identity (`stream`, `message_id`) only, so a
/// `record` handler's default fingerprint stays the same across
/// redeliveries (which change `delivered` and the sequences of the
/// consumer).
#[derive(Debug, Clone)]
pub struct Message {
    /// The stream it was stored in.
    pub stream: String,
    /// The durable consumer it was delivered by.
    pub consumer: String,
    /// The subject it was published to.
    pub subject: String,
    /// The `Nats-Msg-Id` header: the publisher's id of the message,
    /// stable across republishes (never empty: a delivery without one is
    /// dead-lettered before any handler runs). See the
    /// [module documentation](super#the-key-nats-msg-id-not-the-stream-sequence)
    /// for why the key is this and not the stream sequence.
    pub message_id: String,
    /// Its sequence in the stream: unique per stored copy, so a copy
    /// republished outside the duplicate window has another one.
    pub stream_sequence: u64,
    /// The consumer's sequence of this delivery (grows on redeliveries).
    pub consumer_sequence: u64,
    /// This delivery, from 1: the server counts every delivery, a nak'd
    /// one, one whose ack wait ran out and one to a consumer that died.
    pub delivered: u32,
    /// The payload.
    pub body: Vec<u8>,
    /// The message's headers (`Nats-Msg-Id` included).
    pub headers: HeaderMap,
}

impl Message {
    /// The idempotency key material: `"{stream}:{message_id}"`, what the
    /// template `"{m.stream}:{m.message_id}"` derives.
    pub fn key(&self) -> String {
        format!("{}:{}", self.stream, self.message_id)
    }

    /// Whether an earlier delivery of this copy was not acknowledged
    /// (`delivered > 1`).
    pub fn redelivered(&self) -> bool {
        self.delivered > 1
    }

    /// The first value of header `name` (case-sensitive): a header the
    /// outbox message was enqueued with, or any other (`None` for a name
    /// NATS cannot carry).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name: HeaderName = name.parse().ok()?;
        self.headers.get(name).map(|v| v.as_str())
    }

    /// The headers but idem's own (`Idem-…`), the server's (`Nats-…`) and
    /// `Content-Type`, each with its first value: for a message the outbox
    /// [`Publisher`](crate::Publisher) sent, the headers it was enqueued
    /// with.
    pub fn user_headers(&self) -> BTreeMap<String, String> {
        self.headers
            .iter()
            .filter(|(name, _)| !reserved(name.as_ref()))
            .filter_map(|(name, values)| {
                let first = values.first()?;
                Some((name.to_string(), first.as_str().to_owned()))
            })
            .collect()
    }

    /// The ordering key the outbox message was enqueued with (the
    /// [`ORDERING_KEY_HEADER`] header), if any.
    pub fn ordering_key(&self) -> Option<&str> {
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
        st.serialize_field("stream", &self.stream)?;
        st.serialize_field("message_id", &self.message_id)?;
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_key_and_identity_serialization() {
        let m = Message {
            stream: "ORDERS".into(),
            consumer: "deduct".into(),
            subject: "orders.deduct".into(),
            message_id: "m-1".into(),
            stream_sequence: 7,
            consumer_sequence: 9,
            delivered: 2,
            body: b"{}".to_vec(),
            headers: HeaderMap::new(),
        };
        assert_eq!(m.key(), "ORDERS:m-1");
        assert!(m.user_headers().is_empty());
        assert_eq!(m.ordering_key(), None);
        let mut m = m;
        m.headers.insert("Nats-Msg-Id", "m-1");
        m.headers.insert("Idem-Topic", "orders");
        m.headers.insert(ORDERING_KEY_HEADER, "k-1");
        m.headers.insert("Tenant", "acme");
        assert_eq!(m.header("Tenant"), Some("acme"));
        assert_eq!(m.header("not a name"), None);
        assert_eq!(m.ordering_key(), Some("k-1"));
        let user: Vec<(String, String)> = m.user_headers().into_iter().collect();
        assert_eq!(user, [("Tenant".to_owned(), "acme".to_owned())]);
        assert!(m.redelivered());
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"stream":"ORDERS","message_id":"m-1"}"#
        );
    }
}

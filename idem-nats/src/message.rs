//! One JetStream delivery, as the handler sees it.

use async_nats::HeaderMap;

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
        assert!(m.redelivered());
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"stream":"ORDERS","message_id":"m-1"}"#
        );
    }
}

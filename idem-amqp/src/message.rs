//! One delivery, as the handler sees it.

use lapin::BasicProperties;

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
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"queue":"q","message_id":"m-1"}"#
        );
    }
}

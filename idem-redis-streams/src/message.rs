//! One stream entry, as the handler sees it.

use crate::{HEADER_FIELD_PREFIX, ORDERING_KEY_FIELD};

/// One stream entry, as the handler sees it. Its fields can be used in a
/// key template: `key = "rs:{m.stream}:{m.msg_id}"`.
///
/// It serializes as its identity (`stream`, `msg_id`) only, so a `record`
/// handler's default fingerprint stays the same across copies and
/// claims (which change `entry_id`, `consumer` and `delivered`).
#[derive(Debug, Clone)]
pub struct Message {
    /// The stream it was read from.
    pub stream: String,
    /// The consumer group it was read in.
    pub group: String,
    /// The consumer (of the group) that holds it now.
    pub consumer: String,
    /// Its entry id (`1700000000000-0`): unique per stored *copy*, so a
    /// republished message has another one. For logs; never the key.
    pub entry_id: String,
    /// The message's id, from its `msg_id` field (or the consumer's
    /// [`key_field`](super::Consumer::key_field)): the outbox `msg_id`
    /// when [`Publisher`](super::Publisher) wrote it, the same on every
    /// copy (never empty: an entry without one is dead-lettered before
    /// any handler runs).
    pub msg_id: String,
    /// The outbox topic, from the entry's `topic` field, when it has one.
    pub topic: Option<String>,
    /// The times Redis handed this entry out, from 1 (a claimed entry:
    /// 2 or more, each consumer that died holding it counted).
    pub delivered: u32,
    /// This consumer's try of the handler, from 1 (retries in place after
    /// a failure; an outage waited out in place is no try).
    pub attempt: u32,
    /// The payload (the entry's `payload` field, or the consumer's
    /// [`payload_field`](super::Consumer::payload_field)).
    pub body: Vec<u8>,
    /// Every field of the entry, in the order stored (the payload and
    /// `msg_id` included).
    pub fields: Vec<(String, Vec<u8>)>,
}

impl Message {
    /// The idempotency key material: `"{stream}:{msg_id}"`, what the
    /// template `"{m.stream}:{m.msg_id}"` derives.
    pub fn key(&self) -> String {
        format!("{}:{}", self.stream, self.msg_id)
    }

    /// The value of the entry's field `name` (the first, if repeated).
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The header `name` the outbox message was enqueued with: the
    /// entry's field `h.<name>` ([`HEADER_FIELD_PREFIX`]).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n.strip_prefix(HEADER_FIELD_PREFIX) == Some(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The headers the outbox message was enqueued with: each field
    /// `h.<name>`, as `name`, with its value (the first, if repeated),
    /// in the order stored.
    pub fn user_headers(&self) -> Vec<(&str, &[u8])> {
        let mut out: Vec<(&str, &[u8])> = Vec::new();
        for (field, value) in &self.fields {
            if let Some(name) = field.strip_prefix(HEADER_FIELD_PREFIX)
                && !out.iter().any(|(n, _)| *n == name)
            {
                out.push((name, value.as_slice()));
            }
        }
        out
    }

    /// The ordering key the outbox message was enqueued with (the
    /// [`ORDERING_KEY_FIELD`] field), if any.
    pub fn ordering_key(&self) -> Option<&[u8]> {
        self.field(ORDERING_KEY_FIELD)
    }

    /// Whether Redis handed this entry out before (`delivered > 1`): a
    /// consumer died, or could not acknowledge it, while holding it.
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
        st.serialize_field("msg_id", &self.msg_id)?;
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_key_fields_and_identity_serialization() {
        let m = Message {
            stream: "orders".into(),
            group: "deduct".into(),
            consumer: "host-1".into(),
            entry_id: "1-0".into(),
            msg_id: "m-1".into(),
            topic: Some("orders".into()),
            delivered: 2,
            attempt: 1,
            body: b"{}".to_vec(),
            fields: vec![
                ("msg_id".into(), b"m-1".to_vec()),
                ("payload".into(), b"{}".to_vec()),
            ],
        };
        assert_eq!(m.key(), "orders:m-1");
        assert_eq!(m.field("msg_id"), Some(&b"m-1"[..]));
        assert_eq!(m.field("nope"), None);
        assert_eq!(m.ordering_key(), None);
        assert!(m.user_headers().is_empty());
        let mut m = m;
        for (n, v) in [
            ("ordering_key", "k-1"),
            ("h.tenant", "acme"),
            ("h.msg_id", "x"),
        ] {
            m.fields.push((n.to_owned(), v.as_bytes().to_vec()));
        }
        assert_eq!(m.ordering_key(), Some(&b"k-1"[..]));
        assert_eq!(m.header("tenant"), Some(&b"acme"[..]));
        assert_eq!(m.header("h.tenant"), None);
        assert_eq!(
            m.user_headers(),
            [("tenant", &b"acme"[..]), ("msg_id", &b"x"[..])]
        );
        assert!(m.redelivered());
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"stream":"orders","msg_id":"m-1"}"#
        );
    }
}

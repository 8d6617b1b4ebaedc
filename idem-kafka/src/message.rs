//! One Kafka record, as the handler sees it, and where its key comes from.

use super::{MSG_ID_HEADER, ORDERING_KEY_HEADER};
use std::collections::BTreeMap;

/// One Kafka record, as the handler sees it. Its fields can be used in a
/// key template: `key = "kafka:{m.topic}:{m.msg_id}"`.
///
/// It serializes as its identity (`topic`, `msg_id`) only, so a `record`
/// handler's default fingerprint stays the same on every copy of the
/// message (which differ in partition, offset and attempt).
#[derive(Debug, Clone)]
pub struct Message {
    /// The topic the message was published to: for a record consumed from
    /// the retry topic, the topic it came from first.
    pub topic: String,
    /// The message's id, what its key is made of (see
    /// [`KeyFrom`]): stable across redeliveries, retries through the retry
    /// topic and, unless it is [`KeyFrom::offset`], producer retries.
    /// Never empty: a record without one is dead-lettered before any
    /// handler runs.
    pub msg_id: String,
    /// The topic this copy was consumed from (the retry topic for a
    /// retry).
    pub record_topic: String,
    /// The partition this copy was consumed from.
    pub partition: i32,
    /// Its offset there.
    pub offset: i64,
    /// The attempt, from 1: a record read back from the retry topic
    /// carries the attempt it is.
    pub attempt: u32,
    /// The record's key (`None`: no key).
    pub record_key: Option<Vec<u8>>,
    /// The record's timestamp, in milliseconds since the Unix epoch.
    pub timestamp_ms: Option<i64>,
    /// The record's headers, in order (a header without a value has an
    /// empty one).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The payload.
    pub body: Vec<u8>,
}

impl Message {
    /// The idempotency key material: `"{topic}:{msg_id}"`, what the
    /// template `"{m.topic}:{m.msg_id}"` derives.
    pub fn key(&self) -> String {
        format!("{}:{}", self.topic, self.msg_id)
    }

    /// The value of the first header named `name` (names are
    /// case-sensitive in Kafka).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The value of the first header named `name`, when it is UTF-8 text
    /// (a header the outbox message was enqueued with always is).
    pub fn header_text(&self, name: &str) -> Option<&str> {
        std::str::from_utf8(self.header(name)?).ok()
    }

    /// The headers but idem's own (`Idem-…`) and `content-type`, each
    /// name's first UTF-8 value: for a record the outbox
    /// [`Publisher`](crate::Publisher) wrote, the headers its message was
    /// enqueued with.
    pub fn user_headers(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for (name, value) in &self.headers {
            if reserved(name) || out.contains_key(name) {
                continue;
            }
            if let Ok(text) = std::str::from_utf8(value) {
                out.insert(name.clone(), text.to_owned());
            }
        }
        out
    }

    /// The ordering key the outbox message was enqueued with (the
    /// [`ORDERING_KEY_HEADER`] header; also its record key), if any.
    pub fn ordering_key(&self) -> Option<&str> {
        self.header_text(ORDERING_KEY_HEADER)
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
        st.serialize_field("topic", &self.topic)?;
        st.serialize_field("msg_id", &self.msg_id)?;
        st.end()
    }
}

/// Where a record's message id ([`Message::msg_id`]) comes from: what
/// the handler's key is made of, so it must be the same on every copy of
/// one message.
///
/// | source | stable across | use for |
/// |---|---|---|
/// | [`header`](KeyFrom::header)`(MSG_ID_HEADER)` (the default) | every copy: redeliveries, producer retries, republishes of an outbox row | records sent by idem's [`Publisher`](crate::Publisher) |
/// | [`header`](KeyFrom::header)`(name)`, [`field`](KeyFrom::field)`(name)` | every copy, if the producer sets it once per message | records of other producers that carry an id of their own |
/// | [`offset`](KeyFrom::offset) | redeliveries of one stored copy only | producers that cannot be changed, knowing the risk below |
///
/// **Why the offset is only an explicit choice.** `{topic}:{partition}:{offset}`
/// names a stored *copy*, not a message. A producer that retries a send
/// whose acknowledgement it lost (a time-out, a broker failover, an
/// outbox relay restarted before it marked its row), without the
/// idempotent producer's protection (another producer session, a
/// restarted process, a republished outbox row), stores a second copy at
/// another offset, and a handler keyed on the offset acts on it a second
/// time. Rebalances and consumer crashes redeliver the *same* copy, which
/// the offset does key; producer retries do not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFrom(pub(crate) Source);

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    Header(String),
    Field(String),
    Offset,
}

impl KeyFrom {
    /// The value of the record header `name` (UTF-8, not empty).
    pub fn header(name: impl Into<String>) -> Self {
        KeyFrom(Source::Header(name.into()))
    }

    /// A field of the JSON payload: a top-level name (`"event_id"`) or a
    /// JSON pointer (`"/meta/id"`); a string, or a number written out.
    pub fn field(name: impl Into<String>) -> Self {
        KeyFrom(Source::Field(name.into()))
    }

    /// `"{partition}:{offset}"` of the record as first consumed (so the
    /// key `"{m.topic}:{m.msg_id}"` is `{topic}:{partition}:{offset}`):
    /// stable across redeliveries, not across producer retries (see the
    /// [type's documentation](KeyFrom)).
    pub fn offset() -> Self {
        KeyFrom(Source::Offset)
    }

    /// What the id is taken from, for the dead-letter reason of a record
    /// without one.
    pub(crate) fn describe(&self) -> String {
        match &self.0 {
            Source::Header(h) => format!("`{h}` header"),
            Source::Field(f) => format!("`{f}` payload field"),
            Source::Offset => "offset".to_owned(),
        }
    }

    /// The id of a first copy (not a retry) in `partition` at `offset`.
    pub(crate) fn id_of(
        &self,
        headers: &[(String, Vec<u8>)],
        body: &[u8],
        partition: i32,
        offset: i64,
    ) -> Option<String> {
        let id = match &self.0 {
            Source::Header(h) => header_text(headers, h),
            Source::Field(f) => field_text(body, f),
            Source::Offset => Some(format!("{partition}:{offset}")),
        };
        id.filter(|s| !s.is_empty())
    }
}

impl Default for KeyFrom {
    /// The [`MSG_ID_HEADER`] header: the outbox `msg_id` of a record that
    /// idem's [`Publisher`](crate::Publisher) sent.
    fn default() -> Self {
        KeyFrom::header(MSG_ID_HEADER)
    }
}

/// The first header `name`, as UTF-8 text.
pub(crate) fn header_text(headers: &[(String, Vec<u8>)], name: &str) -> Option<String> {
    let (_, v) = headers.iter().find(|(k, _)| k == name)?;
    String::from_utf8(v.clone()).ok()
}

fn field_text(body: &[u8], field: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let found = if field.starts_with('/') {
        v.pointer(field)?
    } else {
        v.get(field)?
    };
    match found {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Whether a user header named `name` is dropped: idem's own names
/// (`Idem-…`) and `content-type`, in any case.
pub(crate) fn reserved(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.starts_with("idem-") || lower == "content-type"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers() -> Vec<(String, Vec<u8>)> {
        vec![
            (MSG_ID_HEADER.to_owned(), b"m-1".to_vec()),
            ("empty".to_owned(), Vec::new()),
        ]
    }

    #[test]
    fn ids_from_a_header_a_field_or_the_offset() {
        let body = br#"{"event_id": 42, "meta": {"id": "e-9"}, "flag": true}"#;
        let h = headers();
        assert_eq!(
            KeyFrom::default().id_of(&h, body, 0, 5).as_deref(),
            Some("m-1")
        );
        assert_eq!(KeyFrom::header("empty").id_of(&h, body, 0, 5), None);
        assert_eq!(KeyFrom::header("missing").id_of(&h, body, 0, 5), None);
        assert_eq!(
            KeyFrom::field("event_id").id_of(&h, body, 0, 5).as_deref(),
            Some("42")
        );
        assert_eq!(
            KeyFrom::field("/meta/id").id_of(&h, body, 0, 5).as_deref(),
            Some("e-9")
        );
        assert_eq!(KeyFrom::field("flag").id_of(&h, body, 0, 5), None);
        assert_eq!(KeyFrom::field("event_id").id_of(&h, b"{", 0, 5), None);
        assert_eq!(
            KeyFrom::offset().id_of(&h, body, 3, 17).as_deref(),
            Some("3:17")
        );
    }

    #[test]
    fn message_key_and_identity_serialization() {
        let m = Message {
            topic: "orders".into(),
            msg_id: "m-1".into(),
            record_topic: "orders.retry".into(),
            partition: 2,
            offset: 9,
            attempt: 2,
            record_key: Some(b"order-7".to_vec()),
            timestamp_ms: None,
            headers: headers(),
            body: b"{}".to_vec(),
        };
        assert_eq!(m.key(), "orders:m-1");
        assert_eq!(m.header(MSG_ID_HEADER), Some(&b"m-1"[..]));
        assert_eq!(m.ordering_key(), None);
        let mut m = m;
        for (k, v) in [
            (ORDERING_KEY_HEADER, "order-7"),
            ("tenant", "acme"),
            ("tenant", "second"),
            ("content-type", "application/json"),
        ] {
            m.headers.push((k.to_owned(), v.as_bytes().to_vec()));
        }
        assert_eq!(m.ordering_key(), Some("order-7"));
        assert_eq!(m.header_text("tenant"), Some("acme"));
        let user: Vec<(String, String)> = m.user_headers().into_iter().collect();
        let expect = [("empty", ""), ("tenant", "acme")].map(|(k, v)| (k.to_owned(), v.to_owned()));
        assert_eq!(user, expect);
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"topic":"orders","msg_id":"m-1"}"#
        );
    }
}

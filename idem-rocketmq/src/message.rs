//! One RocketMQ message, as the handler sees it, and where its key comes
//! from.

use super::{
    KEYS_PROPERTY, MSG_ID_PROPERTY, ORDERING_KEY_PROPERTY, TAGS_PROPERTY, UNIQ_KEY_PROPERTY,
};
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::message::MessageQueue;
use std::collections::BTreeMap;

/// A message read from a RocketMQ queue, given to the handler with its
/// parsed payload.
///
/// `topic` and `msg_id` make its key: `"rocketmq:{m.topic}:{m.msg_id}"`
/// in an `#[idempotent]` key template, the article's `msgId + topic`.
/// They are the same on every copy of one message: a redelivery after a
/// crash, a rebalance or a broker failover, and a second copy its
/// producer wrote after a lost acknowledgement (when the id is the outbox
/// `msg_id`, as [`Publisher`](crate::Publisher) writes it).
#[derive(Debug, Clone)]
pub struct Message {
    /// The topic the message was consumed from.
    pub topic: String,
    /// The message's id: where it comes from is
    /// [`Consumer::key_from`](crate::Consumer::key_from) (by default the
    /// outbox id, else RocketMQ's message id).
    pub msg_id: String,
    /// RocketMQ's message id (`UNIQ_KEY`, given by the producer's client,
    /// kept across its own send retries), when it has one.
    pub rocketmq_msg_id: Option<String>,
    /// The broker group (`brokerName`) of the queue it was read from.
    pub broker_name: String,
    /// The queue it was read from.
    pub queue_id: i32,
    /// Its offset in that queue.
    pub queue_offset: i64,
    /// This consumer's attempt at it, from 1 (in place after a failure;
    /// a redelivery to another member starts again from 1).
    pub attempt: u32,
    /// The message's keys (RocketMQ's indexed `KEYS`), if any.
    pub keys: Vec<String>,
    /// Its tag, if any.
    pub tags: Option<String>,
    /// When its producer created it, in milliseconds since the Unix epoch.
    pub born_timestamp: i64,
    /// Its properties (RocketMQ's own and the user's).
    pub properties: Vec<(String, String)>,
    /// The raw body (the payload, JSON).
    pub body: Vec<u8>,
}

impl Message {
    /// `"{topic}:{msg_id}"`, the article's key for MQ consumption.
    pub fn key(&self) -> String {
        format!("{}:{}", self.topic, self.msg_id)
    }

    /// A property's value, by name: a header the outbox message was
    /// enqueued with, or any other property.
    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The user properties: all but idem's own (`IDEM_…`) and RocketMQ's
    /// system ones. For a message the outbox
    /// [`Publisher`](crate::Publisher) wrote, the headers it was enqueued
    /// with.
    pub fn user_headers(&self) -> BTreeMap<String, String> {
        self.properties
            .iter()
            .filter(|(k, _)| !reserved(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The ordering key the outbox message was enqueued with (the
    /// [`ORDERING_KEY_PROPERTY`](crate::ORDERING_KEY_PROPERTY) property),
    /// if any.
    pub fn ordering_key(&self) -> Option<&str> {
        self.property(ORDERING_KEY_PROPERTY)
    }
}

impl idem_core::consume::Incoming for Message {
    fn body(&self) -> &[u8] {
        &self.body
    }
}

/// Only the message's identity (topic and id), so that a key template
/// can name the message as a whole.
impl serde::Serialize for Message {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Message", 2)?;
        st.serialize_field("topic", &self.topic)?;
        st.serialize_field("msg_id", &self.msg_id)?;
        st.end()
    }
}

/// One message as read, owned by its worker.
pub(super) struct Record {
    pub(super) queue: MessageQueue,
    pub(super) offset: i64,
    pub(super) rocketmq_msg_id: Option<String>,
    pub(super) keys: Vec<String>,
    pub(super) tags: Option<String>,
    pub(super) born_timestamp: i64,
    pub(super) properties: Vec<(String, String)>,
    pub(super) body: Vec<u8>,
}

impl Record {
    pub(super) fn of(m: &MessageExt) -> Record {
        let properties: Vec<(String, String)> = m
            .properties()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let prop = |name: &str| {
            properties
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let keys = prop(KEYS_PROPERTY)
            .map(|k| {
                k.split(' ')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let uniq = prop(UNIQ_KEY_PROPERTY).or_else(|| {
            let id = m.msg_id().to_string();
            (!id.is_empty()).then_some(id)
        });
        Record {
            queue: MessageQueue::from_parts(m.topic().clone(), m.broker_name(), m.queue_id()),
            offset: m.queue_offset(),
            rocketmq_msg_id: uniq,
            tags: prop(TAGS_PROPERTY),
            keys,
            born_timestamp: m.born_timestamp(),
            properties,
            body: m.body().map(|b| b.to_vec()).unwrap_or_default(),
        }
    }

    pub(super) fn message(&self, msg_id: &str, attempt: u32) -> Message {
        Message {
            topic: self.queue.topic().to_string(),
            msg_id: msg_id.to_owned(),
            rocketmq_msg_id: self.rocketmq_msg_id.clone(),
            broker_name: self.queue.broker_name().to_string(),
            queue_id: self.queue.queue_id(),
            queue_offset: self.offset,
            attempt,
            keys: self.keys.clone(),
            tags: self.tags.clone(),
            born_timestamp: self.born_timestamp,
            properties: self.properties.clone(),
            body: self.body.clone(),
        }
    }
}

/// Where a message's id (and so its key) comes from; see
/// [`Consumer::key_from`](crate::Consumer::key_from).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFrom(pub(crate) Source);

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    MsgId,
    Property(String),
    Keys,
    Field(String),
}

impl KeyFrom {
    /// The default: the [`MSG_ID_PROPERTY`] property (the outbox `msg_id`
    /// that [`Publisher`](crate::Publisher) writes), else RocketMQ's
    /// message id (`UNIQ_KEY`), the article's `msgId`.
    ///
    /// RocketMQ's message id is given by the producer's client once per
    /// message and kept across that client's own send retries, and every
    /// redelivery of the stored message carries it. A producer that
    /// sends the same business message again itself (an application
    /// retry, an outbox relay of another library) makes a new one: name
    /// a stable id of its own with [`property`](KeyFrom::property),
    /// [`keys`](KeyFrom::keys) or [`field`](KeyFrom::field).
    pub fn msg_id() -> Self {
        KeyFrom(Source::MsgId)
    }

    /// A user property of the message, by name.
    pub fn property(name: impl Into<String>) -> Self {
        KeyFrom(Source::Property(name.into()))
    }

    /// The message's first key (RocketMQ's `KEYS`, set by the producer,
    /// indexed by the broker: often the business id).
    pub fn keys() -> Self {
        KeyFrom(Source::Keys)
    }

    /// A field of the JSON payload: a top-level name, or a JSON pointer
    /// (`"/event/id"`); a string or a number.
    pub fn field(name: impl Into<String>) -> Self {
        KeyFrom(Source::Field(name.into()))
    }

    pub(crate) fn describe(&self) -> String {
        match &self.0 {
            Source::MsgId => format!("`{MSG_ID_PROPERTY}` property or RocketMQ message id"),
            Source::Property(p) => format!("`{p}` property"),
            Source::Keys => "message key".to_owned(),
            Source::Field(f) => format!("`{f}` payload field"),
        }
    }

    pub(crate) fn id_of(
        &self,
        properties: &[(String, String)],
        keys: &[String],
        body: &[u8],
    ) -> Option<String> {
        let prop = |name: &str| {
            properties
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .filter(|v| !v.is_empty())
        };
        let id = match &self.0 {
            Source::MsgId => prop(MSG_ID_PROPERTY).or_else(|| prop(UNIQ_KEY_PROPERTY)),
            Source::Property(p) => prop(p),
            Source::Keys => keys.first().cloned(),
            Source::Field(f) => field_text(body, f),
        };
        id.filter(|s| !s.is_empty())
    }
}

impl Default for KeyFrom {
    fn default() -> Self {
        KeyFrom::msg_id()
    }
}

pub(crate) fn field_text(body: &[u8], field: &str) -> Option<String> {
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
/// (`IDEM_…`, in any case) and RocketMQ's system properties.
pub(crate) fn reserved(name: &str) -> bool {
    name.get(..5)
        .is_some_and(|p| p.eq_ignore_ascii_case("IDEM_"))
        || rocketmq_model::common::message::STRING_HASH_SET.contains(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(with_ours: bool) -> Vec<(String, String)> {
        let mut p = vec![
            (
                UNIQ_KEY_PROPERTY.to_owned(),
                "7F00000100002A9F0000".to_owned(),
            ),
            ("tenant".to_owned(), "t-1".to_owned()),
            ("empty".to_owned(), String::new()),
        ];
        if with_ours {
            p.push((MSG_ID_PROPERTY.to_owned(), "m-1".to_owned()));
        }
        p
    }

    #[test]
    fn ids_from_the_outbox_id_rocketmqs_id_a_property_a_key_or_a_field() {
        let body = br#"{"event_id": 42, "meta": {"id": "e-9"}, "flag": true}"#;
        let keys = vec!["order-7".to_owned()];
        let d = KeyFrom::default();
        assert_eq!(d.id_of(&props(true), &keys, body).as_deref(), Some("m-1"));
        assert_eq!(
            d.id_of(&props(false), &keys, body).as_deref(),
            Some("7F00000100002A9F0000")
        );
        assert_eq!(d.id_of(&[], &keys, body), None);
        let p = props(false);
        assert_eq!(
            KeyFrom::property("tenant")
                .id_of(&p, &keys, body)
                .as_deref(),
            Some("t-1")
        );
        assert_eq!(KeyFrom::property("empty").id_of(&p, &keys, body), None);
        assert_eq!(
            KeyFrom::keys().id_of(&p, &keys, body).as_deref(),
            Some("order-7")
        );
        assert_eq!(KeyFrom::keys().id_of(&p, &[], body), None);
        assert_eq!(
            KeyFrom::field("event_id").id_of(&p, &[], body).as_deref(),
            Some("42")
        );
        assert_eq!(
            KeyFrom::field("/meta/id").id_of(&p, &[], body).as_deref(),
            Some("e-9")
        );
        assert_eq!(KeyFrom::field("flag").id_of(&p, &[], body), None);
        assert_eq!(KeyFrom::field("event_id").id_of(&p, &[], b"{"), None);
    }

    #[test]
    fn the_key_is_topic_and_msg_id() {
        let m = Message {
            topic: "orders".into(),
            msg_id: "m-1".into(),
            rocketmq_msg_id: None,
            broker_name: "broker-a".into(),
            queue_id: 2,
            queue_offset: 9,
            attempt: 1,
            keys: vec![],
            tags: None,
            born_timestamp: 0,
            properties: props(true),
            body: b"{}".to_vec(),
        };
        assert_eq!(m.key(), "orders:m-1");
        assert_eq!(m.property("tenant"), Some("t-1"));
        assert_eq!(m.ordering_key(), None);
        let user: Vec<(String, String)> = m.user_headers().into_iter().collect();
        let expect = [("empty", ""), ("tenant", "t-1")].map(|(k, v)| (k.to_owned(), v.to_owned()));
        assert_eq!(user, expect);
        let mut m = m;
        m.properties
            .push((ORDERING_KEY_PROPERTY.to_owned(), "order-7".to_owned()));
        assert_eq!(m.ordering_key(), Some("order-7"));
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"topic":"orders","msg_id":"m-1"}"#
        );
    }
}

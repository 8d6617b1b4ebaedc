//! AMQP strings and header values: short strings checked, long strings
//! built, integer and string headers read back.

use idem_core::Error;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, LongString, ShortString};

/// An AMQP short string (at most 255 bytes), or a permanent error.
pub(super) fn short(what: &str, s: &str) -> Result<ShortString, Error> {
    ShortString::try_new(s).map_err(|e| {
        Error::broker(
            "amqp",
            format!("{what} `{s:.64}…` is not an AMQP short string: {e}"),
            false,
        )
    })
}

pub(super) fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

pub(super) fn header(props: &BasicProperties, name: &str) -> Option<AMQPValue> {
    props.headers().as_ref()?.inner().get(name).cloned()
}

/// An integer header of any AMQP integer type.
pub(super) fn header_u32(props: &BasicProperties, name: &str) -> Option<u32> {
    let n: i128 = match header(props, name)? {
        AMQPValue::ShortShortInt(v) => v.into(),
        AMQPValue::ShortShortUInt(v) => v.into(),
        AMQPValue::ShortInt(v) => v.into(),
        AMQPValue::ShortUInt(v) => v.into(),
        AMQPValue::LongInt(v) => v.into(),
        AMQPValue::LongUInt(v) => v.into(),
        AMQPValue::LongLongInt(v) => v.into(),
        _ => return None,
    };
    u32::try_from(n).ok()
}

pub(super) fn header_str(props: &BasicProperties, name: &str) -> Option<String> {
    match header(props, name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ATTEMPTS_HEADER;
    use lapin::types::FieldTable;

    #[test]
    fn headers_of_any_integer_type() {
        for v in [
            AMQPValue::LongInt(3),
            AMQPValue::LongLongInt(3),
            AMQPValue::ShortShortUInt(3),
            AMQPValue::LongUInt(3),
        ] {
            let mut h = FieldTable::default();
            h.insert(ATTEMPTS_HEADER.into(), v);
            let p = BasicProperties::default().with_headers(h);
            assert_eq!(header_u32(&p, ATTEMPTS_HEADER), Some(3));
        }
        let mut h = FieldTable::default();
        h.insert(ATTEMPTS_HEADER.into(), AMQPValue::LongInt(-1));
        let p = BasicProperties::default().with_headers(h);
        assert_eq!(header_u32(&p, ATTEMPTS_HEADER), None);
        assert_eq!(
            header_u32(&BasicProperties::default(), ATTEMPTS_HEADER),
            None
        );
    }
}

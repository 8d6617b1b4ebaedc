//! The Redis commands the consumer and the publisher send, and the
//! parsing of their replies (RESP2 arrays, each entry's fields kept in
//! the order stored).

use super::error::{from_redis, is_no_group};
use idem_core::Error;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, RedisError, Value};
use std::time::Duration;

/// One stream entry as read: its id and its fields, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) id: String,
    pub(super) fields: Vec<(String, Vec<u8>)>,
}

impl Entry {
    /// The value of field `name`, as UTF-8 text (the first, if repeated).
    pub(super) fn text(&self, name: &str) -> Option<String> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }
}

/// A connection manager on `client`: it reconnects on its own, with
/// back-off, after a dropped connection; every call waits `response` at
/// most (`None`: no bound, for blocking reads).
pub(super) async fn manager(
    client: &Client,
    response: Option<Duration>,
) -> Result<ConnectionManager, Error> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(response)
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_secs(1));
    ConnectionManager::new_with_config(client.clone(), config)
        .await
        .map_err(|e| from_redis("connect", e))
}

/// `XGROUP CREATE stream group start MKSTREAM`; a group that exists
/// already (`BUSYGROUP`) is no error.
pub(super) async fn create_group(
    conn: &mut ConnectionManager,
    stream: &str,
    group: &str,
    start: &str,
) -> Result<bool, RedisError> {
    let created: Result<Value, RedisError> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg(start)
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match created {
        Ok(_) => Ok(true),
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(false),
        Err(e) => Err(e),
    }
}

/// `XREADGROUP GROUP group consumer COUNT count BLOCK block STREAMS
/// stream >`: new entries, none when the block ran out.
pub(super) async fn read_new(
    conn: &mut ConnectionManager,
    stream: &str,
    group: &str,
    consumer: &str,
    count: usize,
    block: Duration,
) -> Result<Vec<Entry>, RedisError> {
    let v: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("BLOCK")
        .arg(block.as_millis().max(1) as u64)
        .arg("STREAMS")
        .arg(stream)
        .arg(">")
        .query_async(conn)
        .await?;
    // [[stream, [entry…]]] or nil
    let mut out = Vec::new();
    for s in array(v) {
        if let Some(entries) = array(s).into_iter().nth(1) {
            out.extend(array(entries).into_iter().filter_map(entry));
        }
    }
    Ok(out)
}

/// `XAUTOCLAIM stream group consumer min_idle cursor COUNT count`: the
/// entries pending for longer than `min_idle` (with any consumer, this
/// one included), now this consumer's, and the cursor of the next call
/// (`0-0`: the scan went round). Entries trimmed from the stream while
/// pending are dropped from the pending list by Redis and not returned.
pub(super) async fn auto_claim(
    conn: &mut ConnectionManager,
    stream: &str,
    group: &str,
    consumer: &str,
    min_idle: Duration,
    cursor: &str,
    count: usize,
) -> Result<(String, Vec<Entry>), RedisError> {
    let v: Value = redis::cmd("XAUTOCLAIM")
        .arg(stream)
        .arg(group)
        .arg(consumer)
        .arg(min_idle.as_millis() as u64)
        .arg(cursor)
        .arg("COUNT")
        .arg(count)
        .query_async(conn)
        .await?;
    let mut parts = array(v).into_iter();
    let next = parts.next().and_then(text).unwrap_or_else(|| "0-0".into());
    let entries = parts
        .next()
        .map(array)
        .unwrap_or_default()
        .into_iter()
        .filter_map(entry)
        .collect();
    Ok((next, entries))
}

/// How many times Redis handed out each of `ids` (`XPENDING stream group
/// id id 1`, pipelined), `1` for one no longer pending.
pub(super) async fn delivery_counts(
    conn: &mut ConnectionManager,
    stream: &str,
    group: &str,
    ids: &[&str],
) -> Result<Vec<u32>, RedisError> {
    let mut pipe = redis::pipe();
    for id in ids {
        pipe.cmd("XPENDING")
            .arg(stream)
            .arg(group)
            .arg(*id)
            .arg(*id)
            .arg(1);
    }
    let replies: Vec<Value> = pipe.query_async(conn).await?;
    Ok(replies
        .into_iter()
        .map(|r| {
            // [[id, consumer, idle, deliveries]]
            let count = array(r)
                .into_iter()
                .next()
                .map(array)
                .and_then(|row| row.into_iter().nth(3))
                .and_then(|c| match c {
                    Value::Int(n) => u32::try_from(n).ok(),
                    _ => None,
                });
            count.unwrap_or(1).max(1)
        })
        .collect())
}

/// `XCLAIM stream group consumer 0 ids… JUSTID`: the entries' idle time
/// reset (they stay this consumer's, their delivery counts unchanged),
/// so that no `XAUTOCLAIM` takes them while their handlers run.
pub(super) async fn keep(
    conn: &mut ConnectionManager,
    stream: &str,
    group: &str,
    consumer: &str,
    ids: &[String],
) -> Result<(), RedisError> {
    let _: Value = redis::cmd("XCLAIM")
        .arg(stream)
        .arg(group)
        .arg(consumer)
        .arg(0)
        .arg(ids)
        .arg("JUSTID")
        .query_async(conn)
        .await?;
    Ok(())
}

/// `XACK stream group id`: whether the entry was pending (`false`:
/// acknowledged already, or its group re-created).
pub(super) async fn ack(
    conn: &mut ConnectionManager,
    stream: &str,
    group: &str,
    id: &str,
) -> Result<bool, RedisError> {
    let n: i64 = redis::cmd("XACK")
        .arg(stream)
        .arg(group)
        .arg(id)
        .query_async(conn)
        .await?;
    Ok(n > 0)
}

/// `XADD stream [MAXLEN ~ n] * fields…`: the new entry's id.
pub(super) async fn add(
    conn: &mut ConnectionManager,
    stream: &str,
    max_len: Option<usize>,
    fields: &[(&str, &[u8])],
) -> Result<String, RedisError> {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream);
    if let Some(n) = max_len {
        cmd.arg("MAXLEN").arg("~").arg(n);
    }
    cmd.arg("*");
    for (name, value) in fields {
        cmd.arg(*name).arg(*value);
    }
    cmd.query_async(conn).await
}

/// Creates the group when a read answered `NOGROUP`; `Ok(false)` when the
/// error was another.
pub(super) async fn recreate_if_lost(
    conn: &mut ConnectionManager,
    stream: &str,
    group: &str,
    e: &RedisError,
) -> Result<bool, Error> {
    if !is_no_group(e) {
        return Ok(false);
    }
    // From the start: a stream lost with its group is read again whole
    // (what it holds now was written after the loss); `$` would skip
    // what was added between the loss and this read.
    let created = create_group(conn, stream, group, "0")
        .await
        .map_err(|e| from_redis("XGROUP CREATE", e))?;
    tracing::warn!(%stream, %group, created, "consumer group missing (stream deleted, or lost with a Redis that kept nothing on disk); created again, reading from the start");
    Ok(true)
}

fn array(v: Value) -> Vec<Value> {
    match v {
        Value::Array(items) | Value::Set(items) => items,
        _ => Vec::new(),
    }
}

fn text(v: Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        Value::SimpleString(s) => Some(s),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn bytes(v: Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b,
        Value::SimpleString(s) => s.into_bytes(),
        Value::Int(n) => n.to_string().into_bytes(),
        _ => Vec::new(),
    }
}

/// `[id, [field, value, …]]` (nil for an entry deleted while pending).
fn entry(v: Value) -> Option<Entry> {
    let mut parts = array(v).into_iter();
    let id = parts.next().and_then(text)?;
    let raw = match parts.next()? {
        Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        v => array(v),
    };
    let mut fields = Vec::with_capacity(raw.len() / 2);
    let mut raw = raw.into_iter();
    while let (Some(name), Some(value)) = (raw.next(), raw.next()) {
        fields.push((text(name).unwrap_or_default(), bytes(value)));
    }
    Some(Entry { id, fields })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn parses_entries_in_order_and_skips_deleted_ones() {
        let v = Value::Array(vec![
            bulk("1-0"),
            Value::Array(vec![
                bulk("msg_id"),
                bulk("m-1"),
                bulk("payload"),
                bulk("{}"),
            ]),
        ]);
        let e = entry(v).unwrap();
        assert_eq!(e.id, "1-0");
        assert_eq!(e.text("msg_id").as_deref(), Some("m-1"));
        assert_eq!(e.fields[1], ("payload".into(), b"{}".to_vec()));
        assert_eq!(entry(Value::Nil), None);
    }
}

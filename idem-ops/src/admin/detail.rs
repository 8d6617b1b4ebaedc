//! What the operator reads about one message, one HTTP request and the
//! processes alive: a message's every column (online or archived) and
//! its attempt log, the relays and consumers with their heartbeats, and
//! the record the `Idempotency-Key` layer keeps for a request.

use crate::Operable;
use idem_core::Error;
use serde::{Serialize, Serializer};
use sqlx::Pool;
use std::time::Duration;
use time::OffsetDateTime;

/// The most rows the attempt log keeps per message (older ones are
/// deleted as new ones are written), and so the most [`attempts`] answers.
pub const ATTEMPT_LOG_MAX: i64 = 32;

/// One outbox message, every column, online or archived.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct MessageDetail {
    /// Primary key (kept when archived).
    pub id: i64,
    /// Topic.
    pub topic: String,
    /// The producer's message id.
    pub msg_id: String,
    /// The payload as stored (JSON text).
    pub payload: String,
    /// The headers as stored (a JSON object), if any.
    pub headers: Option<String>,
    /// The ordering key, if any.
    pub ordering_key: Option<String>,
    /// `pending`, `success` or `failed`.
    pub status: String,
    /// Attempts so far.
    pub attempts: i64,
    /// When a relay may claim it next (pending messages).
    #[serde(with = "time::serde::rfc3339")]
    pub next_attempt_at: OffsetDateTime,
    /// The relay holding (or that last held) its lease.
    pub lease_owner: Option<String>,
    /// When that lease ends (later than now: a relay is delivering it).
    #[serde(with = "time::serde::rfc3339::option")]
    pub locked_until: Option<OffsetDateTime>,
    /// The last failure, if any.
    pub last_error: Option<String>,
    /// When it was enqueued.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Last change.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// When it moved to `idem_outbox_history`; `None` while online.
    #[serde(with = "time::serde::rfc3339::option")]
    pub archived_at: Option<OffsetDateTime>,
}

/// Message `id`: the online row, else the archived one (`archived_at`
/// set); `None` if neither exists.
pub async fn message<DB: Operable>(
    pool: &Pool<DB>,
    id: i64,
) -> Result<Option<MessageDetail>, Error> {
    Ok(DB::outbox_detail(pool, id).await?)
}

/// One entry of a message's attempt log: a failed delivery (written by
/// the relay) or an operator's action.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Attempt {
    /// The message's attempt count when it was written.
    pub attempt: i64,
    /// `retry` (failed, scheduled again), `dead` (failed, dead-lettered),
    /// or an operator's `discarded`, `retry_now`, `requeued`.
    pub outcome: String,
    /// The error, or the operator's reason.
    pub detail: Option<String>,
    /// The relay's lease owner, or the operator (`console`, `cli:<user>`).
    pub actor: Option<String>,
    /// When.
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
}

/// Message `id`'s attempt log, oldest first: its last
/// [`ATTEMPT_LOG_MAX`] entries at most (also once the message is
/// archived). Successful deliveries are not logged.
pub async fn attempts<DB: Operable>(pool: &Pool<DB>, id: i64) -> Result<Vec<Attempt>, Error> {
    let mut log = DB::outbox_attempt_log(pool, id, ATTEMPT_LOG_MAX).await?;
    log.reverse();
    Ok(log)
}

/// A relay or consumer alive (or that was: see `heartbeat_age`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Process {
    /// Its id: a relay's claim owner (its messages' `lease_owner`), a
    /// consumer's id.
    pub id: String,
    /// `relay` or `consumer`.
    pub kind: String,
    /// What it serves: its topics, or its queue.
    pub name: String,
    /// The host it runs on, if it said.
    pub host: Option<String>,
    /// Its process id, if it said.
    pub pid: Option<i64>,
    /// When it started.
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    /// Its last heartbeat.
    #[serde(with = "time::serde::rfc3339")]
    pub heartbeat_at: OffsetDateTime,
    /// Time since its last heartbeat, by the database's clock (in JSON:
    /// seconds, a number).
    #[serde(rename = "heartbeat_age_secs", serialize_with = "as_secs")]
    pub heartbeat_age: Duration,
}

fn as_secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// The relays and consumers registered in `idem_process`, ordered by
/// kind, name and id. A process that stopped without unregistering stays
/// until it is cleaned up: its `heartbeat_age` grows.
pub async fn processes<DB: Operable>(pool: &Pool<DB>) -> Result<Vec<Process>, Error> {
    let mut all = DB::process_list(pool).await?;
    all.sort_by(|a, b| (&a.kind, &a.name, &a.id).cmp(&(&b.kind, &b.name, &b.id)));
    Ok(all)
}

/// What the `Idempotency-Key` layer (`idem_runtime::http`) keeps for one
/// request: its record in `idem_record` (or `idem_record_history`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct RequestRecord {
    /// The record's key as stored: `http:` and the hex SHA-256 of the
    /// caller and the client's key.
    pub record_key: String,
    /// The layer's scope (the record's `biz_type`).
    pub scope: String,
    /// The client's `Idempotency-Key` (the record's `biz_no`).
    pub key: String,
    /// Hex SHA-256 of the request's method, path and body.
    pub fingerprint: String,
    /// `in_flight` (a request holds the key: no answer yet), `answered`
    /// (an answer is kept, replayed to retries), or `other` (a record
    /// that is no HTTP answer).
    pub state: String,
    /// The kept answer's HTTP status (`answered` only).
    pub response_status: Option<u16>,
    /// The kept answer's body: its text, or `hex:` and its bytes in hex
    /// when it is no UTF-8 (`answered` only).
    pub response_body: Option<String>,
    /// The `result` column as stored (JSON).
    pub result: Option<String>,
    /// When the key was first claimed.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When the record expires: the in-flight request's lease end, or the
    /// end of the answer's retention.
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    /// When it moved to `idem_record_history`; `None` while online.
    #[serde(with = "time::serde::rfc3339::option")]
    pub archived_at: Option<OffsetDateTime>,
}

/// The record the `Idempotency-Key` layer keeps for the request `caller`
/// sent with `Idempotency-Key: key` (the key unquoted, as the client
/// meant it; `caller` as the layer's identity function answered): online,
/// else archived; in the scope where it was used most recently when
/// several scopes hold it. `None` when there is none. A `key` that is not
/// 1 to 128 bytes of printable ASCII (no request could send it) or an
/// empty `caller` is an [`Error::Config`].
pub async fn request<DB: Operable>(
    pool: &Pool<DB>,
    key: &str,
    caller: &str,
) -> Result<Option<RequestRecord>, Error> {
    check_request_key(key, caller)?;
    let record_key = idem_core::requests::record_key(caller, key);
    let found = crate::archive::find_record(pool, &record_key, None).await?;
    let latest = found.into_iter().max_by_key(|r| r.create_time);
    Ok(latest.map(|r| {
        let (state, response_status, response_body) = answer_of(r.result.as_deref());
        RequestRecord {
            record_key: r.key,
            scope: r.biz_type,
            key: r.biz_no,
            fingerprint: r.fingerprint,
            state: state.to_string(),
            response_status,
            response_body,
            result: r.result,
            created_at: r.create_time,
            expires_at: r.expire_time,
            archived_at: r.archived_at,
        }
    }))
}

/// The longest `Idempotency-Key` the layer accepts, in bytes.
const MAX_HTTP_KEY_LEN: usize = 128;

fn check_request_key(key: &str, caller: &str) -> Result<(), Error> {
    let reason = if key.is_empty() || key.len() > MAX_HTTP_KEY_LEN {
        format!(
            "an Idempotency-Key is 1 to {MAX_HTTP_KEY_LEN} bytes long, not {}",
            key.len()
        )
    } else if !key.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        "an Idempotency-Key holds printable ASCII only".to_string()
    } else if caller.is_empty() {
        "the caller is empty: give the identity the layer's identity function answers".to_string()
    } else {
        return Ok(());
    };
    Err(Error::Config { reason })
}

/// The layer's `result` column: its state, and the answer's status and
/// body when one is kept.
fn answer_of(result: Option<&str>) -> (&'static str, Option<u16>, Option<String>) {
    let Some(v) = result.and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok()) else {
        return ("other", None, None);
    };
    if v.get("lease").is_some_and(|l| l.is_string()) && v.as_object().is_some_and(|o| o.len() == 1)
    {
        return ("in_flight", None, None);
    }
    let status = v.get("status").and_then(|s| s.as_u64());
    let Some(status) = status.and_then(|s| u16::try_from(s).ok()) else {
        return ("other", None, None);
    };
    let body = v.get("body").and_then(|b| {
        if let Some(t) = b.get("text").and_then(|t| t.as_str()) {
            Some(t.to_string())
        } else {
            b.get("hex")
                .and_then(|h| h.as_str())
                .map(|h| format!("hex:{h}"))
        }
    });
    ("answered", Some(status), body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read() {
        assert_eq!(answer_of(Some(r#"{"lease":"x"}"#)).0, "in_flight");
        let answered = r#"{"status":201,"headers":[],"body":{"text":"ok"}}"#;
        assert_eq!(
            answer_of(Some(answered)),
            ("answered", Some(201), Some("ok".into()))
        );
        let hex = r#"{"status":200,"headers":[],"body":{"hex":"ff"}}"#;
        assert_eq!(answer_of(Some(hex)).2.as_deref(), Some("hex:ff"));
        assert_eq!(answer_of(Some("\"x\"")).0, "other");
        assert_eq!(answer_of(None).0, "other");
    }

    #[test]
    fn bad_keys_are_config_errors() {
        assert!(check_request_key("k", "c").is_ok());
        assert!(check_request_key("", "c").is_err());
        assert!(check_request_key(&"k".repeat(129), "c").is_err());
        assert!(check_request_key("clé", "c").is_err());
        assert!(check_request_key("k", "").is_err());
    }
}

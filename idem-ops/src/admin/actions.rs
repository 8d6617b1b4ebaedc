//! The operator's actions on messages and topics: discard, retry now,
//! pause and resume a topic. Each is guarded against the relays (a
//! message a relay is delivering is refused, never changed under it),
//! logged in the message's attempt log, and audited: one `tracing` event
//! of target `idem::audit` per action, naming its actor.

use crate::Operable;
use idem_core::Error;
use idem_core::outbox::MAX_ID_LEN;
use serde::Serialize;
use sqlx::Pool;
use time::OffsetDateTime;

/// One message's fate in an action (the store's answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acted {
    /// Changed.
    Done,
    /// Leased live: refused.
    InFlight,
    /// Not there, or not in a status the action takes.
    Skipped,
}

/// An action on one message.
#[derive(Debug, Clone, Copy)]
pub enum Act<'a> {
    /// Move it to the history as failed, with this reason.
    Discard {
        /// Why (the message's log and last error say it).
        reason: &'a str,
        /// Who.
        actor: &'a str,
    },
    /// Due now (a dead one back to pending, attempts reset).
    RetryNow {
        /// Who.
        actor: &'a str,
    },
}

/// The most ids one action takes.
const MAX_ACTION_IDS: usize = 1000;
/// The longest reason, in characters.
const MAX_REASON_CHARS: usize = 500;
/// The longest actor, in bytes (the `actor` and `paused_by` columns).
const MAX_ACTOR_LEN: usize = 128;

/// What an action did with each id it was given.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
#[non_exhaustive]
pub struct ActionReport {
    /// The messages changed.
    pub done: Vec<i64>,
    /// Refused: a relay holds a live lease on them (it is delivering them
    /// now); try again once it settled them.
    pub in_flight: Vec<i64>,
    /// Left alone: no such message online, or in a status the action does
    /// not apply to (a delivered one, say).
    pub skipped: Vec<i64>,
}

/// Discards dead (`failed`) or `pending` messages: each moves to
/// `idem_outbox_history` now, with status `failed` and `last_error`
/// `discarded: <reason>`, and its attempt log gets a `discarded` entry
/// (the reason, the actor). Discarded messages are never delivered, and
/// no requeue brings them back (requeues take online messages only).
///
/// A pending message whose lease is live (`locked_until` later than now:
/// a relay is delivering it) is refused (`in_flight`); delivered and
/// unknown ids are `skipped`. Each message changes in a short transaction
/// of its own, which locks its row (SQLite: takes the write lock) before
/// it checks the status and the lease, so a relay's concurrent claim or
/// settlement comes entirely before or after it.
///
/// `reason`: trimmed, 1 to 500 characters; `actor`: 1 to 128 bytes, no
/// control character; 1 to 1000 ids; else [`Error::Config`] before any
/// change.
pub async fn discard<DB: Operable>(
    pool: &Pool<DB>,
    ids: &[i64],
    reason: &str,
    actor: &str,
) -> Result<ActionReport, Error> {
    let reason = check_reason(reason)?;
    check_actor(actor)?;
    check_ids(ids)?;
    let report = act(pool, ids, Act::Discard { reason, actor }).await?;
    tracing::info!(target: "idem::audit", actor, action = "discard", reason,
        done = ?report.done, in_flight = ?report.in_flight, skipped = ?report.skipped,
        "outbox messages discarded");
    Ok(report)
}

/// Makes messages due now: a dead (`failed`) one goes back to pending
/// with attempts 0 and its lease cleared (as [`requeue`](super::requeue)
/// does, `last_error` prefixed with `requeued: `); a pending one waiting
/// for its next attempt becomes due now, keeping its attempts. Each gets
/// a `retry_now` entry in its attempt log.
///
/// A pending message leased live is refused (`in_flight`); delivered and
/// unknown ids are `skipped`. The same transactions and checks as
/// [`discard`].
pub async fn retry_now<DB: Operable>(
    pool: &Pool<DB>,
    ids: &[i64],
    actor: &str,
) -> Result<ActionReport, Error> {
    check_actor(actor)?;
    check_ids(ids)?;
    let report = act(pool, ids, Act::RetryNow { actor }).await?;
    tracing::info!(target: "idem::audit", actor, action = "retry_now",
        done = ?report.done, in_flight = ?report.in_flight, skipped = ?report.skipped,
        "outbox messages made due now");
    Ok(report)
}

/// Runs `what` on each id in turn (duplicates once), each in its own
/// transaction.
async fn act<DB: Operable>(
    pool: &Pool<DB>,
    ids: &[i64],
    what: Act<'_>,
) -> Result<ActionReport, Error> {
    let mut report = ActionReport::default();
    let mut seen = std::collections::BTreeSet::new();
    for &id in ids {
        if !seen.insert(id) {
            continue;
        }
        match DB::outbox_act(pool, id, what).await? {
            Acted::Done => report.done.push(id),
            Acted::InFlight => report.in_flight.push(id),
            Acted::Skipped => report.skipped.push(id),
        }
    }
    Ok(report)
}

/// A topic whose pending messages the relays do not claim.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct PausedTopic {
    /// The topic, exactly as its messages have it.
    pub topic: String,
    /// Why it was paused, if the operator said.
    pub reason: Option<String>,
    /// Who paused it.
    pub paused_by: Option<String>,
    /// When.
    #[serde(with = "time::serde::rfc3339")]
    pub paused_at: OffsetDateTime,
}

/// Pauses `topic`: relays stop claiming its pending messages (the ones
/// they hold already are settled as usual) until [`resume`]. True when it
/// was newly paused; pausing a paused topic changes nothing (the first
/// reason and actor stay). Enqueueing goes on. The topic is checked as
/// `enqueue` checks one (1 to [`MAX_ID_LEN`] bytes, no control
/// character); `reason` is trimmed, at most 500 characters (empty: none);
/// else [`Error::Config`].
pub async fn pause<DB: Operable>(
    pool: &Pool<DB>,
    topic: &str,
    reason: &str,
    actor: &str,
) -> Result<bool, Error> {
    check_name(topic)?;
    check_actor(actor)?;
    let reason = reason.trim();
    check_reason_len(reason)?;
    let reason = Some(reason).filter(|r| !r.is_empty());
    let paused = DB::topic_pause(pool, topic, reason, actor).await?;
    tracing::info!(target: "idem::audit", actor, action = "pause", topic, reason,
        newly_paused = paused, "outbox topic paused");
    Ok(paused)
}

/// Resumes `topic`: relays claim its messages again. True when it was
/// paused. The same checks as [`pause`].
pub async fn resume<DB: Operable>(
    pool: &Pool<DB>,
    topic: &str,
    actor: &str,
) -> Result<bool, Error> {
    check_name(topic)?;
    check_actor(actor)?;
    let resumed = DB::topic_resume(pool, topic).await?;
    tracing::info!(target: "idem::audit", actor, action = "resume", topic,
        was_paused = resumed, "outbox topic resumed");
    Ok(resumed)
}

/// The paused topics, ordered by topic (byte order, on every database).
pub async fn paused<DB: Operable>(pool: &Pool<DB>) -> Result<Vec<PausedTopic>, Error> {
    let mut all = DB::topic_paused(pool).await?;
    all.sort_by(|a, b| a.topic.cmp(&b.topic));
    Ok(all)
}

fn config<T>(reason: String) -> Result<T, Error> {
    Err(Error::Config { reason })
}

/// A reason an action records: trimmed, 1 to 500 characters.
fn check_reason(reason: &str) -> Result<&str, Error> {
    let reason = reason.trim();
    if reason.is_empty() {
        return config("a reason is required (what the message's log will say)".into());
    }
    check_reason_len(reason)?;
    Ok(reason)
}

fn check_reason_len(reason: &str) -> Result<(), Error> {
    let n = reason.chars().count();
    if n > MAX_REASON_CHARS {
        return config(format!(
            "a reason is at most {MAX_REASON_CHARS} characters long, not {n}"
        ));
    }
    Ok(())
}

/// Who acts: 1 to 128 bytes, no control character.
pub(super) fn check_actor(actor: &str) -> Result<(), Error> {
    if actor.is_empty() || actor.len() > MAX_ACTOR_LEN {
        return config(format!(
            "the actor is 1 to {MAX_ACTOR_LEN} bytes long, not {}",
            actor.len()
        ));
    }
    if let Some(c) = actor.chars().find(|c| c.is_control()) {
        return config(format!("the actor contains the control character {c:?}"));
    }
    Ok(())
}

/// A topic as `enqueue` accepts one.
fn check_name(topic: &str) -> Result<(), Error> {
    if topic.is_empty() {
        config("the topic is empty".into())
    } else if topic.len() > MAX_ID_LEN {
        config(format!(
            "the topic is {} bytes long, at most {MAX_ID_LEN} are allowed",
            topic.len()
        ))
    } else if let Some(c) = topic.chars().find(|c| c.is_control()) {
        config(format!("the topic contains the control character {c:?}"))
    } else {
        Ok(())
    }
}

fn check_ids(ids: &[i64]) -> Result<(), Error> {
    if ids.is_empty() || ids.len() > MAX_ACTION_IDS {
        return config(format!(
            "an action takes 1 to {MAX_ACTION_IDS} ids, not {}",
            ids.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_checked() {
        assert_eq!(check_reason("  why \n").unwrap(), "why");
        assert!(check_reason(" \t").is_err());
        assert!(check_reason(&"é".repeat(500)).is_ok());
        assert!(check_reason(&"é".repeat(501)).is_err());
        assert!(check_actor("cli:ann").is_ok());
        assert!(check_actor("").is_err());
        assert!(check_actor("a\nb").is_err());
        assert!(check_actor(&"a".repeat(129)).is_err());
        assert!(check_name("mail").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a\0").is_err());
        assert!(check_name(&"t".repeat(MAX_ID_LEN + 1)).is_err());
        assert!(check_ids(&[]).is_err());
        assert!(check_ids(&[1; 1001]).is_err());
        assert!(check_ids(&[1]).is_ok());
    }
}

//! The operator's outbox API: what `idem outbox stats | list | requeue`
//! runs, as guarded library functions (the CLI holds no SQL).
//!
//! ```
//! use idem_runtime::outbox::admin::{self, Requeue, RequeueTarget};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem_runtime::Error> {
//! # let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
//! # idem_runtime::migrate(&pool).await?;
//! let stats = admin::stats(&pool, None).await?;
//! assert_eq!(stats.totals.total, 0);
//! let dead = admin::list(&pool, idem_runtime::outbox::Status::Failed, None, 100).await?;
//! assert!(dead.is_empty());
//! let plan = admin::requeue(&pool, &Requeue { target: RequeueTarget::AllFailed, dry_run: true }).await?;
//! assert_eq!(plan.requeued, 0);
//! # Ok(()) }
//! ```

use super::Status;
use crate::Error;
use crate::backend::Backend;
pub use crate::backend::{OutboxMessage, RequeueTarget};
use serde::Serialize;
use sqlx::Pool;
use std::collections::BTreeMap;

/// One topic's messages per status.
#[derive(Debug, Serialize, Default, Clone, PartialEq)]
pub struct TopicStats {
    /// The topic (`(all)` in the totals).
    pub topic: String,
    /// Pending messages.
    pub pending: i64,
    /// Delivered messages.
    pub success: i64,
    /// Dead-lettered messages.
    pub failed: i64,
    /// All of them.
    pub total: i64,
    /// Seconds since the oldest pending message was enqueued (none pending: null).
    pub oldest_pending_age_secs: Option<f64>,
}

/// The outbox per topic, and the totals.
#[derive(Debug, Serialize, Clone, PartialEq)]
pub struct OutboxStats {
    /// One entry per topic, ordered by topic.
    pub topics: Vec<TopicStats>,
    /// The sum over topics; the oldest pending age is the largest.
    pub totals: TopicStats,
}

/// Messages per topic and status, and the age of each topic's oldest
/// pending message; of `topic` only when given.
pub async fn stats<DB: Backend>(
    pool: &Pool<DB>,
    topic: Option<&str>,
) -> Result<OutboxStats, Error> {
    let mut by_topic: BTreeMap<String, TopicStats> = BTreeMap::new();
    for (t, status, n) in DB::outbox_counts(pool, topic).await? {
        let e = by_topic.entry(t.clone()).or_insert_with(|| TopicStats {
            topic: t,
            ..TopicStats::default()
        });
        match status.as_str() {
            "pending" => e.pending += n,
            "success" => e.success += n,
            "failed" => e.failed += n,
            _ => {}
        }
        e.total += n;
    }
    for (t, secs) in DB::outbox_pending_age(pool, topic).await? {
        if let Some(e) = by_topic.get_mut(&t) {
            e.oldest_pending_age_secs = secs.map(|s| s.max(0.0));
        }
    }
    let topics: Vec<TopicStats> = by_topic.into_values().collect();
    let mut totals = TopicStats {
        topic: "(all)".into(),
        ..TopicStats::default()
    };
    for t in &topics {
        totals.pending += t.pending;
        totals.success += t.success;
        totals.failed += t.failed;
        totals.total += t.total;
        totals.oldest_pending_age_secs =
            match (totals.oldest_pending_age_secs, t.oldest_pending_age_secs) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
    }
    Ok(OutboxStats { topics, totals })
}

/// Messages of `status` (and `topic`), oldest first, at most `limit`
/// (at least 1, else [`Error::Config`]).
pub async fn list<DB: Backend>(
    pool: &Pool<DB>,
    status: Status,
    topic: Option<&str>,
    limit: i64,
) -> Result<Vec<OutboxMessage>, Error> {
    if limit < 1 {
        return Err(Error::Config {
            reason: format!("the limit must be at least 1, not {limit}"),
        });
    }
    Ok(DB::outbox_list(pool, status.as_str(), topic, limit).await?)
}

/// What to requeue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requeue {
    /// Which failed messages.
    pub target: RequeueTarget,
    /// Report what would change; change nothing.
    pub dry_run: bool,
}

/// What a requeue did (or, dry run, would do).
#[derive(Debug, Serialize, Clone, PartialEq)]
pub struct RequeueReport {
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// Messages set back to pending (dry run: that would be).
    pub requeued: u64,
    /// The failed messages selected, as they were.
    pub messages: Vec<OutboxMessage>,
}

/// Sends dead-lettered (failed) messages back to pending: attempts reset
/// to 0, due now, lease cleared, `last_error` kept and prefixed with
/// `requeued: `. Only failed messages change; pending and successful ones
/// are never touched. The messages are locked while they change (SQLite:
/// the write lock), so the messages reported are the messages changed.
pub async fn requeue<DB: Backend>(pool: &Pool<DB>, what: &Requeue) -> Result<RequeueReport, Error> {
    let (messages, requeued) = DB::outbox_requeue(pool, &what.target, what.dry_run).await?;
    Ok(RequeueReport {
        dry_run: what.dry_run,
        requeued,
        messages,
    })
}

/// The status of message `id` (`pending`, `success`, `failed`), if it
/// exists: why a requeue of one id changed nothing.
pub async fn status_of<DB: Backend>(pool: &Pool<DB>, id: i64) -> Result<Option<String>, Error> {
    Ok(DB::outbox_status(pool, id).await?)
}

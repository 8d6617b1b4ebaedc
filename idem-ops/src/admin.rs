//! The operator's outbox API: what `idem outbox stats | list | requeue`
//! runs, as guarded library functions (the CLI holds no SQL).
//!
//! Beside the reads and the requeue: one message in full with its attempt
//! log ([`message`], [`attempts`]), the actions on messages and topics
//! ([`discard`], [`retry_now`], [`pause`], [`resume`], [`paused`]), the
//! relays and consumers alive ([`processes`]), and the record kept for an
//! HTTP request ([`request`]). Every action is audited: one `tracing`
//! event of target `idem::audit` naming its actor.
//!
//! ```
//! use idem_runtime::outbox::admin::{self, Requeue, RequeueTarget};
//! use std::time::Duration;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem_runtime::Error> {
//! # let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
//! # idem_runtime::migrate(&pool).await?;
//! let stats = admin::stats(&pool, None).await?;
//! assert_eq!(stats.totals.total, 0);
//! let dead = admin::list(&pool, idem_runtime::outbox::Status::Failed, None, 100).await?;
//! assert!(dead.is_empty());
//! let plan = admin::requeue(&pool, &Requeue { target: RequeueTarget::AllFailed, max_id: None, dry_run: true }).await?;
//! assert_eq!(plan.requeued, 0);
//! assert!(admin::leases(&pool).await?.is_empty());
//! let minutes = admin::deliveries(&pool, Duration::from_secs(600), Duration::from_secs(60)).await?;
//! assert_eq!(minutes, vec![0; 10]);
//! # Ok(()) }
//! ```

mod actions;
mod detail;

pub(crate) use actions::{Act, Acted};
pub use actions::{ActionReport, PausedTopic, discard, pause, paused, resume, retry_now};
pub use detail::{
    ATTEMPT_LOG_MAX, Attempt, MessageDetail, Process, RequestRecord, attempts, message, processes,
    request,
};

use crate::Operable;
use idem_core::Error;
use idem_core::outbox::{MAX_ID_LEN, Status};
use serde::Serialize;
use sqlx::Pool;
use std::collections::BTreeMap;
use std::time::Duration;
use time::OffsetDateTime;

/// An outbox message as the operator sees it (no payload).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OutboxMessage {
    /// Primary key.
    pub id: i64,
    /// Topic.
    pub topic: String,
    /// The producer's message id.
    pub msg_id: String,
    /// `pending`, `success` or `failed`.
    pub status: String,
    /// Attempts so far.
    pub attempts: i64,
    /// The last failure, if any.
    pub last_error: Option<String>,
    /// Last change.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

/// Which failed messages a requeue takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequeueTarget {
    /// The failed message with this id.
    Id(i64),
    /// Every failed message of this topic.
    Topic(String),
    /// Every failed message.
    AllFailed,
    /// The failed messages among these ids (an operator's selection; at
    /// least 1 and at most 1000 ids).
    Ids(Vec<i64>),
}

/// The most messages one [`page`] returns.
const MAX_PAGE: i64 = 1000;
/// The most ids one [`RequeueTarget::Ids`] selection holds.
const MAX_IDS: usize = 1000;
/// The longest window of [`deliveries`].
const MAX_WINDOW: Duration = Duration::from_secs(3600);
/// The most buckets of [`deliveries`].
const MAX_BUCKETS: u128 = 600;

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
///
/// This counts every row, so it reads the whole outbox: on one that
/// retains many delivered messages, [`backlog`] reads the open part alone.
pub async fn stats<DB: Operable>(
    pool: &Pool<DB>,
    topic: Option<&str>,
) -> Result<OutboxStats, Error> {
    check_topic(topic)?;
    let counts = DB::outbox_counts(pool, topic).await?;
    let ages = DB::outbox_pending_age(pool, topic).await?;
    Ok(assemble(counts, ages))
}

/// As [`stats`] without the delivered messages: `success` is 0 and
/// `total` counts the pending and failed ones (topics with neither are
/// left out). It reads only pending and failed rows, through the status
/// index, so its cost follows the backlog and the dead letters, not the
/// delivered messages the outbox retains until they are archived: on
/// PostgreSQL with 2 million delivered rows beside 2,200 open ones, 2.4 ms
/// against 0.3 s for [`stats`] (the `bench_console` benchmark).
pub async fn backlog<DB: Operable>(
    pool: &Pool<DB>,
    topic: Option<&str>,
) -> Result<OutboxStats, Error> {
    check_topic(topic)?;
    let counts = DB::outbox_open_counts(pool, topic).await?;
    let ages = DB::outbox_pending_age(pool, topic).await?;
    Ok(assemble(counts, ages))
}

/// A topic to filter on: what [`enqueue`](super::enqueue) accepts as one
/// (at most [`MAX_ID_LEN`] bytes, no control characters), else
/// [`Error::Config`] before any SQL. A NUL, which PostgreSQL refuses in
/// text, is then never the database's error.
fn check_topic(topic: Option<&str>) -> Result<(), Error> {
    let Some(t) = topic else { return Ok(()) };
    let reason = if let Some(c) = t.chars().find(|c| c.is_control()) {
        format!("a topic contains no control character, and this one has {c:?}")
    } else if t.len() > MAX_ID_LEN {
        format!(
            "a topic is at most {MAX_ID_LEN} bytes long, not {}",
            t.len()
        )
    } else {
        return Ok(());
    };
    Err(Error::Config { reason })
}

/// The per-topic figures and their totals, from `(topic, status, count)`
/// rows and each topic's oldest pending age.
fn assemble(counts: Vec<(String, String, i64)>, ages: Vec<(String, Option<f64>)>) -> OutboxStats {
    let mut by_topic: BTreeMap<String, TopicStats> = BTreeMap::new();
    for (t, status, n) in counts {
        let e = by_topic.entry(t.clone()).or_insert_with(|| TopicStats {
            topic: t,
            ..TopicStats::default()
        });
        match Status::parse(&status) {
            Some(Status::Pending) => e.pending += n,
            Some(Status::Success) => e.success += n,
            Some(Status::Failed) => e.failed += n,
            None => {}
        }
        e.total += n;
    }
    for (t, secs) in ages {
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
    OutboxStats { topics, totals }
}

/// Messages of `status` (and `topic`), oldest first, at most `limit`
/// (at least 1, else [`Error::Config`]).
pub async fn list<DB: Operable>(
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
    check_topic(topic)?;
    Ok(DB::outbox_list(pool, status.as_str(), topic, None, limit).await?)
}

/// One page of messages, oldest first.
#[derive(Debug, Serialize, Clone, PartialEq)]
#[non_exhaustive]
pub struct Page {
    /// The page's messages, in id order.
    pub messages: Vec<OutboxMessage>,
    /// the id to pass as `after` for the next page; None on the last page
    pub next_after: Option<i64>,
}

/// Messages of `status` (and `topic`) with an id above `after` (all of
/// them without), oldest (lowest id) first, at most `limit` (1 to 1000,
/// else [`Error::Config`]): keyset pagination. Pass the page's
/// `next_after` as `after` for the next page; messages that change status
/// meanwhile never make a page skip or repeat another message.
///
/// ```
/// use idem_runtime::outbox::{Status, admin};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_runtime::Error> {
/// # let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
/// # idem_runtime::migrate(&pool).await?;
/// let mut tx = pool.begin().await?;
/// for n in 0..5 {
///     idem_runtime::outbox::enqueue(&mut tx, "mail", &format!("m-{n}"), &serde_json::json!({ "n": n })).await?;
/// }
/// tx.commit().await?;
/// let (mut seen, mut after) = (Vec::new(), None);
/// loop {
///     let page = admin::page(&pool, Status::Pending, Some("mail"), after, 2).await?;
///     seen.extend(page.messages.iter().map(|m| m.msg_id.clone()));
///     match page.next_after {
///         Some(id) => after = Some(id),
///         None => break,
///     }
/// }
/// assert_eq!(seen, ["m-0", "m-1", "m-2", "m-3", "m-4"]);
/// assert!(admin::page(&pool, Status::Failed, None, None, 0).await.is_err());
/// # Ok(()) }
/// ```
pub async fn page<DB: Operable>(
    pool: &Pool<DB>,
    status: Status,
    topic: Option<&str>,
    after: Option<i64>,
    limit: i64,
) -> Result<Page, Error> {
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(Error::Config {
            reason: format!("the page size must be 1 to {MAX_PAGE}, not {limit}"),
        });
    }
    check_topic(topic)?;
    // One more than asked: whether a next page exists.
    let mut messages = DB::outbox_list(pool, status.as_str(), topic, after, limit + 1).await?;
    let next_after = if messages.len() as i64 > limit {
        messages.truncate(limit as usize);
        messages.last().map(|m| m.id)
    } else {
        None
    };
    Ok(Page {
        messages,
        next_after,
    })
}

/// What to requeue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requeue {
    /// Which failed messages.
    pub target: RequeueTarget,
    /// Only messages with id ≤ max_id (what a preview showed), so a
    /// confirmation never takes messages that failed after its preview.
    /// Applies to every target; `None`: no bound.
    pub max_id: Option<i64>,
    /// Report what would change; change nothing.
    pub dry_run: bool,
}

/// What a requeue did (or, dry run, would do).
#[derive(Debug, Serialize, Clone, PartialEq)]
#[non_exhaustive]
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
///
/// A preview and its confirmation: run it with `dry_run`, show the
/// messages, then run it again with `max_id` set to the highest id shown,
/// so that messages which failed in between are left alone. A
/// [`RequeueTarget::Ids`] selection of no ids or of more than 1000 is an
/// [`Error::Config`].
///
/// Each message requeued gets a `requeued` entry in its attempt log, and
/// the requeue is audited (see [`requeue_by`], which names who asked; here
/// the actor is `unspecified`).
pub async fn requeue<DB: Operable>(
    pool: &Pool<DB>,
    what: &Requeue,
) -> Result<RequeueReport, Error> {
    requeue_by(pool, what, UNSPECIFIED_ACTOR).await
}

/// The actor [`requeue`] records.
const UNSPECIFIED_ACTOR: &str = "unspecified";

/// [`requeue`] on behalf of `actor` (the operator: `console`,
/// `cli:<user>`; 1 to 128 bytes, no control character, else
/// [`Error::Config`]), whom the attempt log's `requeued` entries and the
/// `idem::audit` event name.
pub async fn requeue_by<DB: Operable>(
    pool: &Pool<DB>,
    what: &Requeue,
    actor: &str,
) -> Result<RequeueReport, Error> {
    check_selection(&what.target)?;
    actions::check_actor(actor)?;
    let (messages, requeued) =
        DB::outbox_requeue(pool, &what.target, what.max_id, what.dry_run, actor).await?;
    if !what.dry_run {
        tracing::info!(target: "idem::audit", actor, action = "requeue",
            target = ?what.target, max_id = what.max_id, requeued,
            ids = ?messages.iter().map(|m| m.id).collect::<Vec<_>>(),
            "outbox messages requeued");
    }
    Ok(RequeueReport {
        dry_run: what.dry_run,
        requeued,
        messages,
    })
}

fn check_selection(target: &RequeueTarget) -> Result<(), Error> {
    match target {
        RequeueTarget::Topic(t) => check_topic(Some(t)),
        RequeueTarget::Ids(ids) if ids.is_empty() || ids.len() > MAX_IDS => Err(Error::Config {
            reason: format!(
                "a requeue selection holds 1 to {MAX_IDS} ids, not {}",
                ids.len()
            ),
        }),
        _ => Ok(()),
    }
}

/// What a requeue of `target` would take, for a preview that stays cheap
/// however many dead letters there are: how many failed messages it
/// selects now, the highest of their ids (pass it as
/// [`Requeue::max_id`] to the confirmation), and the first `shown` (1 to
/// 1000) by id. Nothing is locked or changed; unlike a dry run of
/// [`requeue`], the messages are not all loaded.
///
/// ```
/// use idem_runtime::outbox::admin::{self, RequeueTarget};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_runtime::Error> {
/// # let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
/// # idem_runtime::migrate(&pool).await?;
/// let p = admin::preview(&pool, &RequeueTarget::Topic("payments".into()), 100).await?;
/// assert_eq!((p.count, p.max_id, p.first.len()), (0, None, 0));
/// # Ok(()) }
/// ```
pub async fn preview<DB: Operable>(
    pool: &Pool<DB>,
    target: &RequeueTarget,
    shown: i64,
) -> Result<RequeuePreview, Error> {
    check_selection(target)?;
    if !(1..=1000).contains(&shown) {
        return Err(Error::Config {
            reason: format!("a preview shows 1 to 1000 messages, not {shown}"),
        });
    }
    let (count, max_id, first) = DB::outbox_requeue_preview(pool, target, shown).await?;
    Ok(RequeuePreview {
        count,
        max_id,
        first,
    })
}

/// What a requeue would take (see [`preview`]).
#[derive(Debug, Serialize, Clone, PartialEq)]
#[non_exhaustive]
pub struct RequeuePreview {
    /// Failed messages the target selects now.
    pub count: u64,
    /// The highest of their ids (none: no message).
    pub max_id: Option<i64>,
    /// The first of them by id, at most as many as asked for.
    pub first: Vec<OutboxMessage>,
}

/// The status of message `id` (`pending`, `success`, `failed`), if it
/// exists: why a requeue of one id changed nothing.
pub async fn status_of<DB: Operable>(pool: &Pool<DB>, id: i64) -> Result<Option<String>, Error> {
    Ok(DB::outbox_status(pool, id).await?)
}

/// One relay's hold on pending messages (see [`leases`]).
#[derive(Debug, Serialize, Clone, PartialEq)]
pub struct LeaseHolder {
    /// The lease owner (a relay's claim owner).
    pub owner: String,
    /// pending messages whose lease_owner is this owner
    pub messages: i64,
    /// of them, leases not yet expired (locked_until > now)
    pub live: i64,
    /// The earliest `locked_until` of its messages.
    #[serde(with = "time::serde::rfc3339::option")]
    pub earliest_expiry: Option<OffsetDateTime>,
    /// The latest `locked_until` of its messages.
    #[serde(with = "time::serde::rfc3339::option")]
    pub latest_expiry: Option<OffsetDateTime>,
}

/// Who holds leases on pending messages, ordered by owner: per lease
/// owner, its pending messages, how many of those leases still run, and
/// when they end. An owner whose leases all expired is a relay that
/// stopped (or lost its database) mid-delivery: its messages are claimed
/// again once due.
pub async fn leases<DB: Operable>(pool: &Pool<DB>) -> Result<Vec<LeaseHolder>, Error> {
    let mut holders = Vec::new();
    for (owner, messages, live, earliest, latest) in DB::outbox_leases(pool).await? {
        holders.push(LeaseHolder {
            owner,
            messages,
            live,
            earliest_expiry: crate::timestamp::parse_opt(earliest)?,
            latest_expiry: crate::timestamp::parse_opt(latest)?,
        });
    }
    // The same order on every database, whatever its collation.
    holders.sort_by(|a, b| a.owner.cmp(&b.owner));
    Ok(holders)
}

/// Messages delivered (that reached `success`, by their `updated_at`) per
/// `bucket` over the last `window`, oldest bucket first: exactly
/// ceil(window / bucket) counts, the last one the most recent `bucket`
/// (the oldest bucket is the shorter one when `bucket` does not divide
/// `window`). The messages are grouped by the database, one row per
/// bucket. `bucket` at least 1 s, `window` at most 1 hour and at most 600
/// buckets, else [`Error::Config`]. Archived messages are not counted:
/// keep the archiver's outbox retention above the window.
pub async fn deliveries<DB: Operable>(
    pool: &Pool<DB>,
    window: Duration,
    bucket: Duration,
) -> Result<Vec<u64>, Error> {
    let config = |reason: String| Err(Error::Config { reason });
    if bucket < Duration::from_secs(1) {
        return config(format!("a bucket lasts at least 1 s, not {bucket:?}"));
    }
    if window.is_zero() || window > MAX_WINDOW {
        return config(format!(
            "the window lasts more than 0 s and at most 1 hour, not {window:?}"
        ));
    }
    let n = window.as_micros().div_ceil(bucket.as_micros());
    if n > MAX_BUCKETS {
        return config(format!(
            "at most {MAX_BUCKETS} buckets, not {n} ({window:?} in buckets of {bucket:?})"
        ));
    }
    let n = n as usize;
    let mut counts = vec![0u64; n];
    for (b, messages) in
        DB::outbox_deliveries(pool, window.as_secs_f64(), bucket.as_secs_f64()).await?
    {
        // Bucket 0 is the newest. A clock read a little apart (a row
        // updated "after" the statement's now) lands in it; one on the
        // window's edge, in the oldest.
        let from_newest = usize::try_from(b.max(0)).unwrap_or(usize::MAX).min(n - 1);
        counts[n - 1 - from_newest] += u64::try_from(messages).unwrap_or(0);
    }
    Ok(counts)
}

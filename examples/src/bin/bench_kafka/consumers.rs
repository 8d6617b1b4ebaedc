//! The two consumers, each run until its handlers settled every record of
//! a topic, then stopped (its offsets committed as it leaves the group):
//!
//! - **idem**: [`idem_runtime::kafka::Consumer`] running an
//!   `#[idempotent(strategy = state_machine)]` handler: the coupon read
//!   under a row lock, the deduction inserted, `UNUSED` → `USED`, one
//!   transaction; a coupon found `USED` answers `Duplicate`;
//! - **plain**: an rdkafka `StreamConsumer` with the same group settings
//!   (auto commit every second of offsets stored by hand once a record's
//!   transaction committed, `auto.offset.reset=earliest`), one task per
//!   partition running its records in order (as idem's consumer does),
//!   each in a transaction of its own: the same `UPDATE … WHERE status =
//!   'UNUSED'` and `INSERT`, without idem; a second copy of a record
//!   deducts again. Each task's queue is unbounded (idem's consumer pauses
//!   a partition whose worker holds 512 records): a bounded one would
//!   hold the reading up behind one full partition while the others ran
//!   dry, since a fetch hands over a run of one partition's records.

use crate::BoxError;
use crate::progress::{Measured, Progress};
use idem_runtime::kafka::rdkafka::consumer::{BaseConsumer, Consumer as _, StreamConsumer};
use idem_runtime::kafka::rdkafka::message::{Headers, Message as _, OwnedMessage};
use idem_runtime::kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};
use idem_runtime::kafka::{Consumer, MSG_ID_HEADER, Message};
use idem_runtime::{Outcome, State, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres, Transaction};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// Both consumers commit the stored offsets this often (idem's default).
const COMMIT_INTERVAL_MS: &str = "1000";

#[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
enum CouponState {
    Unused,
    Used,
}

/// A record's payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Deduct {
    pub(crate) coupon_id: i64,
    pub(crate) order_id: i64,
}

/// Where a consumer reads, and what it may take.
#[derive(Debug, Clone)]
pub(crate) struct Run<'a> {
    pub(crate) brokers: &'a str,
    pub(crate) topic: &'a str,
    pub(crate) group: String,
    pub(crate) pool: &'a PgPool,
    pub(crate) timeout: Duration,
}

// ---- idem -------------------------------------------------------------------

#[idempotent(
    key = "kafka:{m.topic}:{m.msg_id}",
    strategy = state_machine,
    table = "idem_bk_coupon_idem", id = d.coupon_id,
    from = CouponState::Unused, to = CouponState::Used,
)]
async fn deduct(
    tx: &mut Transaction<'_, Postgres>,
    m: &Message,
    d: &Deduct,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO idem_bk_deduction_idem (coupon_id, order_id, msg_id) VALUES ($1, $2, $3)",
    )
    .bind(d.coupon_id)
    .bind(d.order_id)
    .bind(m.msg_id.as_str())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// idem's consumer over `run.topic` until `progress` saw every record.
pub(crate) async fn idem(run: &Run<'_>, progress: &Arc<Progress>) -> Result<Measured, BoxError> {
    let (pool, p) = (run.pool.clone(), progress.clone());
    let consumer = Consumer::new(
        run.brokers,
        &run.group,
        run.topic,
        move |m: Message, d: Deduct| {
            let (pool, p) = (pool.clone(), p.clone());
            async move {
                p.begin();
                let result = deduct(&pool, &m, &d).await;
                match &result {
                    Ok(outcome) => p.settled(matches!(outcome, Outcome::Executed(()))),
                    Err(e) => p.failed(format!("coupon {}: {e}", d.coupon_id)),
                }
                result
            }
        },
    )
    .spawn()
    .await?;
    let measured = progress.wait("idem", run.timeout).await;
    let stats = consumer.stats();
    consumer.shutdown().await?;
    let measured = measured?;
    if stats.dead_lettered() != 0 || stats.retried() != 0 {
        return Err(format!(
            "idem: {} records dead-lettered, {} retried",
            stats.dead_lettered(),
            stats.retried()
        )
        .into());
    }
    Ok(measured)
}

// ---- plain rdkafka -----------------------------------------------------------

/// The same work without idem: the transition and the insert, one
/// transaction, whatever the coupon's state.
async fn deduct_plain(pool: &PgPool, msg_id: &str, d: &Deduct) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE idem_bk_coupon_plain SET status = 'USED' WHERE id = $1 AND status = 'UNUSED'",
    )
    .bind(d.coupon_id)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO idem_bk_deduction_plain (coupon_id, order_id, msg_id) VALUES ($1, $2, $3)",
    )
    .bind(d.coupon_id)
    .bind(d.order_id)
    .bind(msg_id)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// The plain consumer over `run.topic` until `progress` saw every record.
pub(crate) async fn plain(run: &Run<'_>, progress: &Arc<Progress>) -> Result<Measured, BoxError> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", run.brokers)
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("group.id", &run.group)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", COMMIT_INTERVAL_MS)
        .set("enable.auto.offset.store", "false")
        .create()?;
    consumer.subscribe(&[run.topic])?;
    let consumer = Arc::new(consumer);
    let (stop, stopped) = watch::channel(false);
    let reading = tokio::spawn(read(
        consumer.clone(),
        run.pool.clone(),
        progress.clone(),
        stopped,
    ));
    let measured = progress.wait("plain rdkafka", run.timeout).await;
    stop.send_replace(true);
    reading.await?;
    // Closing commits the stored offsets and leaves the group; it blocks.
    tokio::task::spawn_blocking(move || drop(consumer)).await?;
    measured
}

/// A partition's task of the plain consumer, and its queue.
type PartitionTask = (mpsc::UnboundedSender<OwnedMessage>, JoinHandle<()>);

/// The reading loop: each record to its partition's task, until stopped;
/// then the tasks finish what they hold.
async fn read(
    consumer: Arc<StreamConsumer>,
    pool: PgPool,
    progress: Arc<Progress>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tasks: HashMap<i32, PartitionTask> = HashMap::new();
    loop {
        let m = tokio::select! {
            biased;
            _ = stop.changed() => break,
            m = consumer.recv() => m,
        };
        let m = match m {
            Ok(m) => m.detach(),
            Err(e) => {
                eprintln!("plain rdkafka consumer: {e}; reading on");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (tx, _) = tasks.entry(m.partition()).or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let work = partition(consumer.clone(), pool.clone(), progress.clone(), rx);
            (tx, tokio::spawn(work))
        });
        // Its task ends only after a failure, which ends the run.
        let _ = tx.send(m);
    }
    for (tx, task) in tasks.into_values() {
        drop(tx);
        let _ = task.await;
    }
}

/// One partition's records, in order: each record's transaction, then its
/// offset stored (committed by the next auto commit).
async fn partition(
    consumer: Arc<StreamConsumer>,
    pool: PgPool,
    progress: Arc<Progress>,
    mut rx: mpsc::UnboundedReceiver<OwnedMessage>,
) {
    while let Some(m) = rx.recv().await {
        progress.begin();
        let msg_id = m
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == MSG_ID_HEADER))
            .and_then(|h| h.value)
            .and_then(|v| std::str::from_utf8(v).ok())
            .unwrap_or_default()
            .to_owned();
        let d: Deduct = match m.payload().map(serde_json::from_slice) {
            Some(Ok(d)) => d,
            _ => {
                progress.failed(format!("unparsable record at offset {}", m.offset()));
                return;
            }
        };
        if let Err(e) = deduct_plain(&pool, &msg_id, &d).await {
            progress.failed(format!("coupon {}: {e}", d.coupon_id));
            return;
        }
        if let Err(e) = consumer.store_offset(m.topic(), m.partition(), m.offset()) {
            progress.failed(format!("store offset {}: {e}", m.offset()));
            return;
        }
        progress.settled(true);
    }
}

// ---- after a run ---------------------------------------------------------------

/// Checks that `group` committed, as its consumer stopped, the end of
/// every partition of `topic`: a consumer of the group started again would
/// read nothing twice.
pub(crate) async fn committed_to_end(
    brokers: &str,
    group: &str,
    topic: &str,
) -> Result<(), BoxError> {
    let (brokers, group, topic) = (brokers.to_owned(), group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let timeout = Duration::from_secs(10);
        let client: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .set("allow.auto.create.topics", "false")
            .create()?;
        let metadata = client.fetch_metadata(Some(&topic), timeout)?;
        let mut tpl = TopicPartitionList::new();
        for p in metadata.topics().iter().flat_map(|t| t.partitions()) {
            tpl.add_partition(&topic, p.id());
        }
        let committed = client.committed_offsets(tpl, timeout)?;
        for e in committed.elements() {
            let (_, end) = client.fetch_watermarks(&topic, e.partition(), timeout)?;
            if e.offset() != Offset::Offset(end) {
                return Err(format!(
                    "group {group}: partition {} of {topic} committed at {:?}, its end is {end}",
                    e.partition(),
                    e.offset()
                )
                .into());
            }
        }
        Ok(())
    })
    .await?
}

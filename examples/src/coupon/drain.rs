//! One handler being drained: its relays, their lossy connections, its
//! progress, and what the deliveries left behind.

use super::BoxError;
use super::args::Args;
use super::handlers::{DeductCoupon, Handler, consume_coupon_msg_fault_version, deduct_coupon};
use super::run::connect_with_spares;
use super::sql::{sql, table_sql};
use idem_runtime::Dialect;
use idem_runtime::outbox::{Relay, RelayHandle};
use idem_runtime::{Error, Outcome};
use idem_testkit::proxy::FaultProxy;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde::Serialize;
use sqlx::{Any, AnyPool};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Handler-side counts, taken in the route: how often the handler ran, and
/// how often its commit failed with the outcome unknown (a lost
/// acknowledgement).
#[derive(Default)]
struct Tally {
    runs: AtomicU64,
    commit_unknown: AtomicU64,
}

impl Tally {
    fn record<T>(&self, result: &Result<Outcome<T>, Error>) {
        self.runs.fetch_add(1, Ordering::Relaxed);
        if let Err(Error::CommitUnknown(_)) = result {
            self.commit_unknown.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A relay for `h`, with settings for a short run: small batches, quick
/// polling and back-off. The lease is the default (30 s): a message that
/// waited for its lease to expire would stretch the drain by that much.
/// Its progress hook moves `bar` on by each message settled for good
/// (`success` or dead-lettered), whichever relay settles it.
fn relay_for(
    h: Handler,
    pool: AnyPool,
    n: usize,
    opts: &Args,
    tally: Arc<Tally>,
    bar: ProgressBar,
) -> Relay<Any> {
    let relay = Relay::new(pool)
        .on_settled(move |s| {
            if s.settlement.is_final() {
                bar.inc(1);
            }
        })
        .owner(format!("{}-relay-{n}", h.tables()))
        .batch_size(16)
        .concurrency(opts.concurrency)
        .poll_interval(Duration::from_millis(20))
        .backoff(Duration::from_millis(20), Duration::from_millis(500))
        .max_attempts(10);
    match h {
        // `d.source()`: the handler marks the message in its transaction.
        Handler::Idempotent => relay.route(h.topic(), move |d, msg: DeductCoupon| {
            let tally = tally.clone();
            async move {
                let result = deduct_coupon(d.source(), &msg).await;
                tally.record(&result);
                result
            }
        }),
        Handler::FaultVersion => relay.route(h.topic(), move |d, msg: DeductCoupon| {
            let tally = tally.clone();
            async move {
                let result = consume_coupon_msg_fault_version(&d, &msg).await;
                tally.record(&result);
                result
            }
        }),
    }
}

/// What one handler's run produced, as printed and as JSON.
#[derive(Debug, Default, Serialize)]
pub(super) struct Report {
    pub(super) handler: &'static str,
    pub(super) orders: i64,
    /// Outbox rows: orders plus producer retries.
    pub(super) messages: i64,
    /// Attempts recorded in the outbox (each claim is one).
    pub(super) deliveries: i64,
    /// Times the handler ran.
    pub(super) handler_runs: u64,
    /// Attempts answered `Executed` / `Duplicate` (the relays' counters).
    pub(super) executed: u64,
    pub(super) duplicates: u64,
    /// Failed attempts put back for a retry.
    pub(super) retried: u64,
    /// Failed attempts whose message was already `success` (the commit had
    /// landed): the relay leaves it alone.
    pub(super) failed_after_commit: u64,
    /// Claimed messages whose previous lease had expired (each waited out
    /// a whole lease).
    pub(super) reclaimed: u64,
    /// Acknowledgements lost on this handler's connections (on SQLite:
    /// on its handler commits and its relays' claims).
    pub(super) lost_acks: u64,
    /// … of which on the handler's own commit.
    pub(super) lost_acks_on_handler_commit: u64,
    /// … of which on the relays' claims of messages (a lost claim).
    pub(super) lost_acks_on_claims: u64,
    /// Messages of lost claims read back and delivered at once.
    pub(super) recovered: u64,
    /// Messages by attempts used: attempts → messages.
    pub(super) attempts_histogram: BTreeMap<i32, i64>,
    /// Messages with more than 2 attempts and no handler failure recorded
    /// (`last_error` empty): attempts burnt by the relay itself.
    pub(super) over_two_attempts_without_failure: i64,
    pub(super) ledger_rows: i64,
    pub(super) double_deductions: i64,
    pub(super) lost_deductions: i64,
    pub(super) dead_lettered: i64,
    /// Messages still pending when the run stopped (0 unless timed out).
    pub(super) pending: i64,
    pub(super) elapsed_s: f64,
    pub(super) messages_per_s: f64,
}

/// One handler being drained: its relays, their lossy connections, and
/// its progress.
pub(super) struct Drain {
    h: Handler,
    messages: i64,
    /// On a server, this handler's own proxy; on SQLite, `None` (the
    /// process-wide `testing` hook).
    proxy: Option<FaultProxy>,
    tally: Arc<Tally>,
    /// The relays (kept for their counters) and their running tasks.
    relays: Vec<(Relay<Any>, RelayHandle)>,
    pools: Vec<AnyPool>,
    bar: ProgressBar,
    started: Instant,
    /// Set when nothing of the topic is pending any more.
    elapsed: Option<Duration>,
}

impl Drain {
    /// Starts `opts.relays` relays on `h`'s topic, as several instances of
    /// the consumer would run, each with its own pool. On a server their
    /// connections go through a fault proxy.
    pub(super) async fn start(
        url: &str,
        dialect: Dialect,
        h: Handler,
        messages: i64,
        opts: &Args,
        lost_ack_rate: f64,
        bars: &MultiProgress,
    ) -> Result<Drain, BoxError> {
        let proxy = match dialect {
            Dialect::Sqlite => None,
            _ => Some(FaultProxy::for_url(url, lost_ack_rate).await?),
        };
        let relay_url = proxy
            .as_ref()
            .map_or_else(|| url.to_owned(), |p| p.url(url));
        let tally = Arc::new(Tally::default());
        let bar = bars.add(progress_bar(h, messages));
        let started = Instant::now();
        let mut relays = Vec::new();
        let mut pools = Vec::new();
        for n in 1..=opts.relays {
            let size = opts.concurrency as u32 + 2;
            let pool = connect_with_spares(&relay_url, size, size).await?;
            let relay = relay_for(h, pool.clone(), n, opts, tally.clone(), bar.clone());
            relays.push((relay.clone(), relay.spawn()));
            pools.push(pool);
        }
        Ok(Drain {
            h,
            messages,
            proxy,
            tally,
            relays,
            pools,
            bar,
            started,
            elapsed: None,
        })
    }

    /// Acknowledgements lost so far on this handler's connections (on
    /// SQLite, whose hook is process-wide: on its handler commits and its
    /// relays' claims of messages).
    fn lost_acks(&self) -> u64 {
        match &self.proxy {
            Some(proxy) => proxy.acks_dropped(),
            None => {
                self.tally.commit_unknown.load(Ordering::Relaxed)
                    + self
                        .relays
                        .iter()
                        .map(|(r, _)| r.stats().lost_claims())
                        .sum::<u64>()
            }
        }
    }

    /// Updates the lost acknowledgements shown (the relays' hook moves the
    /// bar); true once every message is settled (delivered, or
    /// dead-lettered), as the database says.
    pub(super) async fn poll(
        &mut self,
        direct: &AnyPool,
        dialect: Dialect,
    ) -> Result<bool, sqlx::Error> {
        if self.elapsed.is_some() {
            return Ok(true);
        }
        let settled: i64 = sqlx::query_scalar(sql(
            dialect,
            "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status <> 'pending'",
        ))
        .bind(self.h.topic())
        .fetch_one(direct)
        .await?;
        self.bar
            .set_message(format!("{} lost acks", self.lost_acks()));
        if settled < self.messages {
            return Ok(false);
        }
        self.elapsed = Some(self.started.elapsed());
        // Idle relays still claim, and commit, every poll: stop losing
        // acknowledgements that would only inflate the count.
        if let Some(proxy) = &self.proxy {
            proxy.set_drop_fraction(0.0);
        }
        self.bar.finish();
        Ok(true)
    }

    /// Stops the relays, all at once (each finishes the messages it has in
    /// hand), and counts the result.
    pub(super) async fn finish(
        self,
        direct: &AnyPool,
        dialect: Dialect,
        orders: i64,
    ) -> Result<Report, BoxError> {
        let elapsed = self.elapsed.unwrap_or_else(|| self.started.elapsed());
        let mut stopping = tokio::task::JoinSet::new();
        let mut relays = Vec::new();
        for (relay, running) in self.relays {
            stopping.spawn(running.shutdown());
            relays.push(relay);
        }
        while stopping.join_next().await.is_some() {}
        for pool in self.pools {
            pool.close().await;
        }
        self.bar.finish();

        let mut r = Report {
            handler: self.h.title(),
            orders,
            handler_runs: self.tally.runs.load(Ordering::Relaxed),
            lost_acks_on_handler_commit: self.tally.commit_unknown.load(Ordering::Relaxed),
            elapsed_s: elapsed.as_secs_f64(),
            ..Report::default()
        };
        for relay in &relays {
            let s = relay.stats();
            r.executed += s.executed();
            r.duplicates += s.duplicates();
            r.retried += s.retried();
            r.failed_after_commit += s.landed();
            r.reclaimed += s.reclaimed();
            r.lost_acks_on_claims += s.lost_claims();
            r.recovered += s.recovered();
        }
        r.lost_acks = match &self.proxy {
            Some(proxy) => proxy.acks_dropped(),
            None => r.lost_acks_on_handler_commit + r.lost_acks_on_claims,
        };
        count_damage(direct, dialect, self.h, &mut r).await?;
        r.messages_per_s = (r.messages - r.pending) as f64 / r.elapsed_s;
        Ok(r)
    }
}

/// Counts, in the database, what the deliveries left behind.
async fn count_damage(
    pool: &AnyPool,
    dialect: Dialect,
    h: Handler,
    r: &mut Report,
) -> Result<(), BoxError> {
    // The messages: status, attempts, and the coupon each one is about.
    let rows: Vec<(String, String, i32, Option<String>)> = sqlx::query_as(sql(
        dialect,
        "SELECT payload, status, attempts, last_error FROM idem_outbox WHERE topic = ?",
    ))
    .bind(h.topic())
    .fetch_all(pool)
    .await?;
    // coupon -> whether every message about it was dead-lettered
    let mut all_dead: HashMap<i64, bool> = HashMap::new();
    for (payload, status, attempts, last_error) in &rows {
        let msg: DeductCoupon = serde_json::from_str(payload)?;
        r.messages += 1;
        r.deliveries += i64::from(*attempts);
        *r.attempts_histogram.entry(*attempts).or_default() += 1;
        if *attempts > 2 && last_error.is_none() {
            r.over_two_attempts_without_failure += 1;
        }
        match status.as_str() {
            "failed" => r.dead_lettered += 1,
            "pending" => r.pending += 1,
            _ => {}
        }
        *all_dead.entry(msg.coupon_id).or_insert(true) &= status == "failed";
    }

    r.ledger_rows = sqlx::query_scalar(table_sql(dialect, h, "SELECT COUNT(*) FROM {t}_deduction"))
        .fetch_one(pool)
        .await?;
    r.double_deductions = sqlx::query_scalar(table_sql(
        dialect,
        h,
        "SELECT COUNT(*) FROM (SELECT coupon_id FROM {t}_deduction \
         GROUP BY coupon_id HAVING COUNT(*) > 1) AS twice",
    ))
    .fetch_one(pool)
    .await?;

    // Lost: a coupon with no ledger row although not all of its messages
    // were dead-lettered.
    let deducted: HashSet<i64> = sqlx::query_scalar(table_sql(
        dialect,
        h,
        "SELECT DISTINCT coupon_id FROM {t}_deduction",
    ))
    .fetch_all(pool)
    .await?
    .into_iter()
    .collect();
    let coupons: Vec<i64> = sqlx::query_scalar(table_sql(dialect, h, "SELECT id FROM {t}_coupon"))
        .fetch_all(pool)
        .await?;
    r.lost_deductions = coupons
        .iter()
        .filter(|c| !deducted.contains(c) && !all_dead.get(c).copied().unwrap_or(false))
        .count() as i64;
    Ok(())
}

fn progress_bar(h: Handler, messages: i64) -> ProgressBar {
    let bar = ProgressBar::new(messages as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>14} [{bar:32}] {pos:>5}/{len} messages settled, {msg} ({elapsed})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(h.title());
    bar.set_message("0 lost acks");
    bar
}

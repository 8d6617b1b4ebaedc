//! # Benchmark: idem's Kafka consumer against a plain rdkafka consumer
//!
//! Records per second through two consumers of the same records, each
//! deducting coupons on PostgreSQL, side by side in one run:
//!
//! - **idem**: [`idem_runtime::kafka::Consumer`] running an
//!   `#[idempotent(strategy = state_machine)]` handler: the coupon read
//!   under a row lock, one deduction row inserted, `UNUSED` → `USED`, one
//!   transaction; its offset stored once the transaction committed;
//! - **plain rdkafka**: a `StreamConsumer` with the same group settings
//!   (offsets stored by hand after each record's transaction, committed
//!   by librdkafka every second), one task per partition running its
//!   records in order as idem's consumer does, each record the same
//!   `UPDATE … SET status = 'USED' WHERE id = $1 AND status = 'UNUSED'`
//!   and `INSERT` in a transaction of its own, without idem.
//!
//! Each round publishes `--records` records (20,000) over `--partitions`
//! partitions (4) of a fresh topic with idem's `Publisher` (every round's
//! topic before the first is read), then each consumer reads the topic in
//! a consumer group of its own, into tables of its own (`idem_bk_*`),
//! taking turns at going first. A consumer's time runs from its first
//! record's start to its last record's commit (the group join left out).
//! The best of `--rounds` (3) rounds counts; printed: both rates, the
//! ratio idem/plain, and CPU µs per record of this process (the consumer
//! and librdkafka), of the broker, and of the rest of the machine
//! (PostgreSQL, and anything else running). Every round is checked in the
//! database: every coupon `USED` with exactly one deduction, on both
//! sides, and each group's committed offsets at the end of every
//! partition once its consumer stopped, else the benchmark stops with an
//! error.
//!
//! idem's consumer pauses a partition whose worker holds more than its
//! read-ahead (`Consumer::buffer`, 8 MiB); librdkafka drops what it had
//! fetched ahead for a partition it pauses and fetches it again on the
//! resume, so the broker's CPU per record shows whether pauses cost (with
//! a bound of 512 records, they made idem 0.56 of the plain consumer on
//! 5,000 records per partition).
//!
//! Then the duplicate run (`--duplicates`, 5,000; 0 skips it): each record
//! published twice. idem must execute each coupon once and answer
//! `Duplicate` to each second copy (checked in the database); the plain
//! consumer, the control, deducts every second copy again: its double
//! deductions are printed.
//!
//! The broker is a `nisshi` (a Kafka-protocol broker) of the run's own on
//! a free port, in a temporary directory removed at the end (`--brokers`
//! names a running one instead).
//!
//! ```text
//! cargo run --release -p idem-examples --bin bench_kafka
//! cargo run --release -p idem-examples --bin bench_kafka -- --records 5000 --rounds 2 --duplicates 0
//! ```
//!
//! `DATABASE_URL` defaults to `postgres://postgres@127.0.0.1:5432/test`.

mod args;
mod broker;
mod consumers;
mod db;
mod progress;

use args::Args;
use clap::Parser;
use consumers::{Deduct, Run};
use db::Side;
use idem_runtime::kafka::{Publisher, Topology};
use progress::{Measured, Progress};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use std::ops::RangeInclusive;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Publishes awaiting the broker's acknowledgement at once.
const PUBLISH_IN_FLIGHT: usize = 1000;
/// Order ids are the coupon's plus this.
const ORDER_BASE: i64 = 2_000_000_000;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Where the run reads and writes.
struct Bench {
    args: Args,
    brokers: String,
    broker_pid: Option<u32>,
    pool: PgPool,
    /// Names this run's topics and groups.
    tag: String,
}

/// One published topic: its name, its coupons and its records.
struct Topic {
    name: String,
    ids: RangeInclusive<i64>,
    records: usize,
}

async fn run() -> Result<ExitCode, BoxError> {
    let args = Args::parse().check()?;
    idem_examples::bench::warn_if_debug("bench_kafka");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let Some(url) = idem_examples::bench::reachable_postgres().await else {
        return Ok(ExitCode::FAILURE);
    };
    let pool = PgPoolOptions::new()
        .max_connections(args.connections)
        .min_connections(args.connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&url)
        .await?;
    let broker = match &args.brokers {
        Some(_) => None,
        None => Some(broker::Broker::start().await?),
    };
    let brokers = match (&args.brokers, &broker) {
        (Some(b), _) => b.clone(),
        (None, Some(b)) => b.bootstrap(),
        (None, None) => unreachable!("a broker was started"),
    };
    let bench = Bench {
        broker_pid: broker.as_ref().and_then(broker::Broker::pid),
        tag: idem_testkit::unique("idem_bk"),
        args,
        brokers,
        pool,
    };
    println!(
        "Kafka consumer benchmark: {} records over {} partitions per round, {} rounds, \
         broker {} ({}), PostgreSQL {url}",
        bench.args.records,
        bench.args.partitions,
        bench.args.rounds,
        bench.brokers,
        if broker.is_some() {
            "nisshi of this run"
        } else {
            "--brokers"
        },
    );
    println!(
        "load average before the run: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let code = bench.measure().await?;
    drop(broker);
    Ok(code)
}

impl Bench {
    /// The tables, the topics, the rounds, the duplicate run, the summary.
    async fn measure(&self) -> Result<ExitCode, BoxError> {
        db::prepare(&self.pool, self.args.coupons()).await?;
        let (rounds, dup) = self.publish_all().await?;
        let best = self.rounds(&rounds).await?;
        if let Some(dup) = dup {
            self.duplicate_run(&dup).await?;
        }
        summary(&best);
        Ok(ExitCode::SUCCESS)
    }

    /// Declares and fills every round's topic, and the duplicate run's.
    async fn publish_all(&self) -> Result<(Vec<Topic>, Option<Topic>), BoxError> {
        let publisher = Publisher::new(&self.brokers)?.timeout(Duration::from_secs(60))?;
        let n = self.args.records;
        let started = Instant::now();
        let mut rounds = Vec::new();
        for r in 0..self.args.rounds as i64 {
            let ids = r * n + 1..=(r + 1) * n;
            let name = format!("{}_r{}", self.tag, r + 1);
            rounds.push(self.publish(&publisher, name, ids, 1).await?);
        }
        let dup = if self.args.duplicates > 0 {
            let first = n * self.args.rounds as i64 + 1;
            let ids = first..=first + self.args.duplicates - 1;
            let name = format!("{}_dup", self.tag);
            Some(self.publish(&publisher, name, ids, 2).await?)
        } else {
            None
        };
        let records: usize = rounds.iter().chain(&dup).map(|t| t.records).sum();
        let took = started.elapsed();
        println!(
            "published {records} records in {:.1} s ({:.0} records/s, idem's Publisher, acks=all)",
            took.as_secs_f64(),
            records as f64 / took.as_secs_f64()
        );
        Ok((rounds, dup))
    }

    /// `name` declared, then a record per coupon of `ids`, `copies` times
    /// (the copies of a coupon share its message id and its key, so its
    /// partition), each acknowledged by the broker.
    async fn publish(
        &self,
        publisher: &Publisher,
        name: String,
        ids: RangeInclusive<i64>,
        copies: usize,
    ) -> Result<Topic, BoxError> {
        Topology::new(&name)
            .partitions(self.args.partitions)
            .declare(&self.brokers)
            .await?;
        let slots = Arc::new(Semaphore::new(PUBLISH_IN_FLIGHT));
        let mut sends = tokio::task::JoinSet::new();
        for _ in 0..copies {
            for id in ids.clone() {
                let slot = slots.clone().acquire_owned().await?;
                let (p, topic) = (publisher.clone(), name.clone());
                sends.spawn(async move {
                    let payload = serde_json::to_vec(&Deduct {
                        coupon_id: id,
                        order_id: ORDER_BASE + id,
                    })?;
                    let (msg_id, key) = (format!("bk-{id}"), id.to_string());
                    p.publish(&topic, &msg_id, Some(&key), &payload).await?;
                    drop(slot);
                    Ok::<_, BoxError>(())
                });
            }
        }
        while let Some(sent) = sends.join_next().await {
            sent??;
        }
        let records = ids.clone().count() * copies;
        Ok(Topic { name, ids, records })
    }

    /// One consumer over `topic`, in a group of its own.
    async fn consume(
        &self,
        side: Side,
        topic: &Topic,
    ) -> Result<(Measured, Arc<Progress>), BoxError> {
        let run = Run {
            brokers: &self.brokers,
            topic: &topic.name,
            group: format!("{}_{}", topic.name, side_tag(side)),
            pool: &self.pool,
            timeout: Duration::from_secs(self.args.timeout),
        };
        let progress = Arc::new(Progress::new(topic.records, self.broker_pid));
        let measured = match side {
            Side::Idem => consumers::idem(&run, &progress).await?,
            Side::Plain => consumers::plain(&run, &progress).await?,
        };
        consumers::committed_to_end(&self.brokers, &run.group, &topic.name).await?;
        Ok((measured, progress))
    }

    /// The measured rounds; the best of each side.
    async fn rounds(&self, topics: &[Topic]) -> Result<[Measured; 2], BoxError> {
        println!();
        println!(
            "{:<7}{:>16}{:>18}{:>8}{:>22}{:>23}",
            "round",
            "idem records/s",
            "plain records/s",
            "ratio",
            "idem CPU µs/record",
            "plain CPU µs/record"
        );
        let mut best: [Option<Measured>; 2] = [None, None];
        for (r, topic) in topics.iter().enumerate() {
            let order = if r % 2 == 0 {
                [Side::Idem, Side::Plain]
            } else {
                [Side::Plain, Side::Idem]
            };
            let mut this: [Option<Measured>; 2] = [None, None];
            for side in order {
                let (measured, progress) = self.consume(side, topic).await?;
                self.check_once(side, topic, &progress).await?;
                this[side as usize] = Some(measured);
                let b = &mut best[side as usize];
                if b.is_none_or(|b| measured.rate() > b.rate()) {
                    *b = Some(measured);
                }
            }
            let [Some(i), Some(p)] = this else {
                unreachable!("both sides ran")
            };
            println!(
                "{:<7}{:>16.0}{:>18.0}{:>8.2}{:>22.0}{:>23.0}",
                r + 1,
                i.rate(),
                p.rate(),
                i.rate() / p.rate(),
                i.cpu_us()[0],
                p.cpu_us()[0]
            );
        }
        let [Some(i), Some(p)] = best else {
            unreachable!("at least one round")
        };
        for side in [Side::Idem, Side::Plain] {
            let n = topics.iter().map(|t| t.records).sum::<usize>();
            println!(
                "verified {}: {n} coupons USED, one deduction each",
                side.name()
            );
        }
        Ok([i, p])
    }

    /// Every coupon of `topic` `USED` with exactly one deduction, and
    /// (idem) every record executed.
    async fn check_once(
        &self,
        side: Side,
        topic: &Topic,
        progress: &Progress,
    ) -> Result<(), BoxError> {
        let e = db::effects(&self.pool, side, &topic.ids).await?;
        let (executed, duplicates) = progress.outcomes();
        if !e.once() || executed != topic.records || duplicates != 0 {
            return Err(format!(
                "VERIFY FAILED: {} on {}: {} of {} coupons not USED, {} without exactly one \
                 deduction, {} deductions; {executed} records executed, {duplicates} duplicates",
                side.name(),
                topic.name,
                e.unused,
                e.coupons,
                e.not_once,
                e.deductions
            )
            .into());
        }
        Ok(())
    }

    /// Each record published twice: idem acts once per coupon and answers
    /// `Duplicate` to the second copy; the plain consumer (the control)
    /// deducts twice.
    async fn duplicate_run(&self, topic: &Topic) -> Result<(), BoxError> {
        let coupons = topic.ids.clone().count();
        println!();
        println!(
            "duplicates: {coupons} coupons, each record published twice ({} records)",
            topic.records
        );
        let (idem, progress) = self.consume(Side::Idem, topic).await?;
        let e = db::effects(&self.pool, Side::Idem, &topic.ids).await?;
        let (executed, duplicates) = progress.outcomes();
        if !e.once() || executed != coupons || duplicates != coupons {
            return Err(format!(
                "VERIFY FAILED: idem on {}: {} of {} coupons not USED, {} without exactly one \
                 deduction, {} deductions; {executed} executed, {duplicates} duplicates \
                 (expected {coupons} of each)",
                topic.name, e.unused, e.coupons, e.not_once, e.deductions
            )
            .into());
        }
        let (plain, _) = self.consume(Side::Plain, topic).await?;
        let p = db::effects(&self.pool, Side::Plain, &topic.ids).await?;
        println!(
            "idem           {:>7.0} records/s: {executed} executed, {duplicates} Duplicate; \
             verified: every coupon USED, one deduction each",
            idem.rate()
        );
        println!(
            "plain rdkafka  {:>7.0} records/s: {} double deductions of {coupons} coupons \
             ({} deductions; the control)",
            plain.rate(),
            p.doubles(),
            p.deductions
        );
        if p.unused != 0 || p.doubles() != coupons as i64 {
            return Err(format!(
                "the control did not double every coupon: {} doubles of {coupons}, {} unused \
                 (the duplicate run tested nothing)",
                p.doubles(),
                p.unused
            )
            .into());
        }
        println!(
            "ratio idem/plain with duplicates: {:.2}",
            idem.rate() / plain.rate()
        );
        Ok(())
    }
}

fn side_tag(side: Side) -> &'static str {
    match side {
        Side::Idem => "idem",
        Side::Plain => "plain",
    }
}

/// The best round of each side, and the ratio.
fn summary([idem, plain]: &[Measured; 2]) {
    println!();
    println!(
        "best round   idem {:>7.0} records/s   plain rdkafka {:>7.0} records/s",
        idem.rate(),
        plain.rate()
    );
    for (name, m) in [("idem", idem), ("plain rdkafka", plain)] {
        let [client, broker, rest] = m.cpu_us();
        println!(
            "CPU per record ({name}, its best round): client {client:.0} µs, broker {broker:.0} µs, \
             PostgreSQL and the rest {rest:.0} µs"
        );
    }
    println!("ratio idem/plain: {:.2}", idem.rate() / plain.rate());
}

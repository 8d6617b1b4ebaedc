//! What the pgbouncer tests share (`pgbouncer.rs`: idem in
//! transaction-pooling mode; `clusters/pgbouncer_control.rs`: the same
//! workloads without it, the control): a pgbouncer in transaction mode in
//! front of the local PostgreSQL with fewer server connections than the
//! test's pool, the three strategies' handlers, and the workloads with their
//! figures, counted in the database through a direct connection.
//!
//! The mode is process-wide, so the two are test binaries of their own
//! (`pgbouncer.rs` turns it on once for its process; nothing in `clusters/`
//! turns it on).
#![allow(dead_code)]

pub(crate) use super::coupons::CouponState;
pub(crate) use idem_runtime::outbox::Relay;
pub(crate) use idem_runtime::{Error, idempotent, pooler};
pub(crate) use idem_testkit::cluster::pgbouncer::{PgBouncer, PoolMode};
pub(crate) use idem_testkit::ids;
pub(crate) use serde::{Deserialize, Serialize};
pub(crate) use sqlx::{PgPool, Postgres, Transaction};
pub(crate) use std::collections::BTreeMap;
// Not every test binary that includes this module counts atomics.
#[allow(unused_imports)]
pub(crate) use std::sync::atomic::Ordering;
pub(crate) use std::time::{Duration, Instant};

/// pgbouncer's server connections: fewer than the test's pool, so
/// consecutive statements of one client land on different ones.
pub(crate) const SERVER_POOL: u32 = 3;
/// The test's pool through pgbouncer.
pub(crate) const CLIENT_POOL: u32 = 12;

/// pgbouncer, a pool through it and a direct pool (for set-up and counts).
pub(crate) struct Rig {
    pub bouncer: PgBouncer,
    pub pool: PgPool,
    pub direct: PgPool,
}

impl std::fmt::Debug for Rig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rig")
            .field("bouncer", &self.bouncer)
            .finish()
    }
}

/// Starts pgbouncer in transaction mode, or `None` (skipped: pgbouncer not
/// installed or PostgreSQL down; failures with `CI=true`).
pub(crate) async fn rig(test: &str) -> Option<Rig> {
    let direct = idem_testkit::postgres(4).await?;
    let bouncer = PgBouncer::start(test, PoolMode::Transaction, SERVER_POOL)?;
    let mut tx = direct.begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock(77042)")
        .execute(&mut *tx)
        .await
        .expect("lock");
    for stmt in [
        "CREATE TABLE IF NOT EXISTS idem_t_bnc_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
        "CREATE TABLE IF NOT EXISTS idem_t_bnc_deduction (coupon_id BIGINT NOT NULL, msg_id VARCHAR(128) NOT NULL)",
        "CREATE TABLE IF NOT EXISTS idem_t_bnc_notice (user_id BIGINT NOT NULL, msg_id VARCHAR(128) NOT NULL)",
        "CREATE TABLE IF NOT EXISTS idem_t_bnc_paid (serial VARCHAR(64) NOT NULL, amount BIGINT NOT NULL)",
        "CREATE UNIQUE INDEX IF NOT EXISTS uk_idem_t_bnc_paid_serial ON idem_t_bnc_paid (serial)",
    ] {
        sqlx::query(stmt)
            .execute(&mut *tx)
            .await
            .expect("create test table");
    }
    tx.commit().await.expect("commit ddl");
    let pool = bouncer_pool(&bouncer).await;
    Some(Rig {
        bouncer,
        pool,
        direct,
    })
}

/// A new pool of [`CLIENT_POOL`] connections through `bouncer`.
pub(crate) async fn bouncer_pool(bouncer: &PgBouncer) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(CLIENT_POOL)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&bouncer.url())
        .await
        .unwrap_or_else(|e| panic!("connect through pgbouncer: {e}\n{}", bouncer.log_tail(20)))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Deduct {
    pub coupon_id: i64,
    pub msg_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Notice {
    pub msg_id: String,
    pub user_id: i64,
}

#[derive(Debug, Clone)]
pub(crate) struct Payment {
    pub serial: String,
    pub amount: i64,
}

// ---- handlers: the body's own statements follow the mode, the way an
// application written for pgbouncer would (`pooler::persistent()`); in
// the control they are ordinary named statements.

#[idempotent(
    key = "bnc-deduct:{msg.coupon_id}",
    strategy = state_machine,
    table = "idem_t_bnc_coupon",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
pub(crate) async fn deduct(
    tx: &mut Transaction<'_, Postgres>,
    msg: &Deduct,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO idem_t_bnc_deduction (coupon_id, msg_id) VALUES ($1, $2)")
        .persistent(pooler::persistent())
        .bind(msg.coupon_id)
        .bind(&msg.msg_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[idempotent(
    key = "bnc-notice:{msg.msg_id}",
    strategy = record,
    biz_type = "bnc_notice",
    biz_no = msg.user_id,
    ttl = "2d",
)]
pub(crate) async fn notify(
    tx: &mut Transaction<'_, Postgres>,
    msg: &Notice,
) -> Result<i64, sqlx::Error> {
    insert_notice(tx, msg).await?;
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_t_bnc_notice WHERE msg_id = $1")
        .persistent(pooler::persistent())
        .bind(&msg.msg_id)
        .fetch_one(&mut **tx)
        .await
}

async fn insert_notice(
    tx: &mut Transaction<'_, Postgres>,
    msg: &Notice,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO idem_t_bnc_notice (user_id, msg_id) VALUES ($1, $2)")
        .persistent(pooler::persistent())
        .bind(msg.user_id)
        .bind(&msg.msg_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// `notify` with a record that expires at once (the archiver's rows).
#[idempotent(
    key = "bnc-notice-short:{msg.msg_id}",
    strategy = record,
    biz_type = "bnc_notice_short",
    biz_no = msg.user_id,
    ttl = "1s",
)]
pub(crate) async fn notify_short(
    tx: &mut Transaction<'_, Postgres>,
    msg: &Notice,
) -> Result<i64, sqlx::Error> {
    insert_notice(tx, msg).await?;
    Ok(1)
}

#[idempotent(key = "bnc-pay:{p.serial}", strategy = unique_insert, constraint = "uk_idem_t_bnc_paid_serial")]
pub(crate) async fn pay(
    tx: &mut Transaction<'_, Postgres>,
    p: &Payment,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO idem_t_bnc_paid (serial, amount) VALUES ($1, $2)")
        .persistent(pooler::persistent())
        .bind(&p.serial)
        .bind(p.amount)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

// ---- figures -------------------------------------------------------------

/// What a workload did, counted in the database.
#[derive(Debug, Default)]
pub(crate) struct Figures {
    /// Calls made (or messages delivered).
    pub calls: usize,
    /// Entities with more than one effect.
    pub double: usize,
    /// Entities answered as done (a call succeeded, a message `success`)
    /// without their effect.
    pub lost: usize,
    /// Entities no call (or delivery) got done: every call failed.
    pub undone: usize,
    /// Failed calls by error kind.
    pub errors: BTreeMap<String, usize>,
    /// The first error of each kind, for the report.
    pub samples: BTreeMap<String, String>,
}

impl Figures {
    pub(crate) fn error(&mut self, e: &Error) {
        let kind = e.kind().to_string();
        *self.errors.entry(kind.clone()).or_default() += 1;
        self.samples.entry(kind).or_insert_with(|| e.to_string());
    }

    pub(crate) fn failures(&self) -> usize {
        self.double + self.lost + self.undone + self.errors.values().sum::<usize>()
    }

    /// A Config error naming the pooler and the option was among them.
    pub(crate) fn names_the_pooler(&self) -> bool {
        self.samples.get("config").is_some_and(|s| {
            s.contains("pgbouncer") && s.contains("idem_runtime::pooler::transaction_mode")
        })
    }

    pub(crate) fn absorb(&mut self, o: Figures) {
        self.calls += o.calls;
        self.double += o.double;
        self.lost += o.lost;
        self.undone += o.undone;
        for (k, n) in o.errors {
            *self.errors.entry(k).or_default() += n;
        }
        for (k, s) in o.samples {
            self.samples.entry(k).or_insert(s);
        }
    }
}

/// A call's entity (its index) and what it answered (executed or not).
type Answer = (usize, Result<bool, Error>);

/// Per entity: how many of its calls answered `Ok`.
fn tally(figures: &mut Figures, results: Vec<Answer>, entities: usize) -> Vec<usize> {
    let mut ok = vec![0usize; entities];
    for (n, r) in results {
        figures.calls += 1;
        match r {
            Ok(_) => ok[n] += 1,
            Err(e) => figures.error(&e),
        }
    }
    ok
}

/// Per entity its effects, and whether a call answered done: double, lost
/// and undone into `figures`.
fn judge(figures: &mut Figures, ok: &[usize], effects: &[i64]) {
    for (done, n) in ok.iter().zip(effects) {
        if *n > 1 {
            figures.double += 1;
        }
        if *done > 0 && *n == 0 {
            figures.lost += 1;
        }
        if *done == 0 {
            figures.undone += 1;
        }
    }
}

async fn count(direct: &PgPool, q: &'static str, bind: String) -> i64 {
    sqlx::query_scalar(q)
        .bind(bind)
        .fetch_one(direct)
        .await
        .expect("count")
}

/// The three strategies raced: `entities` coupons, notices and payments,
/// each called `dups` times at once (duplicates), all on `pool`.
pub(crate) async fn race_strategies(
    rig: &Rig,
    entities: usize,
    dups: usize,
) -> BTreeMap<&'static str, Figures> {
    let base = ids(entities as i64);
    let coupons: Vec<i64> = (0..entities as i64).map(|i| base + i).collect();
    for c in &coupons {
        sqlx::query("INSERT INTO idem_t_bnc_coupon (id, status) VALUES ($1, 'UNUSED')")
            .bind(c)
            .execute(&rig.direct)
            .await
            .expect("insert coupon");
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(3 * entities * dups));
    let mut tasks = Vec::new();
    for (n, c) in coupons.iter().enumerate() {
        for _ in 0..dups {
            let (pool, b) = (rig.pool.clone(), barrier.clone());
            let msg = Deduct {
                coupon_id: *c,
                msg_id: format!("bnc-m-{c}"),
            };
            let notice = Notice {
                msg_id: format!("bnc-n-{c}"),
                user_id: *c,
            };
            let payment = Payment {
                serial: format!("bnc-{c}"),
                amount: 100,
            };
            tasks.push(tokio::spawn(async move {
                b.wait().await;
                (
                    "state_machine",
                    n,
                    deduct(&pool, &msg).await.map(|o| o.is_executed()),
                )
            }));
            let (pool, b) = (rig.pool.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                b.wait().await;
                (
                    "record",
                    n,
                    notify(&pool, &notice).await.map(|o| o.is_executed()),
                )
            }));
            let (pool, b) = (rig.pool.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                b.wait().await;
                (
                    "unique_insert",
                    n,
                    pay(&pool, &payment).await.map(|o| o.is_executed()),
                )
            }));
        }
    }
    let mut by: BTreeMap<&'static str, Vec<Answer>> = BTreeMap::new();
    for t in tasks {
        let (strategy, n, r) = t.await.expect("call panicked");
        by.entry(strategy).or_default().push((n, r));
    }
    let mut out = BTreeMap::new();
    for (strategy, results) in by {
        let mut f = Figures::default();
        let ok = tally(&mut f, results, entities);
        let mut effects = Vec::with_capacity(entities);
        for c in &coupons {
            effects.push(match strategy {
                "state_machine" => {
                    count(
                        &rig.direct,
                        "SELECT COUNT(*) FROM idem_t_bnc_deduction WHERE msg_id = $1",
                        format!("bnc-m-{c}"),
                    )
                    .await
                }
                "record" => {
                    count(
                        &rig.direct,
                        "SELECT COUNT(*) FROM idem_t_bnc_notice WHERE msg_id = $1",
                        format!("bnc-n-{c}"),
                    )
                    .await
                }
                _ => {
                    count(
                        &rig.direct,
                        "SELECT COUNT(*) FROM idem_t_bnc_paid WHERE serial = $1",
                        format!("bnc-{c}"),
                    )
                    .await
                }
            });
        }
        judge(&mut f, &ok, &effects);
        if strategy == "state_machine" {
            // Every coupon whose deduction landed is USED, and only those.
            for (c, n) in coupons.iter().zip(&effects) {
                let status: String =
                    sqlx::query_scalar("SELECT status FROM idem_t_bnc_coupon WHERE id = $1")
                        .bind(c)
                        .fetch_one(&rig.direct)
                        .await
                        .expect("status");
                if (status == "USED") != (*n > 0) {
                    f.lost += 1;
                }
            }
        }
        out.insert(strategy, f);
    }
    out
}

/// A relay drain's figures.
#[derive(Debug, Default)]
pub(crate) struct Drain {
    pub messages: usize,
    pub success: i64,
    pub dead: i64,
    pub pending: i64,
    pub double: usize,
    pub lost: usize,
    pub executed: u64,
    pub duplicates: u64,
    pub secs: f64,
    /// The first dead letter's reason.
    pub reason: Option<String>,
    /// Dead letters whose reason is a Config error naming pgbouncer and
    /// the option.
    pub config_dead: i64,
    /// Dead letters by the error kind their reason starts with.
    pub dead_by_kind: BTreeMap<String, i64>,
    /// The relay's error, had it ended on its own (its schema check
    /// refused, say).
    pub ended: Option<String>,
}

impl Drain {
    pub(crate) fn failures(&self) -> usize {
        self.double + self.lost + (self.dead + self.pending) as usize
    }
}

async fn by_status(direct: &PgPool, topic: &str, status: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status = $2")
        .bind(topic)
        .bind(status)
        .fetch_one(direct)
        .await
        .expect("count")
}

/// `coupons` coupons, every fifth with its message twice, produced on
/// `produce_on`, drained by a relay on the pool through pgbouncer; waits
/// at most `within` for the outbox to drain.
pub(crate) async fn relay_drain(
    rig: &Rig,
    produce_on: &PgPool,
    coupons: usize,
    within: Duration,
) -> Drain {
    let topic = format!("bnc.drain.{}", ids(1));
    let base = ids(coupons as i64);
    let mut messages = 0;
    for n in 0..coupons as i64 {
        let c = base + n;
        let mut tx = <Postgres as idem_runtime::Backend>::begin(produce_on)
            .await
            .expect("begin");
        sqlx::query("INSERT INTO idem_t_bnc_coupon (id, status) VALUES ($1, 'UNUSED')")
            .persistent(pooler::persistent())
            .bind(c)
            .execute(&mut *tx)
            .await
            .expect("insert coupon");
        let copies = if n % 5 == 0 { 2 } else { 1 };
        for copy in 0..copies {
            let msg = Deduct {
                coupon_id: c,
                msg_id: format!("bnc-r-{c}-{copy}"),
            };
            idem_runtime::outbox::enqueue(
                &mut tx,
                &topic,
                &msg.msg_id,
                &serde_json::to_value(&msg).expect("json"),
            )
            .await
            .expect("enqueue");
            messages += 1;
        }
        tx.commit().await.expect("commit");
    }
    let start = Instant::now();
    let relay = Relay::new(rig.pool.clone())
        .route(topic.clone(), |d, m: Deduct| async move {
            deduct(d.source(), &m).await
        })
        .batch_size(16)
        .concurrency(8)
        .poll_interval(Duration::from_millis(20))
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .spawn();
    while by_status(&rig.direct, &topic, "pending").await > 0
        && start.elapsed() < within
        && relay.status().is_running()
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    let (executed, duplicates) = (relay.stats().executed(), relay.stats().duplicates());
    let ended = match relay.status() {
        idem_runtime::task::TaskStatus::Running => None,
        other => Some(format!("{other:?}")),
    };
    relay.shutdown().await;
    let mut d = Drain {
        messages,
        success: by_status(&rig.direct, &topic, "success").await,
        dead: by_status(&rig.direct, &topic, "failed").await,
        pending: by_status(&rig.direct, &topic, "pending").await,
        executed,
        duplicates,
        secs,
        ended,
        ..Drain::default()
    };
    d.reason = sqlx::query_scalar("SELECT last_error FROM idem_outbox WHERE topic = $1 AND status = 'failed' ORDER BY id LIMIT 1")
        .bind(&topic)
        .fetch_optional(&rig.direct)
        .await
        .expect("reason")
        .flatten();
    d.config_dead = sqlx::query_scalar(
        "SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status = 'failed' \
         AND last_error LIKE 'config:%pgbouncer%idem_runtime::pooler::transaction_mode%'",
    )
    .bind(&topic)
    .fetch_one(&rig.direct)
    .await
    .expect("config dead letters");
    let kinds: Vec<(String, i64)> = sqlx::query_as(
        "SELECT split_part(last_error, ':', 1), COUNT(*) FROM idem_outbox \
         WHERE topic = $1 AND status = 'failed' GROUP BY 1",
    )
    .bind(&topic)
    .fetch_all(&rig.direct)
    .await
    .expect("dead letters by kind");
    d.dead_by_kind = kinds.into_iter().collect();
    // Per coupon: its deductions, and whether one of its messages is
    // marked delivered.
    let rows: Vec<(i64, i64, i64)> = sqlx::query_as(
        "SELECT c.id, \
           (SELECT COUNT(*) FROM idem_t_bnc_deduction x WHERE x.coupon_id = c.id), \
           (SELECT COUNT(*) FROM idem_outbox o WHERE o.topic = $1 AND o.status = 'success' \
              AND o.msg_id LIKE 'bnc-r-' || c.id || '-%') \
         FROM idem_t_bnc_coupon c WHERE c.id >= $2 AND c.id < $3",
    )
    .bind(&topic)
    .bind(base)
    .bind(base + coupons as i64)
    .fetch_all(&rig.direct)
    .await
    .expect("per coupon");
    assert_eq!(rows.len(), coupons);
    for (_, effects, delivered) in rows {
        if effects > 1 {
            d.double += 1;
        }
        if delivered > 0 && effects == 0 {
            d.lost += 1;
        }
    }
    d
}

/// `migrate` twice, each on a pool of its own through pgbouncer (new
/// client connections, as two deployments' start-ups are): the errors.
pub(crate) async fn migrate_twice(rig: &Rig) -> Vec<Error> {
    let mut errors = Vec::new();
    for _ in 0..2 {
        let pool = bouncer_pool(&rig.bouncer).await;
        if let Err(e) = idem_runtime::migrate(&pool).await {
            errors.push(e);
        }
        pool.close().await;
    }
    errors
}

/// `notify` written without pgbouncer in mind: its own statement is an
/// ordinary (named, cached) prepared statement.
#[idempotent(
    key = "bnc-notice-named:{msg.msg_id}",
    strategy = record,
    biz_type = "bnc_notice_named",
    biz_no = msg.user_id,
    ttl = "2d",
)]
pub(crate) async fn notify_named(
    tx: &mut Transaction<'_, Postgres>,
    msg: &Notice,
) -> Result<i64, sqlx::Error> {
    sqlx::query("INSERT INTO idem_t_bnc_notice (user_id, msg_id) VALUES ($1, $2)")
        .bind(msg.user_id)
        .bind(&msg.msg_id)
        .execute(&mut **tx)
        .await?;
    Ok(1)
}

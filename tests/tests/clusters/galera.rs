//! idem on a MariaDB Galera cluster: three nodes the test starts on its own
//! ports (`idem_testkit::cluster::galera::Galera`), every node taking
//! writes. One cluster for the whole module (one test running the
//! scenarios in turn: the start-up is most of the cost).
//!
//! - **Strategies raced across nodes.** Each entity's message is delivered
//!   three times at once, one delivery on each node (the caller retries a
//!   retryable error, as a broker redelivers): `state_machine` (coupon
//!   deduct), `record` (notice), `unique_insert` (payment). Double 0, lost
//!   0, counted in the tables. The control: the same deliveries to a
//!   handler without idem deduct twice or three times.
//! - **Pinned.** The same race with every delivery of an entity sent to one
//!   node (`idem_runtime::shard::Shards` over the nodes' pools, the
//!   entity id as the shard key): the body-run figure drops to about 1.
//! - **A relay per node** draining one outbox, one node SIGKILLed mid-run:
//!   double 0, lost 0, no dead letters; claims, claim conflicts and the
//!   duration printed, with the claim spread off (the control, node 2
//!   killed and rejoined after) and on (node 1 killed, left dead), and
//!   with batched commits (`commit_batch(8)`, node 0 killed and rejoined):
//!   the batch's commit certifies its messages' marks and effects at once.
//! - **One server** (the shared MariaDB, a second test): three relays with
//!   the spread off and on drain the same load; nothing changes that
//!   matters (printed), double 0, lost 0.
//!
//! ## Galera, in short (the figures: `--nocapture`)
//!
//! Galera certifies each transaction's write set against the write sets
//! committed meanwhile on the other nodes; the loser is rolled back with
//! 1213 (a deadlock, retryable). So idem's guarantee holds across nodes:
//! of three deliveries racing on three nodes, one commits and the others
//! fail certification and then, retried, find the effect (`Duplicate`).
//! What it costs: duplicates on different nodes do not wait on each other
//! (row locks are local to a node), so each runs its body before it
//! loses, about three body runs per effect. **Pin an entity to a node**
//! (`Shards` over the nodes' pools, keyed by the entity, with
//! `Delivery::source_on` for a relay's calls; or a partitioned broker queue
//! per node) and its duplicates meet on one
//! node's row locks: they wait, find the effect and skip the body (about
//! one body run per effect). Measured here: `state_machine` and
//! `unique_insert` 1.00 pinned against about 2 spread; `record` about 1.2
//! pinned: its `INSERT IGNORE` holds next-key locks on the unique index of
//! `idem_record`, and a write set from another node inserting a
//! neighbouring key (here consecutive ids routed round-robin) aborts the
//! local transaction holding them (a brute-force abort, 1213), which then
//! runs again; with all the keys of a range on one node it is 1.00 too.
//!
//! Relays: `FOR UPDATE SKIP LOCKED` does not see the other nodes' locks, so
//! relays that all claim the oldest due rows collide on every claim; the
//! relay's claim spread (`Relay::claim_spread`, on by default) starts each
//! claim at a random slice of the due set while there is a backlog, and a
//! claim that still loses a conflict is claimed again at once (counted in
//! `RelayStats::claim_conflicts`, logged at debug).
//!
//! Reads: the pools keep `wsrep_sync_wait = 0` (a read on one node may
//! miss a commit on another for a moment; idem never relies on such a read
//! for correctness: a stale check leads to a write that fails
//! certification). The counts below read through `Galera::synced`
//! (`wsrep_sync_wait = 1`).

use crate::common::coupons::CouponState;
use idem_runtime::outbox::{Relay, RelayHandle};
use idem_runtime::{Error, Outcome, idempotent};
use idem_testkit::cluster::galera::Galera;
use idem_testkit::{concurrently, ids};
use serde::{Deserialize, Serialize};
use sqlx::{MySql, MySqlPool, Transaction};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const NODES: usize = 3;
/// Entities per raced strategy.
const ENTITIES: i64 = 40;
/// Messages per relay run.
const MESSAGES: i64 = 360;

/// Bodies that ran to their end, per handler.
static DEDUCT_BODIES: AtomicUsize = AtomicUsize::new(0);
static NOTICE_BODIES: AtomicUsize = AtomicUsize::new(0);
static PAY_BODIES: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Deduct {
    msg_id: String,
    coupon_id: i64,
}

#[idempotent(
    key = "gal-deduct:{m.msg_id}",
    strategy = state_machine,
    table = "idem_t_gal_coupon",
    id = m.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
async fn deduct(tx: &mut Transaction<'_, MySql>, m: &Deduct) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO idem_t_gal_deduction (coupon_id, msg_id) VALUES (?, ?)")
        .bind(m.coupon_id)
        .bind(&m.msg_id)
        .execute(&mut **tx)
        .await?;
    DEDUCT_BODIES.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// The control: the same body without idem.
async fn deduct_plain(pool: &MySqlPool, m: &Deduct) -> Result<Outcome<()>, Error> {
    sqlx::query("INSERT INTO idem_t_gal_deduction (coupon_id, msg_id) VALUES (?, ?)")
        .bind(m.coupon_id)
        .bind(&m.msg_id)
        .execute(pool)
        .await?;
    Ok(Outcome::Executed(()))
}

#[idempotent(
    key = "gal-notice:{user_id}",
    strategy = record,
    biz_type = "gal-notice",
    biz_no = user_id,
    ttl = "2d",
)]
async fn notify(tx: &mut Transaction<'_, MySql>, user_id: i64) -> Result<i64, sqlx::Error> {
    sqlx::query("INSERT INTO idem_t_gal_notice (user_id) VALUES (?)")
        .bind(user_id)
        .execute(&mut **tx)
        .await?;
    NOTICE_BODIES.fetch_add(1, Ordering::Relaxed);
    Ok(user_id)
}

#[idempotent(key = "gal-pay:{serial}", strategy = unique_insert, constraint = "uk_idem_t_gal_paid_serial")]
async fn pay(tx: &mut Transaction<'_, MySql>, serial: &str) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO idem_t_gal_paid (serial) VALUES (?)")
        .bind(serial)
        .execute(&mut **tx)
        .await?;
    PAY_BODIES.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

async fn setup(cluster: &Galera, pool: &MySqlPool) {
    create_tables(pool).await;
    for i in 0..cluster.size() {
        drop(cluster.synced(i).await);
    }
}

async fn create_tables(pool: &MySqlPool) {
    for stmt in [
        "CREATE TABLE IF NOT EXISTS idem_t_gal_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
        "CREATE TABLE IF NOT EXISTS idem_t_gal_deduction (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
         coupon_id BIGINT NOT NULL, msg_id VARCHAR(128) NOT NULL, KEY (coupon_id))",
        "CREATE TABLE IF NOT EXISTS idem_t_gal_notice (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
         user_id BIGINT NOT NULL, KEY (user_id))",
        "CREATE TABLE IF NOT EXISTS idem_t_gal_paid (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
         serial VARCHAR(64) NOT NULL, UNIQUE KEY uk_idem_t_gal_paid_serial (serial))",
    ] {
        sqlx::query(stmt)
            .execute(pool)
            .await
            .expect("create a test table");
    }
}

/// `n` unused coupons from a fresh id range; returns the first id.
async fn coupons(pool: &MySqlPool, n: i64) -> i64 {
    let first = ids(n);
    let values: Vec<String> = (first..first + n)
        .map(|id| format!("({id}, 'UNUSED')"))
        .collect();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO idem_t_gal_coupon (id, status) VALUES {}",
        values.join(", ")
    )))
    .execute(pool)
    .await
    .expect("insert coupons");
    first
}

/// Runs one delivery as a broker would: again after a retryable error
/// (certification conflicts: 1213). Returns the retries it took.
async fn deliver<F, Fut, T>(call: F) -> usize
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Outcome<T>, Error>>,
{
    let mut retries = 0;
    loop {
        match call().await {
            Ok(_) => return retries,
            Err(e) if e.is_retryable() && retries < 100 => {
                retries += 1;
                let jitter = 1 + (retries * 7 + std::process::id() as usize) % 9;
                tokio::time::sleep(Duration::from_millis(jitter as u64)).await;
            }
            Err(e) => panic!("delivery failed after {retries} retries: {e}"),
        }
    }
}

/// Per entity in `first..first + n`, the count of rows `query` (grouped by
/// entity) finds: (double = extra effects, lost = entities without one).
async fn double_lost(cluster: &Galera, node: usize, query: &str, first: i64, n: i64) -> (i64, i64) {
    let mut conn = cluster.synced(node).await;
    let rows: Vec<(i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(query.to_string()))
        .bind(first)
        .bind(first + n - 1)
        .fetch_all(&mut conn)
        .await
        .expect("count effects");
    let double = rows.iter().map(|(_, c)| (c - 1).max(0)).sum();
    let lost = n - rows.iter().filter(|(_, c)| *c > 0).count() as i64;
    (double, lost)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routing {
    /// The three deliveries of an entity on the three nodes.
    Spread,
    /// Every delivery of an entity on its node (`Shards` keyed by the id).
    Pinned,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handler {
    StateMachine,
    Record,
    UniqueInsert,
    /// The control: `deduct` without idem.
    Plain,
}

#[derive(Debug)]
struct Race {
    double: i64,
    lost: i64,
    body_runs_per_effect: f64,
    retries: usize,
}

/// `ENTITIES` entities, each message delivered `NODES` times at once.
async fn race(cluster: &Galera, pools: &[MySqlPool], handler: Handler, routing: Routing) -> Race {
    let first = match handler {
        Handler::StateMachine | Handler::Plain => coupons(&pools[0], ENTITIES).await,
        Handler::Record | Handler::UniqueInsert => ids(ENTITIES),
    };
    for i in 0..cluster.size() {
        drop(cluster.synced(i).await);
    }
    let bodies = || match handler {
        Handler::StateMachine | Handler::Plain => DEDUCT_BODIES.load(Ordering::Relaxed),
        Handler::Record => NOTICE_BODIES.load(Ordering::Relaxed),
        Handler::UniqueInsert => PAY_BODIES.load(Ordering::Relaxed),
    };
    let before = bodies();
    // One "shard" per node of the same database: pins each entity to a node.
    let shards = idem_runtime::shard::Shards::new(pools.to_vec()).expect("shards");
    let next = AtomicUsize::new(0);
    let calls = NODES * ENTITIES as usize;
    let retries = concurrently(calls, || {
        let n = next.fetch_add(1, Ordering::Relaxed);
        let id = first + (n / NODES) as i64;
        let node = match routing {
            Routing::Spread => n % NODES,
            Routing::Pinned => shards.shard_of(&id).expect("shard"),
        };
        let pool = pools[node].clone();
        async move {
            let msg = Deduct {
                msg_id: format!("gal-{id}"),
                coupon_id: id,
            };
            match handler {
                Handler::StateMachine => deliver(|| deduct(&pool, &msg)).await,
                Handler::Plain => deliver(|| deduct_plain(&pool, &msg)).await,
                Handler::Record => deliver(|| notify(&pool, id)).await,
                Handler::UniqueInsert => {
                    let serial = id.to_string();
                    deliver(|| pay(&pool, &serial)).await
                }
            }
        }
    })
    .await;
    let query = match handler {
        Handler::StateMachine | Handler::Plain => {
            "SELECT coupon_id, COUNT(*) FROM idem_t_gal_deduction WHERE coupon_id BETWEEN ? AND ? GROUP BY coupon_id"
        }
        Handler::Record => {
            "SELECT user_id, COUNT(*) FROM idem_t_gal_notice WHERE user_id BETWEEN ? AND ? GROUP BY user_id"
        }
        Handler::UniqueInsert => {
            "SELECT CAST(serial AS SIGNED), COUNT(*) FROM idem_t_gal_paid \
             WHERE CAST(serial AS SIGNED) BETWEEN ? AND ? GROUP BY serial"
        }
    };
    let (double, lost) = double_lost(cluster, 0, query, first, ENTITIES).await;
    let runs = bodies() - before;
    let effects = (ENTITIES - lost + double).max(1);
    let race = Race {
        double,
        lost,
        body_runs_per_effect: if handler == Handler::Plain {
            f64::NAN
        } else {
            runs as f64 / effects as f64
        },
        retries: retries.iter().sum(),
    };
    eprintln!(
        "galera race {handler:?} {routing:?}: entities={ENTITIES} deliveries={calls} double={} lost={} \
         body_runs_per_effect={:.2} retried_conflicts={}",
        race.double, race.lost, race.body_runs_per_effect, race.retries
    );
    race
}

#[derive(Debug, Default)]
struct RelayRun {
    claimed: u64,
    claim_conflicts: u64,
    reclaimed: u64,
    executed: u64,
    duplicates: u64,
    dead_lettered: u64,
    double: i64,
    lost: i64,
    body_runs_per_effect: f64,
    secs: f64,
    /// Claim conflicts and claimed messages before the node was killed.
    conflicts_before_kill: u64,
    claimed_before_kill: u64,
    /// The nodes' certification failures and brute-force aborts (all
    /// transactions, not only claims) before the kill.
    cert_before_kill: u64,
    bf_before_kill: u64,
}

/// The nodes' local certification failures and brute-force aborts (a
/// local transaction rolled back for a replicated write set that needed
/// its locks), summed over the running nodes.
fn galera_aborts(cluster: &Galera) -> (u64, u64) {
    tokio::task::block_in_place(|| {
        (
            cluster.status_sum("wsrep_local_cert_failures"),
            cluster.status_sum("wsrep_local_bf_aborts"),
        )
    })
}

/// Outbox messages of `topic` with `status`, read on `node`.
async fn by_status(cluster: &Galera, node: usize, topic: &str, status: &str) -> i64 {
    let mut conn = cluster.synced(node).await;
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = ?")
        .bind(topic)
        .bind(status)
        .fetch_one(&mut conn)
        .await
        .expect("count outbox")
}

/// A relay per node drains `MESSAGES` messages; node `kill` is SIGKILLed
/// once a third of them are done (and restarted after the run when
/// `restart`).
/// `MESSAGES` new coupons and a deduction message for each, in one
/// transaction; returns the first coupon id.
async fn enqueue_deductions(pool: &MySqlPool, topic: &str, prefix: &str) -> i64 {
    let first = coupons(pool, MESSAGES).await;
    let mut tx = pool.begin().await.expect("begin");
    for id in first..first + MESSAGES {
        let msg = Deduct {
            msg_id: format!("{prefix}-{id}"),
            coupon_id: id,
        };
        idem_runtime::outbox::enqueue(
            &mut tx,
            topic,
            &msg.msg_id,
            &serde_json::to_value(&msg).expect("json"),
        )
        .await
        .expect("enqueue");
    }
    tx.commit().await.expect("commit the outbox");
    first
}

/// The model checks the relays' trace of `topic` (a node killed under
/// them: its claims' last statements may be unreported), and the result
/// is reported, not asserted: across three nodes, the order of the trace
/// comes from client-side times, which a claim answered late by its node
/// can leave out of order (seen once in four runs: a claim of attempt 1
/// placed after the row's attempt 2). Asserting needs the database's own
/// order (a sequence written in each statement's transaction).
async fn conforms(cluster: &Galera, node: usize, topic: &str, commit_batch: usize) {
    let mut events = idem_runtime::testing::trace::take_topic(topic);
    idem_runtime::testing::trace::sort(&mut events);
    let events = idem_model::trace::Event::from_values(&events).unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM idem_outbox WHERE topic = ?")
        .bind(topic)
        .fetch_all(&mut cluster.synced(node).await)
        .await
        .expect("ids");
    let config = idem_model::trace::TraceConfig {
        max_attempts: 50,
        messages: Some(ids),
        complete: true,
        killed: true,
    };
    match idem_model::trace::check(&events, &config) {
        Ok(report) => eprintln!(
            "galera {topic} (commit_batch={commit_batch}): the trace conforms: {report:?}"
        ),
        Err(v) => eprintln!(
            "galera {topic} (commit_batch={commit_batch}): reported, not asserted: the model refuses: {v}"
        ),
    }
}

async fn relay_run(
    cluster: &Galera,
    pools: &[MySqlPool],
    spread: u32,
    commit_batch: usize,
    kill: usize,
    restart: bool,
) -> RelayRun {
    let topic = format!("gal.relay.spread{spread}.batch{commit_batch}");
    let watcher = (kill + 1) % NODES;
    let first = enqueue_deductions(&pools[0], &topic, "gal-relay").await;
    for i in 0..cluster.size() {
        drop(cluster.synced(i).await);
    }
    let before = DEDUCT_BODIES.load(Ordering::Relaxed);
    // The relays' protocol events, for the conformance check.
    idem_runtime::testing::trace::start();
    let (cert0, bf0) = galera_aborts(cluster);
    let start = Instant::now();
    let relays: Vec<RelayHandle> = pools
        .iter()
        .enumerate()
        .map(|(i, pool)| {
            Relay::new(pool.clone())
                .owner(format!("gal-s{spread}-n{i}"))
                .route(topic.clone(), |d, m: Deduct| async move {
                    deduct(d.source(), &m).await
                })
                .batch_size(16)
                .concurrency(8)
                .lease(Duration::from_secs(3))
                .poll_interval(Duration::from_millis(50))
                .backoff(Duration::from_millis(100), Duration::from_secs(1))
                .max_attempts(50)
                .claim_spread(spread)
                .commit_batch(commit_batch)
                .spawn()
        })
        .collect();
    let stats = |relays: &[RelayHandle]| {
        let sum = |f: fn(&idem_runtime::outbox::RelayStats) -> u64| {
            relays.iter().map(|r| f(r.stats())).sum::<u64>()
        };
        RelayRun {
            claimed: sum(|s| s.claimed()),
            claim_conflicts: sum(|s| s.claim_conflicts()),
            reclaimed: sum(|s| s.reclaimed()),
            executed: sum(|s| s.executed()),
            duplicates: sum(|s| s.duplicates()),
            dead_lettered: sum(|s| s.dead_lettered()),
            ..RelayRun::default()
        }
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut killed = false;
    let (mut conflicts_before_kill, mut claimed_before_kill) = (0, 0);
    let (mut cert_before_kill, mut bf_before_kill) = (0, 0);
    loop {
        let done = by_status(cluster, watcher, &topic, "success").await;
        if done >= MESSAGES {
            break;
        }
        if !killed && done >= MESSAGES / 3 {
            let s = stats(&relays);
            (conflicts_before_kill, claimed_before_kill) = (s.claim_conflicts, s.claimed);
            let (c, b) = galera_aborts(cluster);
            (cert_before_kill, bf_before_kill) = (c - cert0, b - bf0);
            cluster.kill9(kill);
            killed = true;
            eprintln!(
                "galera relay spread={spread}: node {kill} SIGKILLed with {done}/{MESSAGES} done"
            );
        }
        // A guard against a hang, not a timed assertion.
        assert!(
            Instant::now() < deadline,
            "relay run spread={spread}: {done}/{MESSAGES} done after 90 s: {:?}",
            stats(&relays)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    assert!(killed, "the node was killed mid-run");
    let mut run = stats(&relays);
    let t = Instant::now();
    for (i, r) in relays.into_iter().enumerate() {
        if i == kill {
            // Its node is gone (the application server with it, say): its
            // deliveries in flight fail on their own; not waited for.
            drop(r);
        } else {
            r.shutdown().await;
        }
    }
    eprintln!(
        "galera relay spread={spread}: relays shut down in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    run.conflicts_before_kill = conflicts_before_kill;
    run.claimed_before_kill = claimed_before_kill;
    run.cert_before_kill = cert_before_kill;
    run.bf_before_kill = bf_before_kill;
    if restart {
        let t = Instant::now();
        tokio::task::block_in_place(|| cluster.restart(kill));
        eprintln!(
            "galera: node {kill} rejoined in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    let (double, lost) = double_lost(
        cluster,
        watcher,
        "SELECT coupon_id, COUNT(*) FROM idem_t_gal_deduction WHERE coupon_id BETWEEN ? AND ? GROUP BY coupon_id",
        first,
        MESSAGES,
    )
    .await;
    run.double = double;
    run.lost = lost;
    run.secs = secs;
    run.body_runs_per_effect = (DEDUCT_BODIES.load(Ordering::Relaxed) - before) as f64
        / (MESSAGES - lost + double).max(1) as f64;
    assert_eq!(
        by_status(cluster, watcher, &topic, "failed").await,
        0,
        "no dead letters"
    );
    assert_eq!(by_status(cluster, watcher, &topic, "pending").await, 0);
    conforms(cluster, watcher, &topic, commit_batch).await;
    eprintln!(
        "galera relay per node, node {kill} killed mid-run, claim_spread={spread} commit_batch={commit_batch}: messages={MESSAGES} double={} lost={} \
         dead_lettered={} claims={} claim_conflicts={} (before the kill: {} in {} claims; \
         Galera certification failures {}, brute-force aborts {}) reclaimed={} executed={} duplicates={} \
         body_runs_per_effect={:.2} duration={:.1}s",
        run.double,
        run.lost,
        run.dead_lettered,
        run.claimed,
        run.claim_conflicts,
        run.conflicts_before_kill,
        run.claimed_before_kill,
        run.cert_before_kill,
        run.bf_before_kill,
        run.reclaimed,
        run.executed,
        run.duplicates,
        run.body_runs_per_effect,
        run.secs
    );
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn galera_three_nodes_strategies_and_relays() {
    let began = Instant::now();
    let Some(cluster) = Galera::start(NODES).await else {
        return;
    };
    let mut pools = Vec::new();
    for i in 0..NODES {
        pools.push(cluster.pool(i, 24).await);
    }
    setup(&cluster, &pools[0]).await;

    // The control: without idem, the racing deliveries all take effect.
    let plain = race(&cluster, &pools, Handler::Plain, Routing::Spread).await;
    assert_eq!(
        plain.double,
        2 * ENTITIES,
        "the control deducts once per delivery"
    );

    for handler in [
        Handler::StateMachine,
        Handler::Record,
        Handler::UniqueInsert,
    ] {
        let spread = race(&cluster, &pools, handler, Routing::Spread).await;
        let pinned = race(&cluster, &pools, handler, Routing::Pinned).await;
        for r in [&spread, &pinned] {
            assert_eq!((r.double, r.lost), (0, 0), "{handler:?}: {r:?}");
        }
        // Pinned duplicates meet on one node's row locks and skip the body.
        assert!(
            pinned.body_runs_per_effect < spread.body_runs_per_effect,
            "{handler:?}: pinned {pinned:?}, spread {spread:?}"
        );
    }

    // The relays, the claim spread off (the control) then on.
    let off = relay_run(&cluster, &pools, 1, 1, 2, true).await;
    // Batched commits (8 messages a commit), node 0 killed mid-run.
    let batched = relay_run(&cluster, &pools, 8, 8, 0, true).await;
    let on = relay_run(&cluster, &pools, 8, 1, 1, false).await;
    for r in [&off, &batched, &on] {
        assert_eq!((r.double, r.lost, r.dead_lettered), (0, 0, 0), "{r:?}");
    }
    // The control provokes claim conflicts (relays on three nodes claiming
    // the same oldest rows); each was claimed again at once, and nothing
    // was lost.
    assert!(
        off.claim_conflicts > 0,
        "the control provoked no claim conflict: {off:?}"
    );
    eprintln!(
        "galera claim conflicts per run: spread off {} (of {} claims; {} of {} before the kill), \
         spread 8 {} (of {} claims; {} of {} before the kill)",
        off.claim_conflicts,
        off.claimed,
        off.conflicts_before_kill,
        off.claimed_before_kill,
        on.claim_conflicts,
        on.claimed,
        on.conflicts_before_kill,
        on.claimed_before_kill
    );
    eprintln!(
        "galera: cluster start {:.1} s, whole test {:.1} s",
        cluster.started_in().as_secs_f64(),
        began.elapsed().as_secs_f64()
    );
}

/// The claim spread on one server (the shared MariaDB): three relays
/// (three pools, as three application servers) drain `MESSAGES` messages
/// with the spread off, then on. `SKIP LOCKED` already keeps them apart
/// there: the spread changes nothing that matters (printed: conflicts and
/// duration); double 0, lost 0 both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_server_claim_spread_changes_nothing_that_matters() {
    let Some(first_pool) = idem_testkit::mysql(16).await else {
        return;
    };
    create_tables(&first_pool).await;
    let mut pools = vec![first_pool];
    for _ in 1..NODES {
        pools.push(idem_testkit::mysql(16).await.expect("a second pool"));
    }
    for spread in [1, 8] {
        let topic = idem_testkit::unique(&format!("gal.single.spread{spread}"));
        let first = enqueue_deductions(&pools[0], &topic, "gal-single").await;
        let start = Instant::now();
        let relays: Vec<RelayHandle> = pools
            .iter()
            .enumerate()
            .map(|(i, pool)| {
                Relay::new(pool.clone())
                    .owner(format!("gal-single-s{spread}-r{i}-{}", std::process::id()))
                    .route(topic.clone(), |d, m: Deduct| async move {
                        deduct(d.source(), &m).await
                    })
                    .batch_size(16)
                    .concurrency(8)
                    .poll_interval(Duration::from_millis(50))
                    .claim_spread(spread)
                    .spawn()
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let done: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'success'",
            )
            .bind(&topic)
            .fetch_one(&pools[0])
            .await
            .expect("count");
            if done >= MESSAGES {
                break;
            }
            // A guard against a hang, not a timed assertion.
            assert!(
                Instant::now() < deadline,
                "spread={spread}: {done}/{MESSAGES} after 60 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let secs = start.elapsed().as_secs_f64();
        let conflicts: u64 = relays.iter().map(|r| r.stats().claim_conflicts()).sum();
        let claimed: u64 = relays.iter().map(|r| r.stats().claimed()).sum();
        for r in relays {
            r.shutdown().await;
        }
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT coupon_id, COUNT(*) FROM idem_t_gal_deduction WHERE coupon_id BETWEEN ? AND ? GROUP BY coupon_id",
        )
        .bind(first)
        .bind(first + MESSAGES - 1)
        .fetch_all(&pools[0])
        .await
        .expect("count effects");
        let double: i64 = rows.iter().map(|(_, c)| (c - 1).max(0)).sum();
        let lost = MESSAGES - rows.len() as i64;
        eprintln!(
            "single MariaDB, 3 relays, claim_spread={spread}: messages={MESSAGES} double={double} lost={lost} \
             claims={claimed} claim_conflicts={conflicts} duration={secs:.1}s"
        );
        assert_eq!((double, lost), (0, 0));
    }
}

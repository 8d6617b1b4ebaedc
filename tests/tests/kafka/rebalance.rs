//! A member of a consumer group killed mid-run: two members share a
//! topic's four partitions, one a process of its own (`kafka_consumer`)
//! committing its offsets only every 60 s. Once both act, the process is
//! killed with SIGKILL: its partitions move to the other member after the
//! session time-out, which reads again every record the dead member had
//! settled but not committed, and answers `Duplicate` to each. Counted in
//! the database: every coupon used and awarded once, the redelivered
//! records answered `Duplicate`, every offset committed.
//!
//! The control (`--cfg idem_broken`, `Break::SettleFirst`, in the killed
//! process only) stores each offset when the record arrives, before its
//! handler, as an auto-committing consumer does, and commits every
//! 100 ms: the killed member's received-but-unhandled records are
//! committed and lost.

use crate::common::hooks;
use crate::common::kafka::*;
use idem_testkit::cluster::kafka::KafkaBroker;
use std::process::{Child, Command};

const PARTITIONS: i32 = 4;
const MEMBER: &str = env!("CARGO_BIN_EXE_kafka_consumer");

/// Killed on drop, also when the test fails.
struct Member(Child);

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn uses_by(pool: &AnyPool, d: Dialect, owner: &str, coupons: &[i64]) -> i64 {
    sqlx::query_scalar(sql(
        d,
        "SELECT COUNT(*) FROM idem_k_use WHERE owner = ? AND coupon_id BETWEEN ? AND ?",
    ))
    .bind(owner)
    .bind(coupons[0])
    .bind(coupons[coupons.len() - 1])
    .fetch_one(pool)
    .await
    .expect("uses")
}

/// What a run came to.
#[derive(Debug)]
struct Run {
    /// Coupons whose effects never happened.
    lost: usize,
    /// Records the survivor answered `Duplicate` after the kill.
    redelivered: u64,
}

/// The scenario; `settle_first`: the control's process stores each
/// offset before the handler.
async fn member_killed(settle_first: bool) -> Option<Run> {
    let broker = KafkaBroker::start()?;
    let (pool, d) = database("postgres").await?;
    let brokers = broker.bootstrap();
    let t = Topology::new(unique("k_rebalance")).partitions(PARTITIONS);
    t.declare(&brokers).await.expect("declare");
    let coupons = coupons(&pool, d, 600).await;
    let publisher = Publisher::new(&brokers).expect("publisher");
    publish(&publisher, &t.topic, &coupons, 1, |c| Use {
        coupon_id: c,
        slow_ms: 30,
        ..Use::default()
    })
    .await;
    let group = unique("k_rebalance_group");
    let mut process = Command::new(MEMBER);
    process.args([
        brokers.as_str(),
        group.as_str(),
        t.topic.as_str(),
        idem_testkit::postgres_url().as_str(),
        "killed",
    ]);
    if settle_first {
        process.env("IDEM_KAFKA_CONTROL", "settle-first");
    }
    let mut member = Member(process.spawn().expect("start the consumer process"));
    let survivor = consumer(&brokers, &group, &t.topic, &pool, d, "survivor")
        .spawn()
        .await
        .expect("consumer");
    // Both members acting: the group has split the partitions. Then the
    // process settles more records in its assignment, uncommitted. (The
    // control's process commits what it received at once: the survivor
    // may have none of it to act on.)
    wait_for("both members acting", Duration::from_secs(60), || {
        let (pool, coupons) = (&pool, &coupons);
        async move {
            (settle_first || uses_by(pool, d, "survivor", coupons).await > 0)
                && uses_by(pool, d, "killed", coupons).await > 0
        }
    })
    .await;
    let split = uses_by(&pool, d, "killed", &coupons).await;
    wait_for(
        "the process settling records after the split",
        Duration::from_secs(60),
        || {
            let (pool, coupons) = (&pool, &coupons);
            async move { uses_by(pool, d, "killed", coupons).await >= split + 10 }
        },
    )
    .await;
    member.0.kill().expect("SIGKILL");
    member.0.wait().expect("reaped");
    let by_killed = uses_by(&pool, d, "killed", &coupons).await;
    let before = counts(&survivor);
    if !settle_first {
        wait_for(
            "every coupon used and awarded",
            Duration::from_secs(120),
            || {
                let (pool, coupons) = (&pool, &coupons);
                async move { done(pool, d, coupons).await == coupons.len() }
            },
        )
        .await;
    }
    // Every record read by the survivor (or, in the control, skipped).
    until_committed(
        &brokers,
        &group,
        &t.topic,
        PARTITIONS,
        Duration::from_secs(60),
    )
    .await;
    let c = counts(&survivor);
    survivor.shutdown().await.expect("clean shutdown");
    let run = Run {
        lost: coupons.len() - done(&pool, d, &coupons).await,
        redelivered: c.2 - before.2,
    };
    eprintln!(
        "kafka rebalance{}: {} records, {by_killed} settled by the killed member ({} after the split), the survivor (received, executed, duplicates, retried, dead, settle_failed) = {c:?}, {run:?}",
        if settle_first {
            " (control: offsets first)"
        } else {
            ""
        },
        coupons.len(),
        by_killed - split
    );
    if !settle_first {
        assert_once(&pool, d, &coupons).await;
    }
    Some(run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_member_s_records_are_answered_duplicate_by_the_next_owner() {
    let _one = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    let Some(run) = member_killed(false).await else {
        return;
    };
    assert_eq!(run.lost, 0, "{run:?}");
    assert!(
        run.redelivered >= 10,
        "the killed member's uncommitted records were read again and answered Duplicate: {run:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(idem_broken),
    ignore = "a control: needs RUSTFLAGS=\"--cfg idem_broken\" (see .ci/run)"
)]
async fn control_offset_first_loses_the_killed_member_s_records() {
    let _one = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    let Some(run) = member_killed(true).await else {
        return;
    };
    assert!(
        run.lost > 0,
        "offsets stored before the handler lose what the killed member had received: {run:?}"
    );
}

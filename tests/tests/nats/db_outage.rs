//! The consumer's database goes down under load (issue 38): the handler's
//! connections are cut and refused (a `FaultProxy` taken down, as a
//! restart looks from the client) for far longer than the consumer's
//! bound on deliveries (`max_deliver` 2) with its back-off, then come
//! back. A try that failed in the outage is no delivery: it waits in place
//! (the delivery kept with in-progress acks) and runs again, so nothing is
//! dead-lettered and every effect lands once. The control turns the old
//! rule back on (an outage nak'd, counted by the server) and sees dead
//! letters.

use crate::common::hooks;
use crate::common::nats::*;
use idem_testkit::proxy::FaultProxy;
use idem_testkit::wait_for;
use sqlx::postgres::PgPoolOptions;

const N: i64 = 120;

struct Run {
    dead: u64,
    double: i64,
    lost: i64,
    outage_waits: u64,
}

async fn run() -> Option<Run> {
    let (pool, js, table) = servers().await?;
    let base = idem_testkit::postgres_url();
    let proxy = FaultProxy::for_url(&base, 0.0).await.expect("proxy");
    // The handler's pool goes through the proxy; a short acquire time-out
    // so that a refused connection is an error within a second.
    let handler_pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(1))
        .connect(&proxy.url(&base))
        .await
        .expect("pool through the proxy");
    let t = topology(&js, "DBO", |t| {
        t.max_deliver(2).ack_wait(Duration::from_secs(3))
    })
    .await;
    let consumer = Consumer::new(
        js.clone(),
        &t.stream,
        &t.consumer,
        acting(&handler_pool, &table),
    )
    .max_in_flight(8)
    .backoff(Duration::from_millis(20), Duration::from_millis(80))
    .outage_retry(Duration::from_millis(200))
    .dead_letter_subject(&t.dead_letter_subject)
    .spawn()
    .await
    .expect("consumer");
    let first = ids(N);
    let items: Vec<i64> = (first..first + N).collect();
    let (one, two) = items.split_at(items.len() / 2);
    for &i in one {
        publish(&js, &t.subjects[0], &format!("dbo-{i}"), &Job::new(i)).await;
    }
    wait_for(
        "a quarter of the effects",
        Duration::from_secs(60),
        || async { all_effects(&pool, &table).await >= N / 4 },
    )
    .await;
    // The outage: every connection cut, new ones refused, until the
    // handlers have failed in it 40 times (20 times max_deliver) and it
    // has lasted 4 s (beyond ack_wait). The second half arrives meanwhile.
    let failed = |h: &ConsumerHandle| {
        let s = h.stats();
        s.outage_waits() + s.retried() + s.dead_lettered()
    };
    let before = failed(&consumer);
    proxy.set_down(true);
    let down = Instant::now();
    for &i in two {
        publish(&js, &t.subjects[0], &format!("dbo-{i}"), &Job::new(i)).await;
    }
    // (Or, in the control, until every job not yet done is dead.)
    wait_for(
        "the handlers to fail in the outage",
        Duration::from_secs(60),
        || async {
            let (_, lost) = double_and_lost(&pool, &table, &items).await;
            let settled = lost as u64 <= counts(&consumer).4;
            let seen = failed(&consumer) >= before + 40 || settled;
            seen && down.elapsed() >= Duration::from_secs(4)
        },
    )
    .await;
    proxy.set_down(false);
    let back = Instant::now();
    wait_for("every job settled", Duration::from_secs(120), || async {
        let (_, lost) = double_and_lost(&pool, &table, &items).await;
        let (_, _, _, _, dead, _) = counts(&consumer);
        lost as u64 <= dead
    })
    .await;
    let drain = back.elapsed();
    let (received, executed, duplicates, retried, dead, _) = counts(&consumer);
    let outage_waits = consumer.stats().outage_waits();
    consumer.shutdown().await.expect("shutdown");
    let (double, lost) = double_and_lost(&pool, &table, &items).await;
    let dead_stored = stored(&js, &t.dead_letter_stream).await;
    teardown(&js, &t).await;
    drop_table(&pool, &table).await;
    eprintln!(
        "nats consumer, database down {:.1} s: {N} messages, drained {:.1} s after; received {received}, executed {executed}, Duplicate {duplicates}, nak'd {retried}, dead {dead} ({dead_stored} stored), tries waited in place {outage_waits}",
        back.duration_since(down).as_secs_f64(),
        drain.as_secs_f64(),
    );
    Some(Run {
        dead: dead.max(dead_stored),
        double,
        lost,
        outage_waits,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outage_under_a_consumer_dead_letters_nothing_and_acts_once() {
    let _hooks = hooks::shared().await;
    let Some(r) = run().await else { return };
    assert_eq!(r.dead, 0, "dead letters");
    assert_eq!((r.double, r.lost), (0, 0), "(double, lost) effects");
    assert!(
        r.outage_waits > 0,
        "tries waited in place: {}",
        r.outage_waits
    );
}

/// The control: the old rule (an outage counts as a delivery) dead-letters
/// healthy messages in the same run.
#[cfg_attr(
    not(idem_broken),
    ignore = "a control: needs RUSTFLAGS=\"--cfg idem_broken\" (see .ci/run)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_outage_counted_by_a_consumer_dead_letters() {
    let _hooks = hooks::exclusive().await;
    idem_runtime::testing::set_broken_outage_counted(true);
    let r = run().await;
    idem_runtime::testing::set_broken_outage_counted(false);
    let Some(r) = r else { return };
    eprintln!("control: {} dead letters, {} lost", r.dead, r.lost);
    assert!(
        r.dead > 0,
        "the old rule dead-letters messages in the outage"
    );
}

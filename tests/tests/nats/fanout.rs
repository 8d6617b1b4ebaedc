//! One JetStream delivery, several handlers (`Consumer::fan_out`), against
//! the real nats-server and PostgreSQL: a state machine (an item moved
//! from OPEN to DONE) and a record (`act`, one row per effect) subscribed
//! to one consumer. Counted in the database: each subscriber's effect
//! exactly once per item under lost commit acknowledgements (each one a
//! redelivery, on which the subscribers that had committed answer
//! `Duplicate`; producer copies are dropped by the stream's duplicate
//! window, and past it answered by the database, in
//! `nats/end_to_end.rs`); a subscriber failing its first deliveries acts
//! once later while the other acts once; a fan-out without subscribers is
//! refused.
//!
//! Its tests run one at a time, and beside no other test of the binary
//! that commits through idem (`common::hooks`): the lost-acknowledgement
//! hook is process-wide.

use crate::common::hooks;
use crate::common::nats::*;
use idem_runtime::State;

#[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
enum ItemState {
    Open,
    Done,
}

/// The first subscriber: a state machine on `idem_n_item`.
#[idempotent(
    key = "nats-close:{m.stream}:{m.message_id}",
    strategy = state_machine,
    table = "idem_n_item",
    id = job.item,
    from = ItemState::Open,
    to = ItemState::Done,
)]
async fn close(
    tx: &mut Transaction<'_, Postgres>,
    m: &Message,
    job: &Job,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE idem_n_item SET closings = closings + 1 WHERE id = $1")
        .bind(job.item)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn items(pool: &PgPool, n: usize) -> Vec<i64> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS idem_n_item (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL, \
         closings INT NOT NULL DEFAULT 0)",
    )
    .execute(pool)
    .await
    .expect("create table");
    let first = ids(n as i64);
    let items: Vec<i64> = (first..first + n as i64).collect();
    for id in &items {
        sqlx::query("INSERT INTO idem_n_item (id, status) VALUES ($1, 'OPEN')")
            .bind(id)
            .execute(pool)
            .await
            .expect("insert item");
    }
    items
}

/// `(status, closings)` of `item`.
async fn closed(pool: &PgPool, item: i64) -> (String, i32) {
    sqlx::query_as("SELECT status, closings FROM idem_n_item WHERE id = $1")
        .bind(item)
        .fetch_one(pool)
        .await
        .expect("item")
}

/// The two subscribers of `t`'s consumer.
fn consumer(js: &Context, t: &Topology, pool: &PgPool, table: &str) -> Consumer {
    let p = pool.clone();
    Consumer::fan_out(js.clone(), &t.stream, &t.consumer)
        .subscribe("close", move |m: Message, job: Job| {
            let pool = p.clone();
            async move { close(&pool, &m, &job).await }
        })
        .subscribe("act", acting(pool, table))
        .backoff(Duration::from_millis(20), Duration::from_millis(50))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_subscriber_acts_once_under_duplicates_and_lost_acknowledgements() {
    let _one = hooks::exclusive().await;
    let Some((pool, js, table)) = servers().await else {
        return;
    };
    let t = topology(&js, "fanout", |t| t.max_deliver(50)).await;
    let items = items(&pool, 24).await;
    for item in &items {
        publish(&js, &t.subjects[0], &format!("m-{item}"), &Job::new(*item)).await;
    }
    let published = items.len() as u64;
    idem_runtime::testing::set_lost_ack_rate(0.25);
    let running = consumer(&js, &t, &pool, &table)
        .max_in_flight(8)
        .spawn()
        .await
        .expect("consumer");
    until("every delivery acked", Duration::from_secs(30), || {
        let (_, e, d, ..) = counts(&running);
        e + d >= published
    })
    .await;
    idem_runtime::testing::set_lost_ack_rate(0.0);
    let c = counts(&running);
    running.shutdown().await.expect("clean shutdown");
    eprintln!(
        "nats fan-out: (received, executed, duplicates, retried, dead, settle_failed) = {c:?}, lost acks {}",
        idem_runtime::testing::lost_acks()
    );
    for item in &items {
        assert_eq!(
            (
                closed(&pool, *item).await,
                effects(&pool, &table, *item).await
            ),
            (("DONE".to_owned(), 1), 1),
            "item {item}"
        );
    }
    assert_eq!(c.4, 0, "nothing dead-lettered");
    teardown(&js, &t).await;
    drop_table(&pool, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_subscriber_acts_later_and_the_other_acts_once() {
    let _one = hooks::exclusive().await;
    let Some((pool, js, table)) = servers().await else {
        return;
    };
    let t = topology(&js, "fanfail", |t| t.max_deliver(10)).await;
    let items = items(&pool, 5).await;
    for item in &items {
        // `act` fails its first two deliveries (after its write).
        let job = Job {
            fail_until: 2,
            ..Job::new(*item)
        };
        publish(&js, &t.subjects[0], &format!("m-{item}"), &job).await;
    }
    let running = consumer(&js, &t, &pool, &table)
        .spawn()
        .await
        .expect("consumer");
    until("every delivery acked", Duration::from_secs(30), || {
        let (_, e, d, ..) = counts(&running);
        e + d >= items.len() as u64
    })
    .await;
    let c = counts(&running);
    running.shutdown().await.expect("clean shutdown");
    for item in &items {
        assert_eq!(
            closed(&pool, *item).await,
            ("DONE".to_owned(), 1),
            "closed once"
        );
        let delivered: Vec<i32> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT delivered FROM {table} WHERE item = $1"
        )))
        .bind(item)
        .fetch_all(&pool)
        .await
        .expect("effects");
        assert_eq!(delivered, vec![3], "acted once, on its third delivery");
    }
    assert_eq!(c.3, 2 * items.len() as u64, "two naks each: {c:?}");
    assert_eq!(c.4, 0, "nothing dead-lettered");
    teardown(&js, &t).await;
    drop_table(&pool, &table).await;
}

#[tokio::test]
async fn a_fan_out_without_subscribers_is_refused() {
    let Some(js) = server().await else {
        return;
    };
    let e = Consumer::fan_out(js, "IDEM_N_NOBODY", "worker")
        .spawn()
        .await
        .expect_err("a fan-out without subscribers");
    assert!(matches!(e, Error::Config { .. }), "{e:#}");
    assert!(format!("{e:#}").contains("without subscribers"), "{e:#}");
}

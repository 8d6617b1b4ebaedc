//! The producer's side is idempotent, on every backend, against the real
//! servers: the same `(topic, msg_id)` with the same payload answers
//! `Enqueued::Already`, another payload `Error::MessageConflict`, neither
//! breaks the caller's transaction (a unique violation would abort it on
//! PostgreSQL); ids are checked before any SQL, with one limit on every
//! backend; and a producer retrying its transaction through connections
//! that lose commit acknowledgements (PostgreSQL, MariaDB: the fault proxy)
//! ends with exactly one message per id. Every assertion counts rows in the
//! database.

use idem_runtime::Dialect;
use idem_runtime::outbox::{Enqueued, MAX_ID_LEN, enqueue};
use idem_runtime::{Backend, Error};
use idem_testkit::proxy::FaultProxy;
use idem_testkit::{ids, sql};
use serde_json::json;

macro_rules! enqueue_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            use super::*;
            use sqlx::Pool;
            type Db = $db;
            const D: Dialect = $dialect;

            async fn pool() -> Option<Pool<Db>> {
                $pool
            }

            /// `(msg_id, payload)` of `topic`'s messages, by msg_id.
            async fn rows(pool: &Pool<Db>, topic: &str) -> Vec<(String, serde_json::Value)> {
                let rows: Vec<(String, String)> = sqlx::query_as(sql(
                    D,
                    "SELECT msg_id, payload FROM idem_outbox WHERE topic = ? ORDER BY msg_id",
                ))
                .bind(topic.to_string())
                .fetch_all(pool)
                .await
                .expect("rows");
                rows.into_iter()
                    .map(|(m, p)| (m, serde_json::from_str(&p).expect("stored JSON")))
                    .collect()
            }

            #[tokio::test]
            async fn the_same_message_twice_is_already_enqueued_and_one_row() {
                let Some(pool) = pool().await else { return };
                let topic = format!("enq.same.{}", ids(1));
                let mut tx = Db::begin(&pool).await.expect("begin");
                let first = enqueue(&mut tx, &topic, "m-1", &json!({"a": 1, "b": [1, 2]})).await.expect("first");
                assert!(matches!(first, Enqueued::New(_)), "{first:?}");
                // In the same transaction: already there.
                let same_tx = enqueue(&mut tx, &topic, "m-1", &json!({"a": 1, "b": [1, 2]})).await.expect("same tx");
                assert_eq!(same_tx, Enqueued::Already(first.id()));
                tx.commit().await.expect("commit");

                // A retrying producer, another transaction, the keys in
                // another order: the same JSON value.
                let mut tx = Db::begin(&pool).await.expect("begin");
                let again = enqueue(&mut tx, &topic, "m-1", &json!({"b": [1, 2], "a": 1})).await.expect("again");
                assert_eq!(again, Enqueued::Already(first.id()));
                tx.commit().await.expect("commit");
                assert_eq!(rows(&pool, &topic).await, [("m-1".to_string(), json!({"a": 1, "b": [1, 2]}))]);
            }

            #[tokio::test]
            async fn another_payload_is_a_conflict_and_the_transaction_goes_on() {
                let Some(pool) = pool().await else { return };
                let topic = format!("enq.conflict.{}", ids(1));
                let mut tx = Db::begin(&pool).await.expect("begin");
                assert!(enqueue(&mut tx, &topic, "m-1", &json!({"n": 1})).await.expect("first").is_new());
                tx.commit().await.expect("commit");

                let mut tx = Db::begin(&pool).await.expect("begin");
                assert!(enqueue(&mut tx, &topic, "m-2", &json!({"n": 2})).await.expect("before").is_new());
                let e = enqueue(&mut tx, &topic, "m-1", &json!({"n": 99})).await.expect_err("conflict");
                match &e {
                    Error::MessageConflict { topic: t, msg_id } => {
                        assert_eq!((t.as_str(), msg_id.as_str()), (topic.as_str(), "m-1"));
                    }
                    other => panic!("not a MessageConflict: {other:?}"),
                }
                assert!(!e.is_retryable());
                assert_eq!(e.kind(), idem_runtime::ErrorKind::MessageConflict);
                assert!(format!("{e:#}").contains(&topic) && format!("{e:#}").contains("`m-1`"), "{e:#}");
                // A later statement of the same transaction runs and commits.
                assert!(enqueue(&mut tx, &topic, "m-3", &json!({"n": 3})).await.expect("after").is_new());
                tx.commit().await.expect("the caller's transaction commits");
                assert_eq!(
                    rows(&pool, &topic).await,
                    [
                        ("m-1".to_string(), json!({"n": 1})),
                        ("m-2".to_string(), json!({"n": 2})),
                        ("m-3".to_string(), json!({"n": 3})),
                    ]
                );
            }

            #[tokio::test]
            async fn bad_ids_are_rejected_before_any_sql_with_one_limit_everywhere() {
                let Some(pool) = pool().await else { return };
                let topic = format!("enq.bad.{}", ids(1));
                let longest = "x".repeat(MAX_ID_LEN);
                let too_long = "x".repeat(200);
                let two_byte = "é".repeat(MAX_ID_LEN / 2 + 1);
                let long_topic = format!("{topic}.{}", "t".repeat(MAX_ID_LEN));
                let cases: [(&str, &str, &str); 8] = [
                    (&topic, "", "the msg_id is empty"),
                    ("", "m-1", "the topic is empty"),
                    (&topic, "m-1\n", "control character '\\n'"),
                    (&topic, "m\u{0}1", "control character '\\0'"),
                    (&topic, "m\u{7f}", "control character '\\u{7f}'"),
                    (&topic, &too_long, "200 bytes long"),
                    (&topic, &two_byte, "130 bytes long"),
                    (&long_topic, "m-1", "the topic is"),
                ];
                let mut tx = Db::begin(&pool).await.expect("begin");
                for (t, m, why) in cases {
                    let e = enqueue(&mut tx, t, m, &json!({})).await.expect_err(why);
                    assert!(matches!(e, Error::InvalidMessage { .. }), "{why}: {e:?}");
                    assert!(format!("{e:#}").contains(why), "{why}: {e:#}");
                    assert!(!e.is_retryable());
                }
                // Nothing ran: the transaction is usable, and the longest
                // ids are accepted on every backend.
                assert!(enqueue(&mut tx, &topic, &longest, &json!({})).await.expect("128 bytes").is_new());
                let accents = "é".repeat(MAX_ID_LEN / 2);
                assert!(enqueue(&mut tx, &topic, &accents, &json!({})).await.expect("64 × é").is_new());
                tx.commit().await.expect("commit");
                let stored: Vec<String> = rows(&pool, &topic).await.into_iter().map(|(m, _)| m).collect();
                assert_eq!(stored, [longest, accents]);
                for t in ["", long_topic.as_str()] {
                    assert!(rows(&pool, t).await.is_empty());
                }
            }
        }
    };
}

idem_testkit::for_each_backend!(enqueue_tests; postgres(4), mariadb(4) as mysql, sqlite(2));

const IDS: usize = 200;
const LOSS: f64 = 0.25;

/// `IDS` producers' transactions, one message each, through a proxy that
/// drops a quarter of the COMMIT replies; each transaction is retried
/// until it returns Ok, as a producer that cannot tell a lost
/// acknowledgement from a failed commit must. Exactly one message per id,
/// with its payload; every retry after a commit that did land answers
/// `Already`.
async fn producer_retries_through_lost_acks(url: &str) {
    let Some(direct) = idem_testkit::any(url, 2).await else {
        return;
    };
    let proxy = FaultProxy::for_url(url, 0.0).await.expect("proxy");
    let lossy = idem_testkit::any(&proxy.url(url), 4)
        .await
        .expect("lossy pool");
    proxy.set_drop_fraction(LOSS);
    let d = <sqlx::Any as Backend>::pool_dialect(&direct);
    let topic = format!("enq.lossy.{}", ids(1));
    let (mut retries, mut already) = (0, 0);
    for i in 0..IDS {
        let msg_id = format!("m-{i}");
        let payload = json!({"i": i, "topic": topic});
        for attempt in 1.. {
            assert!(attempt <= 50, "{msg_id}: 50 attempts");
            let mut tx = match <sqlx::Any as Backend>::begin(&lossy).await {
                Ok(tx) => tx,
                Err(e) if idem_runtime::is_transient(&e) => continue,
                Err(e) => panic!("{msg_id}: begin: {e}"),
            };
            let answer = match enqueue(&mut tx, &topic, &msg_id, &payload).await {
                Ok(answer) => answer,
                Err(e) if e.is_retryable() => continue,
                Err(e) => panic!("{msg_id}, attempt {attempt}: a non-retryable error: {e}"),
            };
            if tx.commit().await.is_ok() {
                if attempt > 1 {
                    retries += 1;
                }
                already += usize::from(!answer.is_new());
                break;
            }
        }
    }
    let dropped = proxy.acks_dropped();
    assert!(dropped > 0, "acknowledgements were dropped");
    assert!(
        already > 0,
        "some retries found their message already enqueued"
    );
    assert!(
        already as u64 <= dropped,
        "Already only after a commit whose acknowledgement was lost"
    );
    let rows: Vec<(String, String)> = sqlx::query_as(sql(
        d,
        "SELECT msg_id, payload FROM idem_outbox WHERE topic = ?",
    ))
    .bind(topic.clone())
    .fetch_all(&direct)
    .await
    .expect("rows");
    assert_eq!(
        rows.len(),
        IDS,
        "one message per id ({retries} producers retried, {already} found theirs)"
    );
    let mut per_id = std::collections::BTreeMap::new();
    for (m, p) in rows {
        let p: serde_json::Value = serde_json::from_str(&p).expect("JSON");
        assert_eq!(p["i"], json!(m[2..].parse::<usize>().unwrap()));
        *per_id.entry(m).or_insert(0) += 1;
    }
    assert_eq!(per_id.len(), IDS);
    assert!(per_id.values().all(|n| *n == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_producer_retrying_through_lost_acks_enqueues_each_message_once() {
    producer_retries_through_lost_acks(&idem_testkit::postgres_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_producer_retrying_through_lost_acks_enqueues_each_message_once() {
    producer_retries_through_lost_acks(&idem_testkit::mysql_url()).await;
}

/// Another producer's insert of the same message commits after this
/// transaction's snapshot was taken: the insert finds the duplicate, and
/// the read that follows must see the committed row (MariaDB's repeatable
/// read: a locking read), not answer "no such message".
async fn a_message_committed_after_our_snapshot_is_already_enqueued(url: &str) {
    let Some(pool) = idem_testkit::any(url, 4).await else {
        return;
    };
    let d = <sqlx::Any as Backend>::pool_dialect(&pool);
    let topic = format!("enq.race.{}", ids(1));
    let mut late = pool.begin().await.expect("begin");
    let seen: i64 = sqlx::query_scalar(sql(d, "SELECT COUNT(*) FROM idem_outbox WHERE topic = ?"))
        .bind(topic.clone())
        .fetch_one(&mut *late)
        .await
        .expect("snapshot");
    assert_eq!(seen, 0);
    let mut first = pool.begin().await.expect("begin");
    let new = enqueue(&mut first, &topic, "m-1", &json!({"n": 1}))
        .await
        .expect("first");
    first.commit().await.expect("commit");
    let answer = enqueue(&mut late, &topic, "m-1", &json!({"n": 1}))
        .await
        .expect("late");
    assert_eq!(answer, Enqueued::Already(new.id()));
    late.commit().await.expect("commit");
    let n: i64 = sqlx::query_scalar(sql(d, "SELECT COUNT(*) FROM idem_outbox WHERE topic = ?"))
        .bind(topic)
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(n, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_message_committed_after_our_snapshot_is_already_enqueued() {
    a_message_committed_after_our_snapshot_is_already_enqueued(&idem_testkit::postgres_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_message_committed_after_our_snapshot_is_already_enqueued() {
    a_message_committed_after_our_snapshot_is_already_enqueued(&idem_testkit::mysql_url()).await;
}

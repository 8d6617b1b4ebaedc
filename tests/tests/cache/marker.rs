//! The Redis front cache against the real Redis and databases: a marker
//! answers a duplicate without touching the database; the marker is
//! written only after the commit (a rolled-back call leaves none);
//! outbox-driven calls still go to the database; a Redis that is down or
//! unreachable only slows calls down.

use crate::common::coupons::CouponState;
use idem_runtime::cache::RedisCache;
use idem_runtime::outbox::Relay;
use idem_runtime::{Error, Outcome, Source, idempotent};
use idem_testkit::{ids, redis_get, redis_up};
use serde::{Deserialize, Serialize};
use sqlx::{Sqlite, SqlitePool, Transaction};
use std::sync::atomic::Ordering;
use std::time::Duration;

#[derive(Debug, Clone, Serialize)]
struct Deduct {
    coupon_id: i64,
    fail: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    ledger_row: i64,
}

#[idempotent(
    key = "cache-test:{msg.coupon_id}",
    strategy = state_machine,
    table = "coupon",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
async fn deduct(
    tx: &mut Transaction<'_, Sqlite>,
    msg: &Deduct,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    sqlx::query("INSERT INTO deduction (coupon_id) VALUES (?)")
        .bind(msg.coupon_id)
        .execute(&mut **tx)
        .await?;
    if msg.fail {
        return Err("injected failure after the write".into());
    }
    Ok(())
}

#[idempotent(key = "cache-record:{msg.coupon_id}", strategy = record, biz_type = "cache_notify")]
async fn notify(tx: &mut Transaction<'_, Sqlite>, msg: &Deduct) -> Result<Receipt, sqlx::Error> {
    let done = sqlx::query("INSERT INTO deduction (coupon_id) VALUES (?)")
        .bind(msg.coupon_id)
        .execute(&mut **tx)
        .await?;
    Ok(Receipt {
        ledger_row: done.last_insert_rowid(),
    })
}

async fn setup() -> SqlitePool {
    let pool = idem_testkit::sqlite(4).await;
    for stmt in [
        "CREATE TABLE coupon (id INTEGER PRIMARY KEY, status TEXT NOT NULL)",
        "CREATE TABLE deduction (coupon_id INTEGER NOT NULL)",
    ] {
        sqlx::query(stmt).execute(&pool).await.unwrap();
    }
    pool
}

async fn coupon(pool: &SqlitePool) -> i64 {
    let id = ids(1);
    sqlx::query("INSERT INTO coupon (id, status) VALUES (?, 'UNUSED')")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    id
}

async fn deductions(pool: &SqlitePool, id: i64) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM deduction WHERE coupon_id = ?")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

fn cache() -> RedisCache {
    RedisCache::new(&idem_testkit::redis_url())
        .unwrap()
        .prefix(format!("idem-test:{}:", ids(1)))
        .ttl(Duration::from_secs(300))
}

#[tokio::test]
async fn a_marker_answers_duplicates_without_the_database() {
    if !redis_up().await {
        return;
    }
    let pool = setup().await;
    let cache = cache();
    let id = coupon(&pool).await;
    let msg = Deduct {
        coupon_id: id,
        fail: false,
    };
    assert_eq!(
        deduct(Source::from(&pool).cache(&cache), &msg)
            .await
            .unwrap(),
        Outcome::Executed(())
    );
    assert_eq!(
        redis_get(&cache.marker_key("deduct", &format!("cache-test:{id}")))
            .await
            .as_deref(),
        Some("1")
    );
    // With the database gone, the cache alone answers the duplicate.
    pool.close().await;
    assert_eq!(
        deduct(Source::from(&pool).cache(&cache), &msg)
            .await
            .unwrap(),
        Outcome::Duplicate(None)
    );
    assert_eq!(cache.stats().hits(), 1);
    // Without the cache, the closed pool is the only way: an error.
    assert!(deduct(&pool, &msg).await.is_err());
}

#[tokio::test]
async fn a_rolled_back_call_never_leaves_a_marker() {
    if !redis_up().await {
        return;
    }
    let pool = setup().await;
    let cache = cache();
    let id = coupon(&pool).await;
    let err = deduct(
        Source::from(&pool).cache(&cache),
        &Deduct {
            coupon_id: id,
            fail: true,
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Handler { .. }));
    assert_eq!(
        redis_get(&cache.marker_key("deduct", &format!("cache-test:{id}"))).await,
        None,
        "no marker after a rollback"
    );
    assert_eq!(deductions(&pool, id).await, 0);
    // The retry executes: the cache did not skip it.
    let ok = deduct(
        Source::from(&pool).cache(&cache),
        &Deduct {
            coupon_id: id,
            fail: false,
        },
    )
    .await
    .unwrap();
    assert_eq!(ok, Outcome::Executed(()));
    assert_eq!(deductions(&pool, id).await, 1);
    assert_eq!(cache.stats().writes(), 1);
}

#[tokio::test]
async fn outbox_driven_calls_still_update_their_message() {
    if !redis_up().await {
        return;
    }
    let pool = setup().await;
    let cache = cache();
    let id = coupon(&pool).await;
    let msg = Deduct {
        coupon_id: id,
        fail: false,
    };
    assert!(
        deduct(Source::from(&pool).cache(&cache), &msg)
            .await
            .unwrap()
            .is_executed()
    );
    let topic = format!("cache.redelivery.{id}");
    let mut tx = pool.begin().await.unwrap();
    let outbox =
        idem_runtime::outbox::enqueue(&mut tx, &topic, &format!("m-{id}"), &serde_json::json!({}))
            .await
            .unwrap()
            .id();
    tx.commit().await.unwrap();
    let route_cache = cache.clone();
    let relay = Relay::new(pool.clone()).route(topic, move |d, _m: serde_json::Value| {
        let (cache, msg) = (route_cache.clone(), msg.clone());
        async move { deduct(d.source().cache(&cache), &msg).await }
    });
    assert_eq!(relay.run_once().await.unwrap(), 1);
    assert_eq!(relay.stats().duplicates(), 1);
    let status: String = sqlx::query_scalar("SELECT status FROM idem_outbox WHERE id = ?")
        .bind(outbox)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        status, "success",
        "the database path ran and marked the message"
    );
    assert_eq!(cache.stats().hits(), 0);
}

#[tokio::test]
async fn record_results_are_replayed_from_the_cache() {
    if !redis_up().await {
        return;
    }
    let pool = setup().await;
    let cache = cache();
    let msg = Deduct {
        coupon_id: ids(1),
        fail: false,
    };
    let first = notify(Source::from(&pool).cache(&cache), &msg)
        .await
        .unwrap();
    let Outcome::Executed(receipt) = first else {
        panic!("{first:?}")
    };
    pool.close().await;
    assert_eq!(
        notify(Source::from(&pool).cache(&cache), &msg)
            .await
            .unwrap(),
        Outcome::Duplicate(Some(receipt))
    );
}

#[tokio::test]
async fn an_unreachable_redis_only_slows_calls_down() {
    let pool = setup().await;
    // Nothing listens on port 1: every cache operation fails fast.
    let cache = RedisCache::new("redis://127.0.0.1:1/").unwrap();
    let id = coupon(&pool).await;
    let msg = Deduct {
        coupon_id: id,
        fail: false,
    };
    assert!(
        deduct(Source::from(&pool).cache(&cache), &msg)
            .await
            .unwrap()
            .is_executed()
    );
    assert_eq!(
        deduct(Source::from(&pool).cache(&cache), &msg)
            .await
            .unwrap(),
        Outcome::Duplicate(None)
    );
    assert_eq!(deductions(&pool, id).await, 1);
    assert!(cache.stats().errors() >= 1, "errors are counted");
}

// ---- item 2: handlers sharing a key template -------------------------------

#[idempotent(
    key = "order-paid:{msg.coupon_id}",
    strategy = state_machine,
    table = "email_job",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
async fn send_email(tx: &mut Transaction<'_, Sqlite>, msg: &Deduct) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO deduction (coupon_id) VALUES (?)")
        .bind(msg.coupon_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[idempotent(
    key = "order-paid:{msg.coupon_id}",
    strategy = state_machine,
    table = "points_job",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
async fn award_points(tx: &mut Transaction<'_, Sqlite>, msg: &Deduct) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO deduction (coupon_id) VALUES (?)")
        .bind(msg.coupon_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[tokio::test]
async fn two_handlers_with_one_key_template_both_act_through_the_cache() {
    if !redis_up().await {
        return;
    }
    let pool = setup().await;
    let cache = cache();
    let id = ids(1);
    for stmt in [
        "CREATE TABLE IF NOT EXISTS email_job (id INTEGER PRIMARY KEY, status TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS points_job (id INTEGER PRIMARY KEY, status TEXT NOT NULL)",
    ] {
        sqlx::query(stmt).execute(&pool).await.unwrap();
    }
    for t in ["email_job", "points_job"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (id, status) VALUES ({id}, 'UNUSED')"
        )))
        .execute(&pool)
        .await
        .unwrap();
    }
    let msg = Deduct {
        coupon_id: id,
        fail: false,
    };
    let src = || Source::from(&pool).cache(&cache);
    assert_eq!(
        send_email(src(), &msg).await.unwrap(),
        Outcome::Executed(())
    );
    // The same message fans out to a second handler with the same key
    // template: the first handler's marker must not skip it.
    assert_eq!(
        award_points(src(), &msg).await.unwrap(),
        Outcome::Executed(())
    );
    assert_eq!(deductions(&pool, id).await, 2, "both effects happened");
    // Each handler's own retry is still a duplicate, answered by the cache.
    assert!(send_email(src(), &msg).await.unwrap().is_duplicate());
    assert!(award_points(src(), &msg).await.unwrap().is_duplicate());
    assert_eq!(deductions(&pool, id).await, 2);
    assert_eq!(cache.stats().hits(), 2);
}

// ---- item 3: the cache answers only what the database would ---------------

#[derive(Debug, Clone, Serialize)]
struct Notice {
    order_id: i64,
    text: String,
}

#[idempotent(key = "cache-notice:{n.order_id}", strategy = record, biz_type = "cache_notice")]
async fn send_notice(tx: &mut Transaction<'_, Sqlite>, n: &Notice) -> Result<Receipt, sqlx::Error> {
    let done = sqlx::query("INSERT INTO deduction (coupon_id) VALUES (?)")
        .bind(n.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(Receipt {
        ledger_row: done.last_insert_rowid(),
    })
}

#[tokio::test]
async fn a_cached_record_with_another_payload_is_still_a_key_conflict() {
    if !redis_up().await {
        return;
    }
    let pool = setup().await;
    let cache = cache();
    let id = ids(1);
    let first = Notice {
        order_id: id,
        text: "shipped".into(),
    };
    let src = || Source::from(&pool).cache(&cache);
    assert!(send_notice(src(), &first).await.unwrap().is_executed());
    // The same key with another payload: the database says KeyConflict,
    // so the cache must not answer Duplicate.
    let other = Notice {
        text: "cancelled".into(),
        ..first.clone()
    };
    let err = send_notice(src(), &other).await.unwrap_err();
    assert!(matches!(err, Error::KeyConflict { .. }), "{err:?}");
    assert_eq!(deductions(&pool, id).await, 1);
    // The original payload is still replayed from the cache.
    assert!(matches!(
        send_notice(src(), &first).await.unwrap(),
        Outcome::Duplicate(Some(_))
    ));
    assert_eq!(cache.stats().hits(), 2);
}

#[idempotent(key = "order-paid:{n.order_id}", strategy = record, biz_type = "cache_email")]
async fn mail_receipt(
    tx: &mut Transaction<'_, Sqlite>,
    n: &Notice,
) -> Result<Receipt, sqlx::Error> {
    let done = sqlx::query("INSERT INTO deduction (coupon_id) VALUES (?)")
        .bind(n.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(Receipt {
        ledger_row: done.last_insert_rowid(),
    })
}

#[idempotent(key = "order-paid:{n.order_id}", strategy = record, biz_type = "cache_points")]
async fn award_receipt_points(
    tx: &mut Transaction<'_, Sqlite>,
    n: &Notice,
) -> Result<Receipt, sqlx::Error> {
    let done = sqlx::query("INSERT INTO deduction (coupon_id) VALUES (?)")
        .bind(n.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(Receipt {
        ledger_row: done.last_insert_rowid(),
    })
}

#[tokio::test]
async fn two_record_handlers_with_one_key_template_each_replay_their_own_result() {
    if !redis_up().await {
        return;
    }
    let pool = setup().await;
    let cache = cache();
    let n = Notice {
        order_id: ids(1),
        text: "paid".into(),
    };
    let src = || Source::from(&pool).cache(&cache);
    let Outcome::Executed(mail) = mail_receipt(src(), &n).await.unwrap() else {
        panic!("the first handler must execute")
    };
    let Outcome::Executed(points) = award_receipt_points(src(), &n).await.unwrap() else {
        panic!("the second handler must execute, not replay the first one's marker")
    };
    assert_ne!(mail, points);
    assert_eq!(
        deductions(&pool, n.order_id).await,
        2,
        "both effects happened"
    );
    assert_eq!(
        mail_receipt(src(), &n).await.unwrap(),
        Outcome::Duplicate(Some(mail))
    );
    assert_eq!(
        award_receipt_points(src(), &n).await.unwrap(),
        Outcome::Duplicate(Some(points))
    );
    assert_eq!(cache.stats().hits(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_batch_writes_its_markers_only_after_its_commit() {
    if !redis_up().await {
        return;
    }
    let pool = setup().await;
    let cache = cache();
    let topic = format!("cache.batch.{}", ids(1));
    let mut coupons = Vec::new();
    for k in 0..4 {
        let id = coupon(&pool).await;
        let mut tx = pool.begin().await.unwrap();
        // The third one fails after its write: no marker, no deduction.
        let payload = serde_json::json!({ "coupon_id": id, "fail": k == 2 });
        idem_runtime::outbox::enqueue(&mut tx, &topic, &format!("m-{id}"), &payload)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        coupons.push(id);
    }
    let key = |id: i64| cache.marker_key("deduct", &format!("cache-test:{id}"));
    // The calls that released their savepoint in the batch so far, and
    // how many of their markers a later handler of the batch saw.
    let released = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen_early = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (route_cache, r, s) = (cache.clone(), released.clone(), seen_early.clone());
    let relay = Relay::new(pool.clone())
        .commit_batch(4)
        .max_attempts(1)
        .route(topic.clone(), move |d, m: serde_json::Value| {
            let (cache, released, seen_early) = (route_cache.clone(), r.clone(), s.clone());
            async move {
                let msg = Deduct {
                    coupon_id: m["coupon_id"].as_i64().unwrap_or(0),
                    fail: m["fail"].as_bool().unwrap_or(false),
                };
                let before: Vec<String> = released.lock().unwrap().clone();
                for k in before {
                    if redis_get(&k).await.is_some() {
                        seen_early.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let outcome = deduct(d.source().cache(&cache), &msg).await;
                if outcome.is_ok() {
                    released
                        .lock()
                        .unwrap()
                        .push(cache.marker_key("deduct", &format!("cache-test:{}", msg.coupon_id)));
                }
                outcome
            }
        });
    assert_eq!(relay.run_once().await.unwrap(), 4);
    assert_eq!(relay.stats().batches(), 1);
    let mut markers = Vec::new();
    for id in &coupons {
        markers.push(redis_get(&key(*id)).await.is_some());
    }
    let mut counted = Vec::new();
    for id in &coupons {
        counted.push(deductions(&pool, *id).await);
    }
    let early = seen_early.load(Ordering::Relaxed);
    eprintln!(
        "redis: batch markers after commit={markers:?} deductions={counted:?} markers seen before the commit={early}"
    );
    assert_eq!(early, 0, "a marker was written before the batch committed");
    assert_eq!(
        markers,
        vec![true, true, false, true],
        "markers after the commit, none for the failed call"
    );
    assert_eq!(counted, vec![1, 1, 0, 1]);
}

//! MariaDB sessions in different time zones share idem's tables: every
//! time idem writes or compares is absolute (UTC), whatever the session's
//! `time_zone`. Pools whose connections run `SET time_zone = '+08:00'` or
//! `'-05:00'` next to a UTC pool: records inside their ttl are never
//! archived early and expired ones are; a live lease is never stolen; a
//! message enqueued on one is due at once on the other. Every assertion
//! counts rows (or claims) in the database.

use idem_runtime::archive::Archiver;
use idem_runtime::outbox::{Relay, enqueue};
use idem_runtime::{Outcome, idempotent};
use idem_testkit::ids;
use serde::{Deserialize, Serialize};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{MySql, MySqlPool, Transaction};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Note {
    pub(crate) key: String,
}

/// An outbox retention no test row reaches.
const NEVER: Duration = Duration::from_secs(3650 * 86_400);

/// A pool whose every connection runs in `zone` (UTC: sqlx's default).
async fn zoned(zone: &'static str) -> Option<MySqlPool> {
    // Reachable (or skipped), with idem's tables.
    idem_testkit::mysql(1).await?;
    let opts = MySqlConnectOptions::from_str(&idem_testkit::mysql_url()).expect("valid URL");
    let pool = MySqlPoolOptions::new()
        .max_connections(4)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                sqlx::query(sqlx::AssertSqlSafe(format!("SET time_zone = '{zone}'")))
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            })
        })
        .connect_with(opts)
        .await
        .expect("zoned pool");
    let now: String = sqlx::query_scalar("SELECT @@session.time_zone")
        .fetch_one(&pool)
        .await
        .expect("zone");
    assert_eq!(now, zone);
    Some(pool)
}

#[idempotent(key = "tz-long:{n.key}", strategy = record, biz_type = "tz_long", ttl = "1h")]
async fn long(_tx: &mut Transaction<'_, MySql>, n: &Note) -> Result<String, sqlx::Error> {
    Ok(n.key.clone())
}

#[idempotent(key = "tz-short:{n.key}", strategy = record, biz_type = "tz_short", ttl = "1s")]
async fn short(_tx: &mut Transaction<'_, MySql>, n: &Note) -> Result<String, sqlx::Error> {
    Ok(n.key.clone())
}

/// (online, archived) rows of `key`.
async fn where_is(pool: &MySqlPool, key: &str) -> (i64, i64) {
    let online = sqlx::query_scalar("SELECT COUNT(*) FROM idem_record WHERE idempotency_key = ?")
        .bind(key)
        .fetch_one(pool)
        .await
        .expect("online");
    let archived =
        sqlx::query_scalar("SELECT COUNT(*) FROM idem_record_history WHERE idempotency_key = ?")
            .bind(key)
            .fetch_one(pool)
            .await
            .expect("archived");
    (online, archived)
}

async fn archive(pool: &MySqlPool) {
    Archiver::new(pool.clone())
        .outbox_retention(NEVER)
        .run_once(|_| {})
        .await
        .expect("archive");
}

#[tokio::test]
async fn archivers_in_other_zones_keep_live_records_and_move_expired_ones() {
    let _serial = crate::exclusive(idem_runtime::Dialect::MySql).await;
    let (Some(utc), Some(east), Some(west)) = (
        zoned("+00:00").await,
        zoned("+08:00").await,
        zoned("-05:00").await,
    ) else {
        return;
    };
    let tag = ids(1);
    let n = |s: &str| Note {
        key: format!("{s}-{tag}"),
    };
    // Live for an hour, written in one zone, archived from another.
    assert!(long(&utc, &n("utc")).await.expect("utc").is_executed());
    assert!(long(&west, &n("west")).await.expect("west").is_executed());
    // Expired after a second, written east of UTC.
    assert!(short(&east, &n("east")).await.expect("east").is_executed());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    archive(&east).await;
    archive(&utc).await;
    assert_eq!(
        where_is(&utc, &format!("tz-long:utc-{tag}")).await,
        (1, 0),
        "a +08:00 archiver archived a live record written in UTC"
    );
    assert_eq!(
        where_is(&utc, &format!("tz-long:west-{tag}")).await,
        (1, 0),
        "a UTC archiver archived a live record written at -05:00"
    );
    assert_eq!(
        where_is(&utc, &format!("tz-short:east-{tag}")).await,
        (0, 1),
        "an expired record written at +08:00 was not archived"
    );
    // The duplicate of a live record is still stopped.
    assert_eq!(
        long(&east, &n("utc")).await.expect("replay"),
        Outcome::Duplicate(Some(format!("utc-{tag}")))
    );
}

#[tokio::test]
async fn a_relay_in_another_zone_never_takes_a_live_lease() {
    let (Some(utc), Some(east)) = (zoned("+00:00").await, zoned("+08:00").await) else {
        return;
    };
    let topic = format!("tz.lease.{}", ids(1));
    let runs = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Notify::new());
    let relay = |pool: &MySqlPool, owner: &str| {
        let (runs, started, release) = (runs.clone(), started.clone(), release.clone());
        Relay::new(pool.clone())
            .owner(owner)
            .lease(Duration::from_secs(600))
            .route(topic.clone(), move |_d, _m: serde_json::Value| {
                let (runs, started, release) = (runs.clone(), started.clone(), release.clone());
                async move {
                    if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                        // The first delivery is still running.
                        started.notify_one();
                        release.notified().await;
                    }
                    Ok(Outcome::Executed(()))
                }
            })
    };
    let mut tx = utc.begin().await.expect("begin");
    let msg = enqueue(&mut tx, &topic, "m-1", &serde_json::json!({}))
        .await
        .expect("enqueue");
    assert!(msg.is_new());
    tx.commit().await.expect("commit");
    let first = relay(&utc, "tz-relay-utc");
    let running = tokio::spawn(async move { first.run_once().await });
    started.notified().await;
    let second = relay(&east, "tz-relay-east");
    let stolen = second.run_once().await.expect("second relay");
    release.notify_one();
    assert_eq!(running.await.expect("join").expect("first relay"), 1);
    assert_eq!(
        stolen, 0,
        "a +08:00 relay claimed a message under a live 10-minute lease"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn enqueue_one(pool: &MySqlPool, topic: &str) {
    let mut tx = pool.begin().await.expect("begin");
    let msg = enqueue(&mut tx, topic, "m-1", &serde_json::json!({}))
        .await
        .expect("enqueue");
    assert!(msg.is_new());
    tx.commit().await.expect("commit");
}

fn counting_relay(pool: &MySqlPool, topic: &str, runs: Arc<AtomicUsize>) -> Relay<MySql> {
    Relay::new(pool.clone()).route(topic.to_string(), move |_d, _m: serde_json::Value| {
        let runs = runs.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::Executed(()))
        }
    })
}

#[tokio::test]
async fn a_message_enqueued_in_one_zone_is_due_at_once_in_another() {
    let (Some(utc), Some(east), Some(west)) = (
        zoned("+00:00").await,
        zoned("+08:00").await,
        zoned("-05:00").await,
    ) else {
        return;
    };
    for (producer, consumer, what) in [
        (&east, &utc, "enqueued at +08:00, relayed in UTC"),
        (&utc, &west, "enqueued in UTC, relayed at -05:00"),
    ] {
        let topic = format!("tz.due.{}", ids(1));
        enqueue_one(producer, &topic).await;
        let runs = Arc::new(AtomicUsize::new(0));
        let claimed = counting_relay(consumer, &topic, runs.clone())
            .run_once()
            .await
            .expect("relay");
        assert_eq!(claimed, 1, "{what}: not due");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{what}");
        let status: String = sqlx::query_scalar("SELECT status FROM idem_outbox WHERE topic = ?")
            .bind(&topic)
            .fetch_one(&utc)
            .await
            .expect("status");
        assert_eq!(status, "success", "{what}");
    }
}

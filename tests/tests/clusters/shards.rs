//! Several databases, each holding a slice of the entities
//! ([`idem_runtime::shard::Shards`]), on every backend against the real
//! servers (three PostgreSQL databases, three MariaDB databases, three
//! SQLite files):
//!
//! - concurrent duplicates of every entity's message, each call on the
//!   entity's shard: one effect per message, and the effect, the record and
//!   the outbox row all in the entity's own database, none elsewhere;
//! - a relay per shard draining messages enqueued beside their entities,
//!   each message enqueued twice by a retrying producer: one effect each,
//!   no message left pending or dead-lettered;
//! - the control: the record in another database than the data it guards.
//!   The business transaction rolls back after the call committed its
//!   record elsewhere, and the retry answers `Duplicate`: the effect is
//!   lost for good. The same sequence with both in the entity's shard (a
//!   caller transaction from `Shards::begin`) rolls back together, and the
//!   retry acts once.

use idem_runtime::Dialect;
use idem_runtime::outbox::{Delivery, Enqueued, Relay, enqueue};
use idem_runtime::shard::Shards;
use idem_runtime::{CallerTx, Outcome, idempotent};
use idem_testkit::{concurrently, ids, sql};
use serde::{Deserialize, Serialize};
use std::time::Duration;

const SHARDS: usize = 3;
const ENTITIES: i64 = 45;
const DELIVERIES: usize = 3;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Award {
    order_id: i64,
    customer: i64,
    points: i64,
}

macro_rules! shard_suite {
    ($name:ident, $db:ty, $dialect:expr, $pools:expr) => {
        mod $name {
            use super::*;
            use sqlx::{Pool, Transaction};
            type Db = $db;
            const D: Dialect = $dialect;

            #[idempotent(key = "shd-award:{a.order_id}", strategy = record, biz_type = "shd_award")]
            async fn award(tx: &mut Transaction<'_, Db>, a: &Award) -> Result<(), sqlx::Error> {
                award_body(tx, a).await
            }

            /// The relay's handler: keyed by the delivery.
            #[idempotent(key = "shd-msg:{d.topic}:{d.msg_id}", strategy = record, biz_type = "shd_msg")]
            async fn award_msg(
                tx: &mut Transaction<'_, Db>,
                d: &Delivery<Db>,
                a: &Award,
            ) -> Result<(), sqlx::Error> {
                let _ = d;
                award_body(tx, a).await
            }

            async fn award_body(tx: &mut Transaction<'_, Db>, a: &Award) -> Result<(), sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_t_shd_points (order_id, customer, points) VALUES (?, ?, ?)"))
                    .bind(a.order_id)
                    .bind(a.customer)
                    .bind(a.points)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            /// Only the record: the caller makes the effect (the control's
            /// hand wiring, and its fix).
            #[idempotent(key = "shd-note:{a.order_id}", strategy = record, biz_type = "shd_note")]
            async fn note(tx: &mut Transaction<'_, Db>, a: &Award) -> Result<(), sqlx::Error> {
                let _ = (tx, a);
                Ok(())
            }

            async fn shards() -> Option<Shards<Db>> {
                let pools: Vec<Pool<Db>> = $pools?;
                for pool in &pools {
                    let created = sqlx::query(
                        "CREATE TABLE IF NOT EXISTS idem_t_shd_points \
                         (order_id BIGINT NOT NULL, customer BIGINT NOT NULL, points BIGINT NOT NULL)",
                    )
                    .execute(pool)
                    .await;
                    match created {
                        Ok(_) => {}
                        // Two of these tests creating the table at once on
                        // PostgreSQL: the loser's IF NOT EXISTS can still hit
                        // the catalog's unique index (23505) or see it
                        // created (42P07); the table is there either way.
                        Err(e) if e
                            .as_database_error()
                            .and_then(|d| d.code())
                            .is_some_and(|c| c == "23505" || c == "42P07") => {}
                        Err(e) => panic!("create table: {e}"),
                    }
                }
                Some(Shards::new(pools).expect("shards"))
            }

            /// A count with text parameters.
            async fn count(pool: &Pool<Db>, q: &'static str, binds: &[&str]) -> i64 {
                let mut query = sqlx::query_scalar::<_, i64>(sql(D, q));
                for b in binds {
                    query = query.bind(b.to_string());
                }
                query.fetch_one(pool).await.expect("count")
            }

            async fn count_id(pool: &Pool<Db>, q: &'static str, bind: i64) -> i64 {
                sqlx::query_scalar::<_, i64>(sql(D, q))
                    .bind(bind)
                    .fetch_one(pool)
                    .await
                    .expect("count")
            }

            /// Effects of `order` in each shard.
            async fn effects(shards: &Shards<Db>, order: i64) -> Vec<i64> {
                let mut out = Vec::new();
                for pool in shards.pools() {
                    out.push(
                        count_id(pool, "SELECT COUNT(*) FROM idem_t_shd_points WHERE order_id = ?", order)
                            .await,
                    );
                }
                out
            }

            async fn records(shards: &Shards<Db>, key: &str) -> Vec<i64> {
                let mut out = Vec::new();
                for pool in shards.pools() {
                    out.push(count(pool, "SELECT COUNT(*) FROM idem_record WHERE idempotency_key = ?", &[key]).await);
                }
                out
            }

            fn only_in(shard: usize, n: i64) -> Vec<i64> {
                (0..SHARDS).map(|i| if i == shard { n } else { 0 }).collect()
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn duplicates_act_once_each_in_its_entitys_shard() {
                let Some(shards) = shards().await else { return };
                let base = ids(ENTITIES * 2);
                let mut spread = [0usize; SHARDS];
                for n in 0..ENTITIES {
                    let a = Award { order_id: base + n, customer: base + ENTITIES + n, points: n };
                    spread[shards.shard_of(&a.customer).expect("shard")] += 1;
                    let outcomes = concurrently(DELIVERIES, || {
                        let (shards, a) = (shards.clone(), a.clone());
                        async move { award(shards.source(&a.customer)?, &a).await }
                    })
                    .await;
                    let executed = outcomes
                        .iter()
                        .filter(|o| matches!(o, Ok(Outcome::Executed(()))))
                        .count();
                    assert_eq!(executed, 1, "order {}: {outcomes:?}", a.order_id);
                    let home = shards.shard_of(&a.customer).expect("shard");
                    assert_eq!(effects(&shards, a.order_id).await, only_in(home, 1), "order {}", a.order_id);
                    let key = format!("shd-award:{}", a.order_id);
                    assert_eq!(records(&shards, &key).await, only_in(home, 1), "record of {}", a.order_id);
                }
                eprintln!("shards/{}: {ENTITIES} entities x {DELIVERIES} deliveries, per shard {spread:?}: double 0, lost 0, every record beside its effect", stringify!($name));
                assert!(spread.iter().all(|&n| n > 0), "every shard used: {spread:?}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_relay_per_shard_delivers_each_message_once_beside_its_entity() {
                let Some(shards) = shards().await else { return };
                let topic = idem_testkit::unique("shd_topic");
                let base = ids(ENTITIES * 2);
                for n in 0..ENTITIES {
                    let a = Award { order_id: base + n, customer: base + ENTITIES + n, points: 1 };
                    let payload = serde_json::to_value(&a).expect("json");
                    // The producer retries: the second enqueue finds the first.
                    for attempt in 0..2 {
                        let mut tx: CallerTx<Db> = shards.begin(&a.customer).await.expect("begin");
                        let got = enqueue(tx.transaction().expect("tx"), &topic, &a.order_id.to_string(), &payload)
                            .await
                            .expect("enqueue");
                        assert_eq!(matches!(got, Enqueued::Already(_)), attempt == 1, "{got:?}");
                        tx.commit().await.expect("commit");
                    }
                }
                let handles: Vec<_> = shards
                    .relays(|_, pool| {
                        Relay::new(pool)
                            .poll_interval(Duration::from_millis(20))
                            .concurrency(4)
                            .route(&topic, |d: Delivery<Db>, a: Award| async move {
                                award_msg(d.source(), &d, &a).await
                            })
                    })
                    .into_iter()
                    .map(Relay::spawn)
                    .collect();
                let deadline = std::time::Instant::now() + Duration::from_secs(60);
                loop {
                    let mut pending = 0;
                    for pool in shards.pools() {
                        pending += count(pool, "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status <> 'success'", &[&topic]).await;
                    }
                    if pending == 0 || std::time::Instant::now() > deadline {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                for h in handles {
                    h.shutdown().await;
                }
                for n in 0..ENTITIES {
                    let (order, customer) = (base + n, base + ENTITIES + n);
                    let home = shards.shard_of(&customer).expect("shard");
                    assert_eq!(effects(&shards, order).await, only_in(home, 1), "order {order}");
                    let mut rows = Vec::new();
                    for pool in shards.pools() {
                        rows.push(
                            count(pool, "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'success' AND msg_id = ?", &[&topic, &order.to_string()])
                                .await,
                        );
                    }
                    assert_eq!(rows, only_in(home, 1), "outbox row of {order}");
                }
                let mut failed = 0;
                for pool in shards.pools() {
                    failed += count(pool, "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'failed'", &[&topic]).await;
                }
                assert_eq!(failed, 0, "dead letters");
                eprintln!("shards/{}: relay per shard, {ENTITIES} messages enqueued twice: double 0, lost 0, dead letters 0", stringify!($name));
            }

            #[tokio::test]
            async fn a_delivery_run_on_another_database_fails_before_its_body() {
                let Some(shards) = shards().await else { return };
                let topic = idem_testkit::unique("shd_wrong");
                let order = ids(1);
                let a = Award { order_id: order, customer: order, points: 1 };
                let home = shards.shard_of(&a.customer).expect("shard");
                let elsewhere = shards.pools()[(home + 1) % SHARDS].clone();
                let mut tx: CallerTx<Db> = shards.begin(&a.customer).await.expect("begin");
                enqueue(tx.transaction().expect("tx"), &topic, "m1", &serde_json::to_value(&a).expect("json"))
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit");
                let relay = Relay::new(shards.pools()[home].clone()).route(&topic, move |d: Delivery<Db>, a: Award| {
                    let elsewhere = elsewhere.clone();
                    async move { award_msg(d.source_on(&elsewhere), &d, &a).await }
                });
                assert_eq!(relay.run_once().await.expect("relay"), 1);
                assert_eq!(effects(&shards, order).await, vec![0; SHARDS], "the body must not run");
                let home_pool = &shards.pools()[home];
                assert_eq!(count(home_pool, "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'success'", &[&topic]).await, 0);
                let reason: Option<String> = sqlx::query_scalar(sql(D, "SELECT last_error FROM idem_outbox WHERE topic = ?"))
                    .bind(&topic)
                    .fetch_one(home_pool)
                    .await
                    .expect("reason");
                assert!(reason.as_deref().is_some_and(|r| r.contains("outbox")), "{reason:?}");
            }

            /// The control, then the fix.
            #[tokio::test]
            async fn a_record_in_another_shard_than_its_data_loses_the_effect() {
                let Some(shards) = shards().await else { return };
                let base = ids(2);
                let a = Award { order_id: base, customer: base + 1, points: 5 };
                let home = shards.shard_of(&a.customer).expect("shard");
                let elsewhere = (home + 1) % SHARDS;
                let insert = || sql(D, "INSERT INTO idem_t_shd_points (order_id, customer, points) VALUES (?, ?, ?)");

                // Wired by hand: the effect in the entity's database, the
                // record in another one. The call commits its record, then
                // the business transaction fails and rolls back.
                for attempt in 0..2 {
                    let mut data = shards.pools()[home].begin().await.expect("begin");
                    let outcome = note(&shards.pools()[elsewhere], &a).await.expect("note");
                    if matches!(outcome, Outcome::Executed(())) {
                        sqlx::query(insert()).bind(a.order_id).bind(a.customer).bind(a.points)
                            .execute(&mut *data).await.expect("effect");
                    }
                    if attempt == 0 {
                        data.rollback().await.expect("rollback"); // the crash
                    } else {
                        data.commit().await.expect("commit");
                    }
                }
                let key = format!("shd-note:{}", a.order_id);
                assert_eq!(records(&shards, &key).await, only_in(elsewhere, 1));
                assert_eq!(
                    effects(&shards, a.order_id).await,
                    vec![0; SHARDS],
                    "the control must lose the effect: the record committed without it"
                );

                // Through the shards: the record and the effect in one
                // transaction of the entity's database; the rollback takes
                // both, the retry acts.
                let b = Award { order_id: base + 1, ..a.clone() };
                for attempt in 0..2 {
                    let mut tx: CallerTx<Db> = shards.begin(&b.customer).await.expect("begin");
                    let outcome = note(&mut tx, &b).await.expect("note");
                    if matches!(outcome, Outcome::Executed(())) {
                        sqlx::query(insert()).bind(b.order_id).bind(b.customer).bind(b.points)
                            .execute(tx.conn().expect("conn")).await.expect("effect");
                    }
                    if attempt == 0 {
                        tx.rollback().await.expect("rollback");
                    } else {
                        tx.commit().await.expect("commit");
                    }
                }
                let key = format!("shd-note:{}", b.order_id);
                assert_eq!(records(&shards, &key).await, only_in(home, 1));
                assert_eq!(effects(&shards, b.order_id).await, only_in(home, 1));
                eprintln!("shards/{}: control (record in shard {elsewhere}, data in {home}): lost 1; through Shards: lost 0, double 0", stringify!($name));
            }
        }
    };
}

async fn collect<P, F: std::future::Future<Output = Option<P>>>(
    make: impl Fn(usize) -> F,
) -> Option<Vec<P>> {
    let mut pools = Vec::new();
    for i in 0..SHARDS {
        pools.push(make(i).await?);
    }
    Some(pools)
}

idem_testkit::for_each_backend!(shard_suite;
    postgres {
        collect(|i| async move {
            idem_testkit::postgres_database(&format!("idem_t_shard_{i}"), 8).await
        })
        .await
    },
    mariadb {
        collect(|i| async move {
            idem_testkit::mysql_database(&format!("idem_t_shard_{i}"), 8).await
        })
        .await
    },
    sqlite { collect(|_| async { Some(idem_testkit::sqlite(4).await) }).await },
);

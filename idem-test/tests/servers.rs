//! On PostgreSQL and MariaDB, faults through the run's fault proxy: the
//! harness passes the three strategies, and catches the article's fault
//! version and a handler writing through a second pool; through real
//! relays, a route passing its source acts once when its relay restarts
//! and when its lease runs out, and the same two broken handlers are
//! caught. A server that is down skips its tests (SKIPPED), or fails them
//! when `CI=true`.

mod common;

use common::{mysql_url, numbered, postgres_url, run_base, skipped};
use idem_runtime::outbox::{self, Delivery};
use idem_runtime::{Outcome, State, idempotent};
use idem_test::{ActsOnce, Report, Scenario};
use serde::{Deserialize, Serialize};
use sqlx::AssertSqlSafe;

#[derive(Clone, Copy, State)]
enum CouponState {
    Unused,
    Used,
}

#[derive(Clone, Serialize)]
struct Notice {
    msg_id: String,
    user_id: i64,
}

/// A coupon route's message.
#[derive(Clone, Serialize, Deserialize)]
struct Deduct {
    coupon_id: i64,
    order_id: i64,
}

#[derive(Clone)]
struct Callback {
    serial: String,
    amount: i64,
}

/// Every scenario ran, injected its faults, and found nothing wrong.
fn assert_passed(report: &Report) {
    println!("{report}");
    report.assert_acts_once();
    for s in &report.scenarios {
        let wanted = if s.scenario == Scenario::Single { 0 } else { 4 };
        assert_eq!(
            s.faults(),
            wanted,
            "{}: faults injected\n{report}",
            s.scenario.name()
        );
    }
    let dup = report.scenario(Scenario::ConcurrentDuplicates).unwrap();
    assert_eq!((dup.executed(), dup.duplicates()), (4, 28), "{report}");
}

macro_rules! server_suite {
    ($module:ident, $db:ty, $conn:ty, $ctor:ident, $url:expr, $q:expr, $t:tt, $c:tt) => {
        mod $module {
            use super::*;
            type Db = $db;
            type Pool = sqlx::Pool<Db>;

            fn q(text: &'static str) -> AssertSqlSafe<String> {
                let convert: fn(&str) -> String = $q;
                AssertSqlSafe(convert(&text.replace("{t}", $t)))
            }

            #[idempotent(
                key = "coupon-deduct:{order_id}",
                strategy = state_machine,
                table = $t, id = coupon_id,
                from = CouponState::Unused, to = CouponState::Used,
            )]
            async fn deduct_coupon(tx: &mut $conn, coupon_id: i64, order_id: i64) -> Result<(), sqlx::Error> {
                sqlx::query(q("INSERT INTO {t}_deduction (coupon_id, order_id) VALUES (?, ?)"))
                    .bind(coupon_id).bind(order_id).execute(&mut *tx).await?;
                Ok(())
            }

            #[idempotent(
                key = "coupon-deduct:{order_id}",
                strategy = state_machine,
                table = $t, id = coupon_id,
                from = CouponState::Unused, to = CouponState::Used,
            )]
            async fn deduct_through_second_pool(tx: &mut $conn, ledger: &Pool, coupon_id: i64, order_id: i64) -> Result<(), sqlx::Error> {
                // Wrong: committed on its own, whatever becomes of the call.
                sqlx::query(q("INSERT INTO {t}_deduction (coupon_id, order_id) VALUES (?, ?)"))
                    .bind(coupon_id).bind(order_id).execute(ledger).await?;
                sqlx::query("SELECT 1").execute(&mut *tx).await?;
                Ok(())
            }

            /// The article's fault version: the status read outside the transaction.
            async fn fault_version(pool: Pool, coupon: i64, order: i64) -> Result<Outcome<()>, sqlx::Error> {
                let status: String = sqlx::query_scalar(q("SELECT status FROM {t} WHERE id = ?"))
                    .bind(coupon).fetch_one(&pool).await?;
                if status != "UNUSED" {
                    return Ok(Outcome::Duplicate(None));
                }
                let mut tx = pool.begin().await?;
                sqlx::query(q("INSERT INTO {t}_deduction (coupon_id, order_id) VALUES (?, ?)"))
                    .bind(coupon).bind(order).execute(&mut *tx).await?;
                sqlx::query(q("UPDATE {t} SET status = 'USED' WHERE id = ?"))
                    .bind(coupon).execute(&mut *tx).await?;
                tx.commit().await?;
                Ok(Outcome::Executed(()))
            }

            #[idempotent(key = "notice:{n.msg_id}", strategy = record, biz_type = "idem_test_notice")]
            async fn send_notice(tx: &mut $conn, n: &Notice) -> Result<String, sqlx::Error> {
                sqlx::query(q("INSERT INTO {t}_sent (msg_id, user_id) VALUES (?, ?)"))
                    .bind(&n.msg_id).bind(n.user_id).execute(&mut *tx).await?;
                Ok("sms".into())
            }

            #[idempotent(key = "pay:{cb.serial}", strategy = unique_insert, constraint = $c)]
            async fn record_payment(tx: &mut $conn, cb: &Callback) -> Result<(), sqlx::Error> {
                sqlx::query(q("INSERT INTO {t}_payment (serial, amount) VALUES (?, ?)"))
                    .bind(&cb.serial).bind(cb.amount).execute(&mut *tx).await?;
                sqlx::query(q("INSERT INTO {t}_ledger (serial) VALUES (?)"))
                    .bind(&cb.serial).execute(&mut *tx).await?;
                Ok(())
            }

            /// Creates the suite's tables once per run (they stay: ids are new on every run).
            async fn tables(pool: Pool) -> Result<(), sqlx::Error> {
                for stmt in [
                    "CREATE TABLE IF NOT EXISTS {t} (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
                    "CREATE TABLE IF NOT EXISTS {t}_deduction (coupon_id BIGINT NOT NULL, order_id BIGINT NOT NULL)",
                    "CREATE TABLE IF NOT EXISTS {t}_sent (msg_id VARCHAR(64) NOT NULL, user_id BIGINT NOT NULL)",
                    "CREATE TABLE IF NOT EXISTS {t}_payment (serial VARCHAR(64) NOT NULL, amount BIGINT NOT NULL, CONSTRAINT {t}_payment_serial UNIQUE (serial))",
                    "CREATE TABLE IF NOT EXISTS {t}_ledger (serial VARCHAR(64) NOT NULL)",
                ] {
                    sqlx::query(q(stmt)).execute(&pool).await?;
                }
                Ok(())
            }

            /// A coupon run: coupon `base + n` deducted for order `base + n`.
            fn coupons(handler: &str) -> ActsOnce<Db, (i64, i64)> {
                let base = run_base();
                ActsOnce::$ctor(handler, &$url, move |n| (base + n as i64, base + n as i64))
                    .setup(tables)
                    .prepare(|pool, (coupon, _)| async move {
                        sqlx::query(q("INSERT INTO {t} (id, status) VALUES (?, 'UNUSED')"))
                            .bind(coupon).execute(&pool).await?;
                        Ok(())
                    })
                    .effect(|pool, (_, order)| async move {
                        sqlx::query_scalar(q("SELECT COUNT(*) FROM {t}_deduction WHERE order_id = ?"))
                            .bind(order).fetch_one(&pool).await
                    })
            }

            /// A coupon route's run on a topic of its own: coupon and order
            /// `base + n`, the message enqueued in a transaction of its own.
            fn coupon_route(handler: &str) -> (ActsOnce<Db, Deduct>, String) {
                let base = run_base();
                let topic = format!("idem-test.{}.{base}", $t);
                let t = topic.clone();
                let run = ActsOnce::$ctor(handler, &$url, move |n| Deduct { coupon_id: base + n as i64, order_id: base + n as i64 })
                    .setup(tables)
                    .prepare(|pool, m| async move {
                        sqlx::query(q("INSERT INTO {t} (id, status) VALUES (?, 'UNUSED')"))
                            .bind(m.coupon_id).execute(&pool).await?;
                        Ok(())
                    })
                    .enqueue(move |pool, m| {
                        let topic = t.clone();
                        async move {
                            let mut tx = pool.begin().await?;
                            let payload = serde_json::to_value(&m).expect("a plain struct");
                            outbox::enqueue(&mut tx, &topic, &format!("order-{}", m.order_id), &payload).await?;
                            tx.commit().await?;
                            Ok(())
                        }
                    })
                    .effect(|pool, m| async move {
                        sqlx::query_scalar(q("SELECT COUNT(*) FROM {t}_deduction WHERE order_id = ?"))
                            .bind(m.order_id).fetch_one(&pool).await
                    });
                (run, topic)
            }

            #[tokio::test]
            async fn a_route_passing_its_source_acts_once_through_restarts_and_lost_leases() {
                let (run, topic) = coupon_route("deduct_coupon route");
                let run = run
                    .route(&topic, |d: Delivery<Db>, m: Deduct| async move {
                        deduct_coupon(d.source(), m.coupon_id, m.order_id).await
                    })
                    .run().await;
                if skipped(&run, "a_route_acts_once") { return; }
                let report = run.expect("run");
                println!("{report}");
                report.assert_acts_once();
                for s in &report.scenarios {
                    assert_eq!(s.faults(), 4, "{}: faults injected\n{report}", s.scenario.name());
                }
                assert_eq!(report.scenarios.len(), 2, "{report}");
            }

            #[tokio::test]
            async fn broken_routes_are_caught_through_restarts_and_lost_leases() {
                let Ok(ledger) = Pool::connect(&$url).await else {
                    let (run, _) = coupon_route("second pool route");
                    assert!(skipped(&run.run().await, "broken_routes_are_caught"), "the server is up for the harness but not for the test");
                    return;
                };
                // Its effect through a second pool: doubled when the relay dies with its commit cut.
                let (run, topic) = coupon_route("deduct_through_second_pool route");
                let report = run
                    .route(&topic, move |d: Delivery<Db>, m: Deduct| {
                        let ledger = ledger.clone();
                        async move { deduct_through_second_pool(d.source(), &ledger, m.coupon_id, m.order_id).await }
                    })
                    .scenarios([Scenario::RelayRestarted])
                    .run().await.expect("run");
                println!("{report}");
                let failures = report.failures();
                eprintln!("{}", failures.join("\n"));
                assert_eq!(failures.len(), 2, "the second and fourth actions: {failures:#?}");
                assert!(failures[0].contains("(doubled): relay A died with its handler's commit cut"), "{}", failures[0]);
                // The article's fault version on the relay's pool: doubled when two relays hold the message.
                let (run, topic) = coupon_route("fault_version route");
                let report = run
                    .route(&topic, |d: Delivery<Db>, m: Deduct| async move {
                        Ok(fault_version(d.pool().clone(), m.coupon_id, m.order_id).await?)
                    })
                    .scenarios([Scenario::LeaseExpired])
                    .run().await.expect("run");
                println!("{report}");
                let failures = report.failures();
                eprintln!("{}", failures.join("\n"));
                assert_eq!(report.scenario(Scenario::LeaseExpired).unwrap().doubled(), 4, "{report}");
                assert!(failures[0].contains("was not fenced off"), "{}", failures[0]);
            }

            #[tokio::test]
            async fn state_machine_acts_once() {
                let run = coupons("deduct_coupon")
                    .call(|pool, (coupon, order)| async move { deduct_coupon(&pool, coupon, order).await })
                    .run().await;
                if skipped(&run, "state_machine_acts_once") { return; }
                assert_passed(&run.expect("run"));
            }

            #[tokio::test]
            async fn record_acts_once() {
                let base = run_base();
                let run = ActsOnce::$ctor("send_notice", &$url, move |n| Notice { msg_id: format!("m-{}", base + n as i64), user_id: 7 })
                    .setup(tables)
                    .call(|pool, n| async move { send_notice(&pool, &n).await })
                    .effect(|pool, n| async move {
                        sqlx::query_scalar(q("SELECT COUNT(*) FROM {t}_sent WHERE msg_id = ?"))
                            .bind(&n.msg_id).fetch_one(&pool).await
                    })
                    .run().await;
                if skipped(&run, "record_acts_once") { return; }
                assert_passed(&run.expect("run"));
            }

            #[tokio::test]
            async fn unique_insert_acts_once() {
                let base = run_base();
                let run = ActsOnce::$ctor("record_payment", &$url, move |n| Callback { serial: format!("s-{}", base + n as i64), amount: 5 })
                    .setup(tables)
                    .call(|pool, cb| async move { record_payment(&pool, &cb).await })
                    .effect(|pool, cb| async move {
                        sqlx::query_scalar(q("SELECT COUNT(*) FROM {t}_ledger WHERE serial = ?"))
                            .bind(&cb.serial).fetch_one(&pool).await
                    })
                    .run().await;
                if skipped(&run, "unique_insert_acts_once") { return; }
                assert_passed(&run.expect("run"));
            }

            #[tokio::test]
            async fn the_fault_version_is_caught_doubling_under_concurrent_duplicates() {
                let run = coupons("fault_version")
                    .call(|pool, (coupon, order)| fault_version(pool, coupon, order))
                    .run().await;
                if skipped(&run, "the_fault_version_is_caught") { return; }
                let report = run.expect("run");
                println!("{report}");
                let failures = report.failures();
                eprintln!("{}", failures.join("\n"));
                assert!(report.scenario(Scenario::ConcurrentDuplicates).unwrap().doubled() > 0, "{report}");
                assert!(failures.iter().all(|f| f.starts_with("acts_once: scenario \"concurrent duplicates\"")), "{failures:#?}");
                assert!(failures[0].contains("does not run in the call's transaction under a lock"), "{}", failures[0]);
            }

            #[tokio::test]
            async fn a_second_pool_is_caught_doubling_after_a_cancelled_call() {
                let Ok(ledger) = Pool::connect(&$url).await else {
                    let run = coupons("second pool").call(|pool, (c, o)| async move { deduct_coupon(&pool, c, o).await }).run().await;
                    assert!(skipped(&run, "a_second_pool_is_caught"), "the server is up for the harness but not for the test");
                    return;
                };
                let (l1, l2) = (ledger.clone(), ledger);
                let run = coupons("deduct_through_second_pool")
                    .call(move |pool, (coupon, order)| {
                        let ledger = l1.clone();
                        async move { deduct_through_second_pool(&pool, &ledger, coupon, order).await }
                    })
                    .effect(move |_, (_, order)| {
                        let ledger = l2.clone();
                        async move {
                            sqlx::query_scalar(q("SELECT COUNT(*) FROM {t}_deduction WHERE order_id = ?"))
                                .bind(order).fetch_one(&ledger).await
                        }
                    })
                    .run().await;
                let report = run.expect("run");
                println!("{report}");
                let failures = report.failures();
                eprintln!("{}", failures.join("\n"));
                assert_eq!(report.scenario(Scenario::Cancelled).unwrap().doubled(), 4, "{report}");
                assert_eq!(failures.len(), 4, "{failures:#?}");
                assert!(failures[0].contains("(doubled)") && failures[0].contains("written outside the call's transaction"), "{}", failures[0]);
            }
        }
    };
}

server_suite!(
    postgres,
    sqlx::Postgres,
    sqlx::PgConnection,
    postgres,
    postgres_url(),
    numbered,
    "idem_test_pg_coupon",
    "idem_test_pg_coupon_payment_serial"
);
server_suite!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlConnection,
    mysql,
    mysql_url(),
    str::to_owned,
    "idem_test_my_coupon",
    "idem_test_my_coupon_payment_serial"
);

//! The relay scenarios on SQLite: a route whose handler passes its
//! delivery's source acts once when its relay dies mid-delivery and when
//! its lease runs out under it; a route writing its effect through a
//! second pool is caught doubling after a restart, and the article's fault
//! version (its check outside the transaction, the message not fenced) is
//! caught doubling when two relays hold the message.

mod coupons;

use coupons::{deduct_coupon, deduct_through_second_pool, fault_version, panic_message};
use idem_runtime::outbox::{self, Delivery};
use idem_test::{ActsOnce, Scenario};
use serde::{Deserialize, Serialize};
use sqlx::{Sqlite, SqlitePool};

const TOPIC: &str = "coupon.deduct";

/// The message of action `n`: order `100 + n` deducts coupon `n`.
#[derive(Clone, Serialize, Deserialize)]
struct Deduct {
    coupon_id: i64,
    order_id: i64,
}

fn action(n: usize) -> Deduct {
    Deduct {
        coupon_id: n as i64,
        order_id: 100 + n as i64,
    }
}

/// A run over the coupon route, without its handler: the tables, each
/// action's coupon and message, the deductions counted.
fn coupons(handler: &str) -> ActsOnce<Sqlite, Deduct> {
    ActsOnce::sqlite(handler, action)
        .setup(|pool| async move {
            sqlx::query("CREATE TABLE coupon (id INTEGER PRIMARY KEY, status TEXT NOT NULL)")
                .execute(&pool)
                .await?;
            sqlx::query("CREATE TABLE deduction (coupon_id INTEGER, order_id INTEGER)")
                .execute(&pool)
                .await?;
            Ok(())
        })
        .prepare(|pool, m| async move {
            sqlx::query("INSERT INTO coupon (id, status) VALUES (?, 'UNUSED')")
                .bind(m.coupon_id)
                .execute(&pool)
                .await?;
            Ok(())
        })
        .enqueue(|pool, m| async move {
            let mut tx = pool.begin().await?;
            let msg_id = format!("order-{}", m.order_id);
            let payload = serde_json::to_value(&m).expect("a plain struct");
            outbox::enqueue(&mut tx, TOPIC, &msg_id, &payload).await?;
            tx.commit().await?;
            Ok(())
        })
        .effect(|pool, m| async move {
            sqlx::query_scalar("SELECT COUNT(*) FROM deduction WHERE order_id = ?")
                .bind(m.order_id)
                .fetch_one(&pool)
                .await
        })
}

#[tokio::test]
async fn a_route_passing_its_source_acts_once_through_restarts_and_lost_leases() {
    let report = coupons("deduct_coupon route")
        .route(TOPIC, |d: Delivery<Sqlite>, m: Deduct| async move {
            deduct_coupon(d.source(), m.coupon_id, m.order_id).await
        })
        .run()
        .await
        .expect("run");
    println!("{report}");
    for s in &report.scenarios {
        for a in &s.actions {
            println!("{} #{}: {}", s.scenario.name(), a.action, a.story);
        }
    }
    report.assert_acts_once();
    let names: Vec<_> = report.scenarios.iter().map(|s| s.scenario).collect();
    assert_eq!(
        names,
        Scenario::RELAY,
        "a route alone runs the relay scenarios"
    );
    let restarted = report.scenario(Scenario::RelayRestarted).unwrap();
    assert_eq!(restarted.faults(), 4, "{report}");
    let expired = report.scenario(Scenario::LeaseExpired).unwrap();
    assert_eq!(expired.faults(), 4, "every first commit held: {report}");
    // Relay A's handler lost its message to B: fenced, it acted nowhere.
    assert_eq!(expired.executed(), 4, "{report}");
}

#[tokio::test]
async fn a_second_pool_is_caught_doubling_when_the_relay_restarts() {
    let ledger = SqlitePool::connect("sqlite::memory:")
        .await
        .expect("ledger");
    sqlx::query("CREATE TABLE deduction (coupon_id INTEGER, order_id INTEGER)")
        .execute(&ledger)
        .await
        .expect("ledger table");
    let (l1, l2) = (ledger.clone(), ledger.clone());
    let report =
        coupons("deduct_through_second_pool route")
            .route(TOPIC, move |d: Delivery<Sqlite>, m: Deduct| {
                let ledger = l1.clone();
                async move {
                    deduct_through_second_pool(d.source(), &ledger, m.coupon_id, m.order_id).await
                }
            })
            .effect(move |_, m| {
                let ledger = l2.clone();
                async move {
                    sqlx::query_scalar("SELECT COUNT(*) FROM deduction WHERE order_id = ?")
                        .bind(m.order_id)
                        .fetch_one(&ledger)
                        .await
                }
            })
            .scenarios([Scenario::RelayRestarted])
            .run()
            .await
            .expect("run");
    println!("{report}");
    let failures = report.failures();
    eprintln!("{}", failures.join("\n"));
    // The second and fourth actions: relay A died with its commit cut.
    assert_eq!(failures.len(), 2, "{failures:#?}");
    let first = &failures[0];
    assert!(
        first.starts_with(
            "acts_once: scenario \"relay restarted mid-drain\": action #1 (key \"coupon-deduct:101\"): effect counted 2, expected 1 (doubled): relay A died with its handler's commit cut"
        ),
        "{first}"
    );
    assert!(
        first.contains("written outside the handler's transaction"),
        "{first}"
    );
    assert!(panic_message(&report).contains(first.as_str()));
}

#[tokio::test]
async fn the_fault_version_is_caught_doubling_when_its_lease_runs_out() {
    let report = coupons("fault_version route")
        // On the relay's pool: the message is not fenced by the delivery.
        .route(TOPIC, |d: Delivery<Sqlite>, m: Deduct| {
            let pool = d.pool().clone();
            async move { Ok(fault_version(pool, m.coupon_id, m.order_id).await?) }
        })
        .run()
        .await
        .expect("run");
    println!("{report}");
    let failures = report.failures();
    eprintln!("{}", failures.join("\n"));
    let expired = report.scenario(Scenario::LeaseExpired).unwrap();
    assert_eq!(expired.doubled(), 4, "{report}");
    assert_eq!(
        report.scenario(Scenario::RelayRestarted).unwrap().doubled(),
        0,
        "{report}"
    );
    let first = &failures[0];
    assert!(
        first.starts_with(
            "acts_once: scenario \"lease expired under a slow handler\": action #4 (no key seen"
        ),
        "{first}"
    );
    assert!(
        first.contains("A's handler answered Executed, B's Executed"),
        "{first}"
    );
    assert!(first.contains("was not fenced off"), "{first}");
}

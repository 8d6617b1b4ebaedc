//! On SQLite (a database file of the run's own): the harness passes the
//! three strategies, and fails, naming the cause, the article's fault
//! version, a handler writing its effect through a second pool, and a key
//! template that leaves out what tells two actions apart.

mod coupons;

use coupons::{deduct_coupon, deduct_through_second_pool, fault_version, panic_message};
use idem_runtime::idempotent;
use idem_test::{ActsOnce, Report, Scenario};
use serde::Serialize;
use sqlx::{Sqlite, SqlitePool, Transaction};

// ---- the three strategies -------------------------------------------------

#[derive(Clone, Serialize)]
struct Notice {
    msg_id: String,
    user_id: i64,
    kind: String,
}

/// The README's `record` handler, in spirit: a notice sent once per message.
#[idempotent(key = "notice:{n.msg_id}", strategy = record, biz_type = "idem_test_notice")]
async fn send_notice(tx: &mut Transaction<'_, Sqlite>, n: &Notice) -> Result<String, sqlx::Error> {
    sqlx::query("INSERT INTO sent (msg_id, user_id, kind) VALUES (?, ?, ?)")
        .bind(&n.msg_id)
        .bind(n.user_id)
        .bind(&n.kind)
        .execute(&mut **tx)
        .await?;
    Ok("sms".into())
}

#[derive(Clone)]
struct Callback {
    serial: String,
    amount: i64,
}

/// A payment platform's callback, recorded once per serial.
#[idempotent(key = "pay:{cb.serial}", strategy = unique_insert, constraint = "payment.serial")]
async fn record_payment(
    tx: &mut Transaction<'_, Sqlite>,
    cb: &Callback,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO payment (serial, amount) VALUES (?, ?)")
        .bind(&cb.serial)
        .bind(cb.amount)
        .execute(&mut **tx)
        .await?;
    sqlx::query("INSERT INTO ledger (serial) VALUES (?)")
        .bind(&cb.serial)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A run of a coupon handler: coupon `n` deducted for order `100 + n`.
fn coupons() -> ActsOnce<Sqlite, (i64, i64)> {
    ActsOnce::sqlite("deduct_coupon", |n| (n as i64, 100 + n as i64))
        .setup(|pool| async move {
            sqlx::query("CREATE TABLE coupon (id INTEGER PRIMARY KEY, status TEXT NOT NULL)")
                .execute(&pool)
                .await?;
            sqlx::query("CREATE TABLE deduction (coupon_id INTEGER, order_id INTEGER)")
                .execute(&pool)
                .await?;
            Ok(())
        })
        .prepare(|pool, (coupon, _)| async move {
            sqlx::query("INSERT INTO coupon (id, status) VALUES (?, 'UNUSED')")
                .bind(coupon)
                .execute(&pool)
                .await?;
            Ok(())
        })
        .effect(|pool, (_, order)| async move {
            sqlx::query_scalar("SELECT COUNT(*) FROM deduction WHERE order_id = ?")
                .bind(order)
                .fetch_one(&pool)
                .await
        })
}

/// Every scenario ran, injected its faults, and found nothing wrong.
fn assert_passed(report: &Report) {
    println!("{report}");
    report.assert_acts_once();
    assert_eq!(report.scenarios.len(), Scenario::CALLS.len());
    for s in &report.scenarios {
        let wanted = match s.scenario {
            Scenario::Single => 0,
            Scenario::ConcurrentDuplicates | Scenario::LostAcks | Scenario::Cancelled => 4,
            _ => unreachable!(),
        };
        assert_eq!(s.faults(), wanted, "{}: faults injected", s.scenario.name());
    }
    let dup = report.scenario(Scenario::ConcurrentDuplicates).unwrap();
    assert_eq!((dup.calls(), dup.executed(), dup.duplicates()), (32, 4, 28));
}

#[tokio::test]
async fn state_machine_acts_once() {
    let report = coupons()
        .call(|pool, (coupon, order)| async move { deduct_coupon(&pool, coupon, order).await })
        .run()
        .await
        .expect("run");
    assert_passed(&report);
    let lost = report.scenario(Scenario::LostAcks).unwrap();
    // Each lost acknowledgement: the retry answered Duplicate.
    assert_eq!((lost.executed(), lost.duplicates()), (0, 4), "{report}");
}

/// `retries(0)` still retries a cancelled call once: left unretried, a
/// correct handler's cancelled action would read as a lost effect.
#[tokio::test]
async fn a_cancelled_call_is_retried_even_with_retries_0() {
    let report = coupons()
        .call(|pool, (coupon, order)| async move { deduct_coupon(&pool, coupon, order).await })
        .scenarios([Scenario::Cancelled])
        .retries(0)
        .run()
        .await
        .expect("run");
    report.assert_acts_once();
    let cancelled = report.scenario(Scenario::Cancelled).unwrap();
    assert_eq!(
        (cancelled.faults(), cancelled.executed()),
        (4, 4),
        "{report}"
    );
}

#[tokio::test]
async fn record_acts_once() {
    let report = ActsOnce::sqlite("send_notice", |n| Notice {
        msg_id: format!("m-{n}"),
        user_id: n as i64 % 3,
        kind: "shipped".into(),
    })
    .setup(|pool| async move {
        sqlx::query("CREATE TABLE sent (msg_id TEXT, user_id INTEGER, kind TEXT)")
            .execute(&pool)
            .await?;
        Ok(())
    })
    .call(|pool, n| async move { send_notice(&pool, &n).await })
    .effect(|pool, n| async move {
        sqlx::query_scalar("SELECT COUNT(*) FROM sent WHERE msg_id = ?")
            .bind(&n.msg_id)
            .fetch_one(&pool)
            .await
    })
    .run()
    .await
    .expect("run");
    assert_passed(&report);
}

#[tokio::test]
async fn unique_insert_acts_once() {
    let report = ActsOnce::sqlite("record_payment", |n| Callback {
        serial: format!("2026{n:08}"),
        amount: 100 + n as i64,
    })
    .setup(|pool| async move {
        sqlx::query("CREATE TABLE payment (serial TEXT PRIMARY KEY, amount INTEGER)")
            .execute(&pool)
            .await?;
        sqlx::query("CREATE TABLE ledger (serial TEXT)")
            .execute(&pool)
            .await?;
        Ok(())
    })
    .call(|pool, cb| async move { record_payment(&pool, &cb).await })
    .effect(|pool, cb| async move {
        sqlx::query_scalar("SELECT COUNT(*) FROM ledger WHERE serial = ?")
            .bind(&cb.serial)
            .fetch_one(&pool)
            .await
    })
    .run()
    .await
    .expect("run");
    assert_passed(&report);
}

// ---- three broken handlers, caught -----------------------------------------

#[tokio::test]
async fn the_fault_version_is_caught_doubling_under_concurrent_duplicates() {
    let report = coupons()
        .call(|pool, (coupon, order)| fault_version(pool, coupon, order))
        .run()
        .await
        .expect("run");
    println!("{report}");
    let failures = report.failures();
    eprintln!("{}", failures.join("\n"));
    let dup = report.scenario(Scenario::ConcurrentDuplicates).unwrap();
    assert!(dup.doubled() > 0, "{report}");
    assert!(
        failures
            .iter()
            .all(|f| f.starts_with("acts_once: scenario \"concurrent duplicates\": action #")),
        "only the concurrent duplicates double it: {failures:#?}"
    );
    let first = &failures[0];
    assert!(
        first.contains("(doubled)") && first.contains("concurrent calls executed"),
        "{first}"
    );
    assert!(
        first.contains("does not run in the call's transaction under a lock"),
        "{first}"
    );
    assert!(panic_message(&report).contains(first.as_str()));
}

#[tokio::test]
async fn a_second_pool_is_caught_doubling_after_a_cancelled_call() {
    let ledger = SqlitePool::connect("sqlite::memory:")
        .await
        .expect("ledger");
    sqlx::query("CREATE TABLE deduction (coupon_id INTEGER, order_id INTEGER)")
        .execute(&ledger)
        .await
        .expect("ledger table");
    let (l1, l2) = (ledger.clone(), ledger.clone());
    let report = ActsOnce::sqlite("deduct_through_second_pool", |n| (n as i64, 100 + n as i64))
        .setup(|pool| async move {
            sqlx::query("CREATE TABLE coupon (id INTEGER PRIMARY KEY, status TEXT NOT NULL)")
                .execute(&pool)
                .await?;
            Ok(())
        })
        .prepare(|pool, (coupon, _)| async move {
            sqlx::query("INSERT INTO coupon (id, status) VALUES (?, 'UNUSED')")
                .bind(coupon)
                .execute(&pool)
                .await?;
            Ok(())
        })
        .call(move |pool, (coupon, order)| {
            let ledger = l1.clone();
            async move { deduct_through_second_pool(&pool, &ledger, coupon, order).await }
        })
        .effect(move |_, (_, order)| {
            let ledger = l2.clone();
            async move {
                sqlx::query_scalar("SELECT COUNT(*) FROM deduction WHERE order_id = ?")
                    .bind(order)
                    .fetch_one(&ledger)
                    .await
            }
        })
        .run()
        .await
        .expect("run");
    println!("{report}");
    let failures = report.failures();
    eprintln!("{}", failures.join("\n"));
    assert_eq!(
        report.scenario(Scenario::Cancelled).unwrap().doubled(),
        4,
        "{report}"
    );
    assert_eq!(
        failures.len(),
        4,
        "only the cancelled calls double it: {failures:#?}"
    );
    let first = &failures[0];
    assert!(first.starts_with("acts_once: scenario \"cancelled before commit\": action #12 (key \"coupon-deduct:112\"): effect counted 2, expected 1 (doubled)"), "{first}");
    assert!(
        first.contains("written outside the call's transaction (a second pool or connection"),
        "{first}"
    );
    assert!(panic_message(&report).contains(first.as_str()));
}

#[derive(Clone, Serialize)]
struct OrderNotice {
    order_id: i64,
    kind: String,
}

/// Two notices per order ("shipped", "delivered"), but the key names the
/// order only: the second is taken for a duplicate of the first.
#[idempotent(
    key = "order-notice:{n.order_id}",
    strategy = record,
    biz_type = "idem_test_order_notice",
    fingerprint = [n.order_id],
)]
async fn notify_order(
    tx: &mut Transaction<'_, Sqlite>,
    n: &OrderNotice,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO sent (order_id, kind) VALUES (?, ?)")
        .bind(n.order_id)
        .bind(&n.kind)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_key_missing_a_field_is_caught_losing_an_action() {
    let report = ActsOnce::sqlite("notify_order", |n| OrderNotice {
        order_id: n as i64 / 2,
        kind: if n % 2 == 0 { "shipped" } else { "delivered" }.into(),
    })
    .setup(|pool| async move {
        sqlx::query("CREATE TABLE sent (order_id INTEGER, kind TEXT)")
            .execute(&pool)
            .await?;
        Ok(())
    })
    .call(|pool, n| async move { notify_order(&pool, &n).await })
    .effect(|pool, n| async move {
        sqlx::query_scalar("SELECT COUNT(*) FROM sent WHERE order_id = ? AND kind = ?")
            .bind(n.order_id)
            .bind(&n.kind)
            .fetch_one(&pool)
            .await
    })
    .run()
    .await
    .expect("run");
    println!("{report}");
    let failures = report.failures();
    eprintln!("{}", failures.join("\n"));
    let single = report.scenario(Scenario::Single).unwrap();
    assert_eq!((single.lost(), single.doubled()), (2, 0), "{report}");
    let first = &failures[0];
    assert!(
        first.starts_with("acts_once: scenario \"single calls\": action #1 (key \"order-notice:0\"): effect counted 0, expected 1 (lost): its one call answered Duplicate"),
        "{first}"
    );
    assert!(
        first.contains("actions #0 and #1 derived the same key \"order-notice:0\": the key template leaves out what tells the two actions apart"),
        "{first}"
    );
    assert!(panic_message(&report).contains(first.as_str()));
}

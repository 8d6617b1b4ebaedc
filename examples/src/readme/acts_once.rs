//! Guide, "Prove your handlers act once": a payment handler put through
//! `idem_test::ActsOnce` on SQLite (a database file of the run's own, no
//! server), called directly and then behind relays, every payment's ledger
//! rows counted in the database.

use idem_runtime::{idempotent, outbox};
use idem_test::{ActsOnce, Report};
use serde::{Deserialize, Serialize};
use sqlx::{Sqlite, SqlitePool, Transaction};

// README: acts_once_handler
#[derive(Clone, Serialize, Deserialize)]
struct Payment { serial: String, amount: i64 }

// Records a platform's payment once per serial: the row and its ledger entry.
#[idempotent(key = "pay:{p.serial}", strategy = unique_insert, constraint = "payment.serial")]
async fn record_payment(tx: &mut Transaction<'_, Sqlite>, p: &Payment) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO payment (serial, amount) VALUES (?, ?)")
        .bind(&p.serial).bind(p.amount).execute(&mut **tx).await?;
    sqlx::query("INSERT INTO ledger (serial, amount) VALUES (?, ?)")
        .bind(&p.serial).bind(p.amount).execute(&mut **tx).await?;
    Ok(())
}

// The run's tables, and one payment's effect: its ledger rows.
async fn tables(pool: SqlitePool) -> Result<(), sqlx::Error> {
    sqlx::query("CREATE TABLE payment (serial TEXT PRIMARY KEY, amount INTEGER NOT NULL)").execute(&pool).await?;
    sqlx::query("CREATE TABLE ledger (serial TEXT NOT NULL, amount INTEGER NOT NULL)").execute(&pool).await?;
    Ok(())
}

async fn ledger_rows(pool: SqlitePool, p: Payment) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT COUNT(*) FROM ledger WHERE serial = ?").bind(&p.serial).fetch_one(&pool).await
}
// README: end

/// Runs the chapter's proof over `record_payment` and answers its report
/// (`assert_acts_once` has passed when it answers).
pub async fn run() -> Result<Report, idem_test::Error> {
    // README: acts_once_run
    // In a #[tokio::test]: payment n has serial PAY<n>, 100 + n cents.
    let report = ActsOnce::sqlite("record_payment", |n| Payment { serial: format!("PAY{n}"), amount: 100 + n as i64 })
        .setup(tables)
        .call(|pool, p| async move { record_payment(&pool, &p).await })
        .effect(ledger_rows)   // one ledger row per payment, whatever arrived
        .run()
        .await?;
    report.assert_acts_once();   // panics, one line per action that did not act once
    println!("{report}");
    // README: end
    Ok(report)
}

/// The same handler behind relays: the chapter's route proof.
pub async fn run_route() -> Result<Report, idem_test::Error> {
    // README: acts_once_route
    // Each payment becomes a message on "payment.record", enqueued as your producer does;
    // the run's relays deliver it to the route, one dying mid-delivery, one losing its lease.
    let report = ActsOnce::sqlite("record_payment route", |n| Payment { serial: format!("PAY{n}"), amount: 100 + n as i64 })
        .setup(tables)
        .enqueue(|pool, p| async move {
            let mut tx = pool.begin().await?;
            let payload = serde_json::json!({ "serial": p.serial, "amount": p.amount });
            outbox::enqueue(&mut tx, "payment.record", &p.serial, &payload).await?;
            tx.commit().await?;
            Ok(())
        })
        .route("payment.record", |d, p: Payment| async move { record_payment(d.source(), &p).await })
        .effect(ledger_rows)
        .run()
        .await?;
    report.assert_acts_once();
    println!("{report}");
    // README: end
    Ok(report)
}

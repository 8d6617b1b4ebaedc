//! Guide, "Prove your handlers act once": a payment handler put through
//! `idem_test::ActsOnce` on SQLite (a database file of the run's own, no
//! server), every payment's ledger rows counted in the database.

use idem_runtime::idempotent;
use idem_test::{ActsOnce, Report};
use sqlx::{Sqlite, Transaction};

// README: acts_once_handler
#[derive(Clone)]
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
// README: end

/// Runs the chapter's proof over `record_payment` and answers its report
/// (`assert_acts_once` has passed when it answers).
pub async fn run() -> Result<Report, idem_test::Error> {
    // README: acts_once_run
    // In a #[tokio::test]: payment n has serial PAY<n>, 100 + n cents.
    let report = ActsOnce::sqlite("record_payment", |n| Payment { serial: format!("PAY{n}"), amount: 100 + n as i64 })
        .setup(|pool| async move {
            sqlx::query("CREATE TABLE payment (serial TEXT PRIMARY KEY, amount INTEGER NOT NULL)").execute(&pool).await?;
            sqlx::query("CREATE TABLE ledger (serial TEXT NOT NULL, amount INTEGER NOT NULL)").execute(&pool).await?;
            Ok(())
        })
        .call(|pool, p| async move { record_payment(&pool, &p).await })
        .effect(|pool, p| async move {   // one ledger row per payment, whatever arrived
            sqlx::query_scalar("SELECT COUNT(*) FROM ledger WHERE serial = ?").bind(&p.serial).fetch_one(&pool).await
        })
        .run()
        .await?;
    report.assert_acts_once();   // panics, one line per action that did not act once
    println!("{report}");
    // README: end
    Ok(report)
}

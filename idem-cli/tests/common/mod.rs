//! What the CLI's test targets share (`cli.rs`, `cli_record.rs`): running
//! the `idem` binary, the databases (SQLite always, PostgreSQL and MariaDB
//! when reachable) and outbox rows. Each target uses only part of it.
#![allow(dead_code)]

pub(crate) use idem_runtime::Backend;
pub(crate) use idem_runtime::Dialect;
pub(crate) use idem_testkit::{any, ids, mysql_url, postgres_url, sql, sqlite_url};
pub(crate) use serde_json::Value;
pub(crate) use sqlx::{Any, AnyPool, Row};
pub(crate) use std::process::Output;

/// Runs `idem --database-url URL ARGS…`.
pub(crate) fn idem(url: &str, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .env_remove("DATABASE_URL")
        .arg("--database-url")
        .arg(url)
        .args(args)
        .output()
        .expect("run idem")
}

/// Runs it, asserts success, returns stdout.
pub(crate) fn ok(url: &str, args: &[&str]) -> String {
    let out = idem(url, args);
    assert!(
        out.status.success(),
        "idem {args:?} failed ({:?}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Runs it with `--json`, asserts success, parses stdout.
pub(crate) fn json(url: &str, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let text = ok(url, &all);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

pub(crate) fn dialect(pool: &AnyPool) -> Dialect {
    <Any as Backend>::pool_dialect(pool)
}

/// The databases to run on: SQLite always, the servers when reachable.
pub(crate) async fn databases() -> Vec<(String, AnyPool)> {
    let mut out = Vec::new();
    let lite = sqlite_url();
    let pool = any(&lite, 2).await.expect("sqlite never skips");
    out.push((lite, pool));
    for url in [postgres_url(), mysql_url()] {
        if let Some(pool) = any(&url, 2).await {
            out.push((url, pool));
        }
    }
    out
}

pub(crate) async fn insert_message(
    pool: &AnyPool,
    topic: &str,
    msg_id: &str,
    payload: &str,
    status: &str,
    attempts: i64,
    last_error: Option<&str>,
) -> i64 {
    let d = dialect(pool);
    sqlx::query(sql(
        d,
        "INSERT INTO idem_outbox (topic, msg_id, payload, status, attempts, last_error) \
         VALUES (?, ?, ?, ?, ?, ?)",
    ))
    .bind(topic)
    .bind(msg_id)
    .bind(payload)
    .bind(status)
    .bind(attempts)
    .bind(last_error)
    .execute(pool)
    .await
    .expect("insert outbox row");
    sqlx::query_scalar(sql(
        d,
        "SELECT id FROM idem_outbox WHERE topic = ? AND msg_id = ?",
    ))
    .bind(topic)
    .bind(msg_id)
    .fetch_one(pool)
    .await
    .expect("its id")
}

/// `(id, status, attempts, last_error)` of a topic's messages, by id.
pub(crate) async fn rows_of(
    pool: &AnyPool,
    topic: &str,
) -> Vec<(i64, String, i64, Option<String>)> {
    sqlx::query(sql(
        dialect(pool),
        "SELECT id, status, attempts, last_error FROM idem_outbox WHERE topic = ? ORDER BY id",
    ))
    .bind(topic)
    .fetch_all(pool)
    .await
    .expect("read outbox")
    .iter()
    .map(|r| {
        (
            r.get::<i64, _>(0),
            r.get::<String, _>(1),
            r.get::<i64, _>(2),
            r.get::<Option<String>, _>(3),
        )
    })
    .collect()
}

//! The `idem` binary through pgbouncer in transaction mode: without
//! `--transaction-pooling` a second `migrate` (a new client, on the server
//! connection the first one left its named statements on) fails with a
//! configuration error (exit code 2) that names the pooler and the flag;
//! with the flag (or `IDEM_TRANSACTION_POOLING=1`) `migrate` runs any
//! number of times and the outbox commands work. pgbouncer has one server
//! connection here, so every run meets the statements of the runs before.

mod common;
use common::*;
use idem_testkit::cluster::pgbouncer::{PgBouncer, PoolMode};

fn run(url: &str, env: Option<&str>, args: &[&str]) -> Output {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_idem"));
    c.env_remove("DATABASE_URL")
        .env_remove(idem_runtime::pooler::ENV)
        .args(["--database-url", url]);
    if let Some(v) = env {
        c.env(idem_runtime::pooler::ENV, v);
    }
    c.args(args).output().expect("run idem")
}

fn succeeded(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({:?}): {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_and_outbox_commands_through_pgbouncer_need_the_flag() {
    let Some(direct) = any(&postgres_url(), 2).await else {
        return;
    };
    let Some(bouncer) = PgBouncer::start("cli through pgbouncer", PoolMode::Transaction, 1) else {
        return;
    };
    let url = bouncer.url();

    // The control: no flag. Every run leaves its named statements on
    // pgbouncer's one server connection, so the second run (a new client)
    // collides with them; the first may already, when the CLI's two pooled
    // connections prepare the same statement name there.
    let first = run(&url, None, &["migrate"]);
    let second = run(&url, None, &["migrate"]);
    let err = String::from_utf8_lossy(&second.stderr);
    eprintln!(
        "cli through pgbouncer without the flag: first migrate {:?}, second {:?} {err}",
        first.status.code(),
        second.status.code()
    );
    assert_eq!(second.status.code(), Some(2), "{err}");
    for part in ["pgbouncer", "--transaction-pooling", "42P05"] {
        assert!(err.contains(part), "{part} missing: {err}");
    }

    // With the flag: twice, and idem's tables are all found there.
    for n in 0..2 {
        let out = run(&url, None, &["--transaction-pooling", "--json", "migrate"]);
        let report: Value =
            serde_json::from_str(&succeeded(&out, "migrate with the flag")).unwrap();
        assert_eq!(
            report["created"].as_array().unwrap().len(),
            0,
            "run {n}: {report}"
        );
        assert_eq!(
            report["already_present"].as_array().unwrap().len(),
            4,
            "run {n}: {report}"
        );
    }
    // The environment variable does the same.
    succeeded(
        &run(&url, Some("1"), &["migrate"]),
        "migrate with IDEM_TRANSACTION_POOLING=1",
    );

    // The outbox commands, through pgbouncer, checked in the database.
    let topic = format!("cli-bnc-{}", ids(1));
    let failed = insert_message(
        &direct,
        &topic,
        "f0",
        "{}",
        "failed",
        5,
        Some("handler: boom"),
    )
    .await;
    insert_message(&direct, &topic, "s0", "{}", "success", 1, None).await;
    let flag = "--transaction-pooling";
    let stats: Value = serde_json::from_str(&succeeded(
        &run(
            &url,
            None,
            &[flag, "--json", "outbox", "stats", "--topic", &topic],
        ),
        "outbox stats",
    ))
    .unwrap();
    let t = &stats["topics"][0];
    assert_eq!(
        (&t["failed"], &t["success"]),
        (&Value::from(1), &Value::from(1)),
        "{stats}"
    );
    let listed: Value = serde_json::from_str(&succeeded(
        &run(
            &url,
            None,
            &[flag, "--json", "outbox", "list", "--topic", &topic],
        ),
        "outbox list",
    ))
    .unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    succeeded(
        &run(&url, None, &[flag, "outbox", "requeue", "--topic", &topic]),
        "outbox requeue",
    );
    let rows = rows_of(&direct, &topic).await;
    assert_eq!(rows.len(), 2);
    let requeued = rows.iter().find(|r| r.0 == failed).unwrap();
    assert_eq!(
        (requeued.1.as_str(), requeued.2),
        ("pending", 0),
        "{rows:?}"
    );
    assert!(
        requeued
            .3
            .as_deref()
            .is_some_and(|e| e.starts_with("requeued: "))
    );
    eprintln!("cli through pgbouncer with the flag: migrate x3, outbox stats, list, requeue ok");
}

//! The `idem` binary against real databases: SQLite (a fresh file, always),
//! PostgreSQL and MariaDB when reachable (skipped locally when down, a
//! failure when `CI=true`).
//!
//! PostgreSQL and MariaDB are shared with other test suites, so each test
//! works on its own topics and keys, and requeues by `--topic` there
//! (`--all-failed` would touch other suites' rows); the SQLite file is the
//! test's own, so `--all-failed` is exercised there.
//!
//! `record show`: `cli_record.rs`.

mod common;
use common::*;
use idem_runtime::idempotent;
use idem_runtime::outbox::Relay;
use sqlx::Transaction;
use std::sync::Mutex;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_twice_is_fine() {
    // A fresh file: the first run creates everything.
    let url = sqlite_url();
    sqlx::any::install_default_drivers();
    let first = json(&url, &["migrate"]);
    assert_eq!(first["dialect"], "sqlite");
    assert_eq!(first["created"].as_array().unwrap().len(), 4, "{first}");
    let second = json(&url, &["migrate"]);
    assert_eq!(second["created"].as_array().unwrap().len(), 0, "{second}");
    assert_eq!(second["already_present"].as_array().unwrap().len(), 4);
    let text = ok(&url, &["migrate"]);
    assert!(text.contains("already present: idem_record"), "{text}");
    for (url, _pool) in databases().await {
        ok(&url, &["migrate"]);
        let again = json(&url, &["migrate"]);
        assert_eq!(
            again["created"].as_array().unwrap().len(),
            0,
            "{url}: {again}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_list_and_requeue_touch_only_failed_messages() {
    for (url, pool) in databases().await {
        let d = dialect(&pool);
        let topic = format!("cli-stats-{}", ids(1));
        let mut failed = Vec::new();
        for i in 0..3 {
            let id = insert_message(
                &pool,
                &topic,
                &format!("f{i}"),
                "{}",
                "failed",
                10,
                Some("handler: boom"),
            )
            .await;
            failed.push(id);
        }
        for i in 0..2 {
            insert_message(&pool, &topic, &format!("s{i}"), "{}", "success", 1, None).await;
        }
        insert_message(&pool, &topic, "p0", "{}", "pending", 0, None).await;

        // stats
        let stats = json(&url, &["outbox", "stats", "--topic", &topic]);
        let topics = stats["topics"].as_array().unwrap();
        assert_eq!(topics.len(), 1, "{d:?}: {stats}");
        let t = &topics[0];
        assert_eq!(t["topic"], topic.as_str());
        assert_eq!(
            (&t["pending"], &t["success"], &t["failed"], &t["total"]),
            (
                &Value::from(1),
                &Value::from(2),
                &Value::from(3),
                &Value::from(6)
            ),
            "{d:?}: {stats}"
        );
        let age = t["oldest_pending_age_secs"].as_f64().expect("an age");
        assert!((0.0..600.0).contains(&age), "{d:?}: age {age}");
        assert_eq!(stats["totals"]["total"], 6);
        let table = ok(&url, &["outbox", "stats", "--topic", &topic]);
        assert!(table.starts_with("TOPIC"), "{table}");
        assert!(table.contains(&topic), "{table}");

        // list
        let list = json(
            &url,
            &["outbox", "list", "--status", "failed", "--topic", &topic],
        );
        let list = list.as_array().unwrap();
        assert_eq!(list.len(), 3, "{d:?}: {list:?}");
        let listed: Vec<i64> = list.iter().map(|m| m["id"].as_i64().unwrap()).collect();
        assert_eq!(listed, failed);
        assert_eq!(list[0]["attempts"], 10);
        assert_eq!(list[0]["last_error"], "handler: boom");
        assert_eq!(list[0]["status"], "failed");
        assert!(list[0]["updated_at"].as_str().unwrap().starts_with("20"));
        let limited = json(&url, &["outbox", "list", "--topic", &topic, "--limit", "2"]);
        assert_eq!(limited.as_array().unwrap().len(), 2);

        // requeue: a dry run changes nothing.
        let before = rows_of(&pool, &topic).await;
        let target: Vec<&str> = if d == Dialect::Sqlite {
            vec!["--all-failed"]
        } else {
            vec!["--topic", &topic]
        };
        let mut args = vec!["outbox", "requeue"];
        args.extend(&target);
        args.push("--dry-run");
        let dry = json(&url, &args);
        assert_eq!(dry["dry_run"], true);
        assert_eq!(dry["requeued"], 3, "{d:?}: {dry}");
        assert_eq!(
            rows_of(&pool, &topic).await,
            before,
            "{d:?}: dry run changed rows"
        );
        let text = ok(&url, &args);
        assert!(
            text.contains("would be requeued; nothing changed"),
            "{text}"
        );
        assert_eq!(rows_of(&pool, &topic).await, before);

        // requeue for real: exactly the failed ones.
        args.pop();
        let done = json(&url, &args);
        assert_eq!(done["requeued"], 3, "{d:?}: {done}");
        let after = rows_of(&pool, &topic).await;
        for (b, a) in before.iter().zip(&after) {
            assert_eq!(a.0, b.0);
            if failed.contains(&b.0) {
                assert_eq!(a.1, "pending", "{d:?}");
                assert_eq!(a.2, 0, "{d:?}: attempts reset");
                assert_eq!(a.3.as_deref(), Some("requeued: handler: boom"));
            } else {
                assert_eq!(a, b, "{d:?}: a non-failed message changed");
            }
        }
        let lease: i64 = sqlx::query_scalar(sql(
            d,
            "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND lease_owner IS NOT NULL",
        ))
        .bind(&topic)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(lease, 0);
        // Nothing failed is left: a second run requeues nothing.
        let again = json(&url, &args);
        assert_eq!(again["requeued"], 0);
        let stats = json(&url, &["outbox", "stats", "--topic", &topic]);
        assert_eq!(stats["topics"][0]["pending"], 4, "{d:?}: {stats}");
        assert_eq!(stats["topics"][0]["failed"], 0);
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Job {
    key: String,
}

/// Keys the handler body ran for.
static RUNS: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[idempotent(key = "cli-relay:{job.key}", strategy = record, biz_type = "cli_relay", biz_no = job.key)]
async fn handle(tx: &mut Transaction<'_, Any>, job: &Job) -> Result<String, sqlx::Error> {
    let _ = tx;
    RUNS.lock().unwrap().push(job.key.clone());
    Ok(format!("done {}", job.key))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeued_message_is_delivered_once_and_its_record_shows() {
    for (url, pool) in databases().await {
        let d = dialect(&pool);
        let n = ids(1);
        let topic = format!("cli-relay-{n}");
        let key = format!("k{n}");
        let payload = serde_json::json!({ "key": key }).to_string();
        let id = insert_message(&pool, &topic, "m1", &payload, "failed", 10, Some("gave up")).await;
        // Not failed: --id on a pending message changes nothing.
        let other = insert_message(&pool, &topic, "m2", "{}", "success", 1, None).await;
        let none = json(&url, &["outbox", "requeue", "--id", &other.to_string()]);
        assert_eq!(none["requeued"], 0);

        let done = json(&url, &["outbox", "requeue", "--id", &id.to_string()]);
        assert_eq!(done["requeued"], 1, "{d:?}: {done}");

        let relay = Relay::new(pool.clone()).route(topic.clone(), |dl, job: Job| async move {
            handle(dl.source(), &job).await
        });
        assert_eq!(relay.run_once().await.expect("relay"), 1, "{d:?}");
        assert_eq!(relay.run_once().await.expect("relay"), 0, "{d:?}");
        let runs = RUNS.lock().unwrap().iter().filter(|k| **k == key).count();
        assert_eq!(runs, 1, "{d:?}: the body ran {runs} times");
        let rows = rows_of(&pool, &topic).await;
        assert_eq!(rows[0].1, "success", "{d:?}: {rows:?}");

        // Its record, written by the handler's transaction.
        let rec = json(&url, &["record", "show", &format!("cli-relay:{key}")]);
        assert_eq!(rec["archived"], false, "{d:?}: {rec}");
        assert_eq!(rec["biz_type"], "cli_relay");
        assert_eq!(rec["biz_no"], key.as_str());
        assert_eq!(rec["result"], format!("\"done {key}\""));
    }
}

#[test]
fn help_works_for_every_command() {
    for args in [
        vec!["--help"],
        vec!["migrate", "--help"],
        vec!["outbox", "--help"],
        vec!["outbox", "stats", "--help"],
        vec!["outbox", "list", "--help"],
        vec!["outbox", "requeue", "--help"],
        vec!["archive", "--help"],
        vec!["record", "--help"],
        vec!["record", "show", "--help"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .env_remove("DATABASE_URL")
            .args(&args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage: idem"), "{args:?}: {text}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["outbox", "requeue", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("--all-failed") && text.contains("--dry-run"),
        "{text}"
    );
}

/// `DATABASE_URL=` (set but empty, or blank) is unset: a usage error that
/// names the variable, never an attempt to open the URL "" ("relative URL
/// without a base"); `--database-url` still wins over it.
#[test]
fn an_empty_database_url_means_unset() {
    for value in ["", "  "] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .env("DATABASE_URL", value)
            .args(["migrate"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "DATABASE_URL={value:?}: {err}");
        assert!(
            err.contains("DATABASE_URL is set but empty") && err.contains("--database-url"),
            "DATABASE_URL={value:?}: {err}"
        );
    }
    let url = sqlite_url();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .env("DATABASE_URL", "")
        .args(["--database-url", &url, "--json", "migrate"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(done["dialect"], "sqlite", "{done}");
}

#[test]
fn errors_are_clear_and_non_zero() {
    let run = |url: Option<&str>, args: &[&str]| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_idem"));
        c.env_remove("DATABASE_URL");
        if let Some(u) = url {
            c.args(["--database-url", u]);
        }
        c.args(args).output().unwrap()
    };
    // No URL.
    let out = run(None, &["migrate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("DATABASE_URL"));
    // Unknown scheme.
    let out = run(Some("nosuchdb://x"), &["migrate"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect to nosuchdb://x"));
    // Server down (nothing listens on port 1); the password is not shown.
    let out = run(
        Some("postgres://u:secret@127.0.0.1:1/db"),
        &["outbox", "stats"],
    );
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot connect to postgres://u:***@127.0.0.1:1/db"),
        "{err}"
    );
    assert!(
        !err.contains("secret") && !err.contains("panicked"),
        "{err}"
    );
    // Requeue needs exactly one target.
    let out = run(Some("sqlite::memory:"), &["outbox", "requeue"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(
        Some("sqlite::memory:"),
        &["outbox", "requeue", "--id", "1", "--all-failed"],
    );
    assert_eq!(out.status.code(), Some(2));
    // Bad duration.
    let out = run(
        Some("sqlite::memory:"),
        &["archive", "--outbox-retention", "7x"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid duration"));
}

//! The operator's actions through the `idem` binary against real
//! databases (SQLite, a fresh file, always; PostgreSQL and MariaDB when
//! reachable): `outbox show | discard | retry-now | pause | resume |
//! paused`, the requeue's log entry, `processes` and `request`. The
//! servers are shared with other suites: each test works on its own
//! topics, ids, process ids and keys, and checks the rows it changed.

mod common;
use common::*;
use idem_runtime::requests::record_key;

/// Runs `idem --database-url URL ARGS…` as the login `user`.
fn idem_as(user: &str, url: &str, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .env_remove("DATABASE_URL")
        .env_remove("LOGNAME")
        .env("USER", user)
        .arg("--database-url")
        .arg(url)
        .args(args)
        .output()
        .expect("run idem")
}

/// [`idem_as`], asserting success; stdout.
fn ok_as(user: &str, url: &str, args: &[&str]) -> String {
    let out = idem_as(user, url, args);
    assert!(
        out.status.success(),
        "idem {args:?} failed ({:?}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// A message's attempt log: `(attempt, outcome, detail, actor)`, oldest first.
async fn log(pool: &AnyPool, id: i64) -> Vec<(i64, String, Option<String>, Option<String>)> {
    sqlx::query(sql(
        dialect(pool),
        "SELECT attempt, outcome, detail, actor FROM idem_outbox_attempt WHERE outbox_id = ? ORDER BY id",
    ))
    .bind(id)
    .fetch_all(pool)
    .await
    .expect("read the log")
    .iter()
    .map(|r| (r.get::<i64, _>(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

/// `(status, last_error)` of message `id` in the history.
async fn archived(pool: &AnyPool, id: i64) -> Option<(String, Option<String>)> {
    sqlx::query(sql(
        dialect(pool),
        "SELECT status, last_error FROM idem_outbox_history WHERE id = ?",
    ))
    .bind(id)
    .fetch_optional(pool)
    .await
    .expect("read the history")
    .map(|r| (r.get(0), r.get(1)))
}

/// Schedules pending message `id`'s next attempt an hour from now.
async fn wait_an_hour(pool: &AnyPool, id: i64) {
    let later = match dialect(pool) {
        Dialect::Postgres => {
            "UPDATE idem_outbox SET next_attempt_at = now() + interval '1 hour' WHERE id = ?"
        }
        Dialect::MySql => {
            "UPDATE idem_outbox SET next_attempt_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR WHERE id = ?"
        }
        Dialect::Sqlite => {
            "UPDATE idem_outbox SET next_attempt_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '+1 hour') WHERE id = ?"
        }
    };
    sqlx::query(sql(dialect(pool), later))
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
}

/// Whether message `id` is due (its next attempt not in the future).
async fn is_due(pool: &AnyPool, id: i64) -> bool {
    let due = match dialect(pool) {
        Dialect::Postgres => {
            "SELECT COUNT(*) FROM idem_outbox WHERE id = ? AND next_attempt_at <= now()"
        }
        Dialect::MySql => {
            "SELECT COUNT(*) FROM idem_outbox WHERE id = ? AND next_attempt_at <= UTC_TIMESTAMP(6)"
        }
        Dialect::Sqlite => {
            "SELECT COUNT(*) FROM idem_outbox WHERE id = ? AND next_attempt_at <= strftime('%Y-%m-%d %H:%M:%f', 'now')"
        }
    };
    let n: i64 = sqlx::query_scalar(sql(dialect(pool), due))
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
    n == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_discard_and_retry_now_change_the_rows() {
    for (url, pool) in databases().await {
        let d = dialect(&pool);
        let topic = format!("cli-act-{}", ids(1));
        let dead = insert_message(&pool, &topic, "d", "{\"n\":1}", "failed", 3, Some("boom")).await;
        let waiting = insert_message(&pool, &topic, "w", "{}", "pending", 2, Some("flaky")).await;
        wait_an_hour(&pool, waiting).await;

        let shown = json(&url, &["outbox", "show", &dead.to_string()]);
        assert_eq!(shown["message"]["status"], "failed", "{d:?}: {shown}");
        assert_eq!(shown["message"]["payload"], "{\"n\":1}");
        assert_eq!(shown["message"]["archived_at"], Value::Null);
        assert_eq!(shown["attempts"], serde_json::json!([]));

        // Refused before any change: no reason, a blank one.
        let out = idem_as("ann", &url, &["outbox", "discard", &dead.to_string()]);
        assert_eq!(out.status.code(), Some(2), "--reason is required");
        let out = idem_as(
            "ann",
            &url,
            &["outbox", "discard", &dead.to_string(), "--reason", " "],
        );
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("reason"));
        assert_eq!(rows_of(&pool, &topic).await.len(), 2);

        let text = ok_as(
            "ann",
            &url,
            &[
                "outbox",
                "discard",
                &dead.to_string(),
                "--reason",
                "bad data",
            ],
        );
        assert!(text.contains("1 message(s) discarded"), "{text}");
        assert_eq!(
            rows_of(&pool, &topic).await.len(),
            1,
            "moved out of idem_outbox"
        );
        assert_eq!(
            archived(&pool, dead).await,
            Some(("failed".into(), Some("discarded: bad data".into())))
        );
        assert_eq!(
            log(&pool, dead).await,
            vec![(
                3,
                "discarded".into(),
                Some("bad data".into()),
                Some("cli:ann".into())
            )]
        );
        let shown = json(&url, &["outbox", "show", &dead.to_string()]);
        assert_ne!(shown["message"]["archived_at"], Value::Null, "{shown}");
        assert_eq!(shown["attempts"][0]["outcome"], "discarded");
        let table = ok(&url, &["outbox", "show", &dead.to_string()]);
        assert!(
            table.contains("discarded: bad data") && table.contains("cli:ann"),
            "{table}"
        );

        let report = json(
            &url,
            &[
                "outbox",
                "retry-now",
                &waiting.to_string(),
                &dead.to_string(),
            ],
        );
        assert_eq!(report["done"], serde_json::json!([waiting]), "{report}");
        assert_eq!(
            report["skipped"],
            serde_json::json!([dead]),
            "discarded: no longer online"
        );
        assert!(is_due(&pool, waiting).await, "due now");
        assert_eq!(rows_of(&pool, &topic).await[0].2, 2, "attempts kept");

        let out = idem(
            &url,
            &["outbox", "show", &(waiting + 1_000_000).to_string()],
        );
        assert_eq!(out.status.code(), Some(1), "no such message");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_logs_who_requeued() {
    for (url, pool) in databases().await {
        let topic = format!("cli-rq-{}", ids(1));
        let id = insert_message(&pool, &topic, "r", "{}", "failed", 4, Some("boom")).await;
        ok_as("bo", &url, &["outbox", "requeue", "--id", &id.to_string()]);
        assert_eq!(rows_of(&pool, &topic).await[0].1, "pending");
        assert_eq!(
            log(&pool, id).await,
            vec![(4, "requeued".into(), None, Some("cli:bo".into()))]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_and_paused() {
    for (url, pool) in databases().await {
        let d = dialect(&pool);
        let topic = format!("cli-pause-{}", ids(1));
        let text = ok_as(
            "cy",
            &url,
            &["outbox", "pause", &topic, "--reason", "smtp down"],
        );
        assert!(text.contains("paused topic"), "{text}");
        let again = json(&url, &["outbox", "pause", &topic]);
        assert_eq!(again["changed"], false, "{again}");
        let row: (Option<String>, Option<String>) = sqlx::query_as(sql(
            d,
            "SELECT reason, paused_by FROM idem_topic_pause WHERE topic = ?",
        ))
        .bind(&topic)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(row, (Some("smtp down".into()), Some("cli:cy".into())));
        let listed = json(&url, &["outbox", "paused"]);
        let mine: Vec<&Value> = listed
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["topic"] == topic.as_str())
            .collect();
        assert_eq!(mine.len(), 1, "{listed}");
        assert_eq!(mine[0]["reason"], "smtp down");
        assert!(ok(&url, &["outbox", "paused"]).contains(&topic));
        assert_eq!(json(&url, &["outbox", "resume", &topic])["changed"], true);
        let text = ok(&url, &["outbox", "resume", &topic]);
        assert!(text.contains("was not paused"), "{text}");
        let left: i64 = sqlx::query_scalar(sql(
            d,
            "SELECT COUNT(*) FROM idem_topic_pause WHERE topic = ?",
        ))
        .bind(&topic)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(left, 0);
        let out = idem(&url, &["outbox", "pause", "bad\ttopic"]);
        assert_eq!(out.status.code(), Some(2), "a control character");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_and_request_show_what_is_stored() {
    for (url, pool) in databases().await {
        let d = dialect(&pool);
        let n = ids(1);
        let process = format!("cli-relay-{n}");
        sqlx::query(sql(
            d,
            "INSERT INTO idem_process (id, kind, name, host, pid) VALUES (?, 'relay', ?, 'h1', 42)",
        ))
        .bind(&process)
        .bind(format!("mail-{n}"))
        .execute(&pool)
        .await
        .unwrap();
        let all = json(&url, &["processes"]);
        let mine: Vec<&Value> = all
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["id"] == process.as_str())
            .collect();
        assert_eq!(mine.len(), 1, "{all}");
        assert_eq!(
            (mine[0]["kind"].as_str(), mine[0]["pid"].as_i64()),
            (Some("relay"), Some(42))
        );
        assert!(mine[0]["heartbeat_age_secs"].as_f64().unwrap() >= 0.0);
        assert!(ok(&url, &["processes"]).contains(&process));

        let key = format!("order-{n}");
        let insert = match d {
            Dialect::Postgres => {
                "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, result, expire_time) \
                 VALUES (?, 'cli-http', ?, 'fp', ?, now() + interval '1 day')"
            }
            Dialect::MySql => {
                "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time) \
                 VALUES (?, 'cli-http', ?, 'fp', ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 DAY)"
            }
            Dialect::Sqlite => {
                "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, result, expire_time) \
                 VALUES (?, 'cli-http', ?, 'fp', ?, strftime('%Y-%m-%d %H:%M:%f', 'now', '+1 day'))"
            }
        };
        sqlx::query(sql(d, insert))
            .bind(record_key("alice", &key))
            .bind(&key)
            .bind(r#"{"status":201,"headers":[],"body":{"text":"made"}}"#)
            .execute(&pool)
            .await
            .unwrap();
        let found = json(&url, &["request", "--key", &key, "--caller", "alice"]);
        assert_eq!(found["state"], "answered", "{d:?}: {found}");
        assert_eq!(
            (
                found["response_status"].as_i64(),
                found["response_body"].as_str()
            ),
            (Some(201), Some("made"))
        );
        assert_eq!(found["scope"], "cli-http");
        assert!(ok(&url, &["request", "--key", &key, "--caller", "alice"]).contains("answered"));
        let out = idem(&url, &["request", "--key", &key, "--caller", "bob"]);
        assert_eq!(out.status.code(), Some(1), "another caller's key");
        let out = idem(&url, &["request", "--key", "", "--caller", "alice"]);
        assert_eq!(out.status.code(), Some(2));
    }
}

#[test]
fn help_works_for_the_new_commands() {
    for args in [
        vec!["outbox", "show", "--help"],
        vec!["outbox", "discard", "--help"],
        vec!["outbox", "retry-now", "--help"],
        vec!["outbox", "pause", "--help"],
        vec!["outbox", "resume", "--help"],
        vec!["outbox", "paused", "--help"],
        vec!["processes", "--help"],
        vec!["request", "--help"],
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
}

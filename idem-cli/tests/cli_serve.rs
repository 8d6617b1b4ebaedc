//! `idem serve` as a process: it says where it listens, serves the console,
//! `/health` and `/metrics` (with its own counters), refuses writes without
//! its token, and stops cleanly on SIGTERM. On SQLite (a fresh file) and,
//! when reachable, PostgreSQL and MariaDB.

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const TOKEN: &str = "cli-serve-token-0123456789";

struct Server {
    child: Child,
    base: String,
    /// Its stderr after the line naming its address.
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `idem serve` on a free port; its first line on stderr names it.
fn serve(url: &str, token: Option<&str>) -> Server {
    serve_with(url, token, &[]).0
}

/// `serve` with more arguments; also the line that named the address.
fn serve_with(url: &str, token: Option<&str>, more: &[&str]) -> (Server, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.env_remove("DATABASE_URL")
        .env_remove("IDEM_WRITE_TOKEN")
        .args(["--database-url", url, "serve", "--listen", "127.0.0.1:0"])
        .args(more)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(t) = token {
        cmd.env("IDEM_WRITE_TOKEN", t);
    }
    let mut child = cmd.spawn().expect("start idem serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // The line naming the address: after any log line the start wrote
    // (a slow statement's warning on a loaded machine).
    let first = lines
        .by_ref()
        .map(|l| l.expect("utf-8"))
        .find(|l| l.contains("http://"))
        .expect("a line naming the address");
    let base = first
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .map(|hostport| format!("http://{hostport}"))
        .unwrap_or_else(|| panic!("no address in {first:?}"));
    // Keep draining stderr so the server never blocks on it.
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = log.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            kept.lock().unwrap().push(line);
        }
    });
    (Server { child, base, log }, first)
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// POSTs the requeue of message `id` (up to itself) with the token as a
/// bearer; the status code.
async fn requeue_by_bearer(base: &str, id: i64) -> u16 {
    http()
        .post(format!("{base}/requeue"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("id={id}&max_id={id}"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_the_console_and_stops_on_sigterm() {
    for (url, pool) in databases().await {
        let d = dialect(&pool);
        let topic = format!("cli-serve-{}", ids(1));
        let dead = insert_message(&pool, &topic, "m1", "{}", "failed", 4, Some("boom")).await;

        // Read-only: pages and metrics, and a refused write.
        let ro = serve(&url, None);
        let health = http()
            .get(format!("{}/health", ro.base))
            .send()
            .await
            .unwrap();
        assert_eq!(health.status(), 200, "{d:?}");
        let page = http()
            .get(format!("{}/dead-letters?topic={topic}", ro.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(page.contains("boom") && page.contains("read-only"), "{d:?}");
        let refused = requeue_by_bearer(&ro.base, dead).await;
        assert_eq!(refused, 403, "{d:?}");
        drop(ro);
        assert_eq!(rows_of(&pool, &topic).await[0].1, "failed", "{d:?}");

        // With the token: a requeue, counted in /metrics.
        let mut rw = serve(&url, Some(TOKEN));
        let done = requeue_by_bearer(&rw.base, dead).await;
        assert_eq!(done, 200, "{d:?}");
        assert_eq!(rows_of(&pool, &topic).await[0].1, "pending", "{d:?}");
        let metrics = http()
            .get(format!("{}/metrics", rw.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics
                .lines()
                .any(|l| l == "idem_console_requeued_total 1"),
            "{d:?}: {metrics}"
        );
        assert!(
            metrics.contains(&format!("idem_outbox_pending{{topic=\"{topic}\"}} 1")),
            "{d:?}: {metrics}"
        );
        // SIGTERM: a clean stop, exit 0.
        let pid = rw.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let mut status = None;
        for _ in 0..100 {
            if let Some(s) = rw.child.try_wait().unwrap() {
                status = Some(s);
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let status = status.expect("idem serve stops within 5 s of SIGTERM");
        assert!(status.success(), "{d:?}: {status:?}");
    }
}

/// `--log-format json`: each operator action is one JSON line on stderr,
/// its `idem::audit` event, with who asked and what it did: a requeue
/// (what and how many it requeued), then a pause, one event each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_logs_each_requeue_as_a_json_line() {
    for (url, pool) in databases().await {
        let d = dialect(&pool);
        let topic = format!("cli-serve-log-{}", ids(1));
        let dead = insert_message(&pool, &topic, "m1", "{}", "failed", 4, Some("boom")).await;
        let (rw, _) = serve_with(&url, Some(TOKEN), &["--log-format", "json"]);
        assert_eq!(requeue_by_bearer(&rw.base, dead).await, 200, "{d:?}");
        assert_eq!(rows_of(&pool, &topic).await[0].1, "pending", "{d:?}");
        let paused = http()
            .post(format!("{}/topics/pause", rw.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("topic={topic}&reason=maintenance"))
            .send()
            .await
            .unwrap();
        assert_eq!(paused.status().as_u16(), 200, "{d:?}");
        let audits = || -> Vec<serde_json::Value> {
            rw.log
                .lock()
                .unwrap()
                .iter()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|v| v["target"] == "idem::audit")
                .collect()
        };
        for _ in 0..100 {
            if audits().len() >= 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let audits = audits();
        let [event, pause] = audits.as_slice() else {
            panic!("{d:?}: one audit event per action, not {audits:?}")
        };
        assert_eq!(pause["fields"]["action"], "pause", "{d:?}: {pause}");
        assert_eq!(pause["fields"]["topic"], topic.as_str(), "{d:?}: {pause}");
        let resumed = idem_runtime::outbox::admin::resume(&pool, &topic, "cli_serve test").await;
        assert_eq!(resumed.ok(), Some(true), "{d:?}");
        assert_eq!(event["level"], "INFO", "{d:?}: {event}");
        assert_eq!(event["fields"]["action"], "requeue", "{d:?}: {event}");
        assert_eq!(event["fields"]["requeued"], 1, "{d:?}: {event}");
        assert_eq!(event["fields"]["max_id"], dead, "{d:?}: {event}");
        let actor = event["fields"]["actor"].as_str().unwrap_or_default();
        assert!(actor.starts_with("console:"), "{d:?}: {event}");
    }
}

#[test]
fn serve_refuses_a_short_token_a_taken_port_and_an_unmigrated_database() {
    let idem = |url: &str, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_idem"))
            .env_remove("DATABASE_URL")
            .env_remove("IDEM_WRITE_TOKEN")
            .args(["--database-url", url])
            .args(args)
            .output()
            .unwrap()
    };
    let refused = |out: Output, says: &str| {
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{err}");
    };
    let url = sqlite_url();
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .env_remove("DATABASE_URL")
        .env("IDEM_WRITE_TOKEN", "short")
        .args(["--database-url", &url, "serve", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    refused(out, "at least 16 characters");

    // A database without idem's tables: refused at start, not page by page.
    refused(
        idem(&url, &["serve", "--listen", "127.0.0.1:0"]),
        "no idem_record, idem_outbox, idem_record_history, idem_outbox_history tables: \
         run `idem migrate` on it first",
    );
    assert!(idem(&url, &["migrate"]).status.success());

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    refused(
        idem(&url, &["serve", "--listen", &addr]),
        "cannot listen on",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_under_a_path_prefix_keeps_every_page_under_it() {
    let url = sqlite_url();
    let _migrated = any(&url, 1).await.expect("sqlite never skips");
    let (server, said) = serve_with(&url, None, &["--path-prefix", "/ops/idem"]);
    let base = &server.base;
    assert!(said.contains(&format!("{base}/ops/idem/ ")), "{said}");
    let get = |path: &'static str| {
        let url = format!("{base}{path}");
        async move {
            let r = http().get(url).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (status, html) = get("/ops/idem/").await;
    assert_eq!(status, 200);
    assert!(html.contains(r#"href="/ops/idem/dead-letters""#), "{html}");
    assert!(!html.contains(r#"href="/dead-letters""#), "{html}");
    assert_eq!(get("/ops/idem/health").await.0, 200);
    assert_eq!(get("/health").await.0, 404);

    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .env_remove("DATABASE_URL")
        .env_remove("IDEM_WRITE_TOKEN")
        .args(["--database-url", &url, "serve", "--listen", "127.0.0.1:0"])
        .args(["--path-prefix", "ops/../idem"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unusable mount path"), "{err}");
}

/// `idem serve`'s guards as a process: another `Host` is refused (421)
/// while `--allowed-host` and `--public-origin` names are answered; a
/// sign-in whose `Origin` is the public origin passes although `Host` is
/// the internal address; a token easy to guess is refused at start-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_its_hosts_accepts_its_public_origin_and_refuses_a_weak_token() {
    let url = sqlite_url();
    let _migrated = any(&url, 1).await.expect("sqlite never skips");
    let (server, _) = serve_with(
        &url,
        Some(TOKEN),
        &[
            "--allowed-host",
            "console.internal",
            "--public-origin",
            "https://console.example.com",
        ],
    );
    let base = &server.base;
    for (host, expected) in [
        ("evil.example", 421),
        ("console.internal:8080", 200),
        ("console.example.com", 200),
        ("localhost", 200),
    ] {
        let r = http()
            .get(format!("{base}/health"))
            .header("host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), expected, "{host}");
    }
    let sign_in = |origin: &'static str| {
        http()
            .post(format!("{base}/login"))
            .header("origin", origin)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={TOKEN}"))
            .send()
    };
    // reqwest follows the redirect to the overview: 200 after signing in.
    assert_eq!(sign_in("https://evil.example").await.unwrap().status(), 403);
    assert_eq!(
        sign_in("https://console.example.com")
            .await
            .unwrap()
            .status(),
        200
    );

    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .env_remove("DATABASE_URL")
        .env("IDEM_WRITE_TOKEN", "aaaaaaaaaaaaaaaa")
        .args(["--database-url", &url, "serve", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("easy to guess") && err.contains("openssl rand -hex 16"),
        "{err}"
    );
}

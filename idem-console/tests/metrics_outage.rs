//! `/metrics` when the database fails (issue 24, defect 6): a read that
//! fails is reported as the database down, with a scrape-error counter,
//! and the last known outbox gauges stay, marked stale; a black-holed
//! server is reported down within Prometheus's 10 s scrape timeout.
//! The failures are forced, not waited for: the table the figures are
//! read from renamed away (SQLite, PostgreSQL, MariaDB), a server that
//! accepts connections and never answers (PostgreSQL's and MariaDB's
//! protocols).

mod common;
use common::*;
use std::time::{Duration, Instant};

fn has(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

/// The value of the sample `name` (no labels).
fn value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

async fn scrape(base: &str) -> String {
    let r = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("GET /metrics");
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    r.text().await.expect("the body")
}

async fn rename(db: &Db, from: &str, to: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE {from} RENAME TO {to}"
    )))
    .execute(&db.pool)
    .await
    .unwrap_or_else(|e| panic!("{:?}: rename {from}: {e}", db.d));
}

/// Scrapes until `until` holds (at most 10 s); the last scrape.
async fn scrape_until(base: &str, until: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let text = scrape(base).await;
        if until(&text) || start.elapsed() > Duration::from_secs(10) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_read_is_the_database_down_with_the_last_gauges_marked_stale() {
    for db in databases("metrics_outage").await {
        let d = db.d;
        // A run that failed half-way left it.
        sqlx::query("DROP TABLE IF EXISTS idem_outbox_away")
            .execute(&db.pool)
            .await
            .expect("drop");
        db.message("payments", "p0", "pending", 0, None).await;
        db.message("payments", "f0", "failed", 5, Some("boom"))
            .await;
        let served =
            serve(Console::new(db.pool.clone()).sample_every(Duration::from_millis(100))).await;
        let gauges = [
            r#"idem_outbox_pending{topic="payments"} 1"#,
            r#"idem_outbox_failed{topic="payments"} 1"#,
        ];
        let up = scrape(&served.base).await;
        for line in gauges.iter().copied().chain(["idem_console_database_up 1"]) {
            assert!(has(&up, line), "{d:?}: no {line:?} in\n{up}");
        }
        // The server still answers pings; the figures' query fails.
        rename(&db, "idem_outbox", "idem_outbox_away").await;
        let down = scrape_until(&served.base, |t| has(t, "idem_console_database_up 0")).await;
        rename(&db, "idem_outbox_away", "idem_outbox").await;
        assert!(
            has(&down, "idem_console_database_up 0"),
            "{d:?}: the figures' query fails and the database is reported up:\n{down}"
        );
        assert!(
            value(&down, "idem_console_scrape_errors_total").is_some_and(|n| n >= 1.0),
            "{d:?}: no scrape error counted:\n{down}"
        );
        for line in gauges.iter().copied().chain(["idem_console_stale 1"]) {
            assert!(has(&down, line), "{d:?}: no {line:?} in\n{down}");
        }
        assert!(
            value(&down, "idem_console_gauges_age_seconds").is_some_and(|a| a > 0.0),
            "{d:?}: no age of the stale gauges:\n{down}"
        );
        // Back: fresh figures again.
        let back = scrape_until(&served.base, |t| {
            has(t, "idem_console_database_up 1") && has(t, "idem_console_stale 0")
        })
        .await;
        assert!(
            has(&back, "idem_console_database_up 1") && has(&back, "idem_console_stale 0"),
            "{d:?}: not up again:\n{back}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_database_is_reported_down_within_the_scrape_timeout() {
    sqlx::any::install_default_drivers();
    // A server that accepts connections and never answers.
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let port = hole.local_addr().unwrap().port();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = hole.accept().await {
            held.push(socket);
        }
    });
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    for url in [
        format!("postgres://postgres@127.0.0.1:{port}/test"),
        format!("mysql://root@127.0.0.1:{port}/test"),
    ] {
        let pool = sqlx::any::AnyPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(30))
            .connect_lazy(&url)
            .expect("a lazy pool");
        let served = serve(Console::new(pool)).await;
        for n in 1..=2 {
            let start = Instant::now();
            let r = client
                .get(format!("{}/metrics", served.base))
                .send()
                .await
                .unwrap_or_else(|e| panic!("{url}: no answer within Prometheus's 10 s: {e}"));
            let text = r.text().await.expect("the body");
            let took = start.elapsed();
            assert!(took < Duration::from_secs(8), "{url}: {took:?}");
            assert!(has(&text, "idem_console_database_up 0"), "{url}:\n{text}");
            assert_eq!(
                value(&text, "idem_console_scrape_errors_total"),
                Some(f64::from(n)),
                "{url}:\n{text}"
            );
            assert!(has(&text, "idem_console_stale 1"), "{url}:\n{text}");
        }
        let start = Instant::now();
        let r = client
            .get(format!("{}/health", served.base))
            .send()
            .await
            .expect("/health answers");
        assert_eq!(r.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
        assert!(start.elapsed() < Duration::from_secs(8), "{url}");
    }
    holder.abort();
}

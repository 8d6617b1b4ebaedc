//! A database outage on every page (issue 45): 503 with `Retry-After`,
//! not 500 "Database error", and within one bound on every page (the
//! console's 3 s answer check), not after the pool's acquire timeout (10 s
//! on `/archive` and `/requeue` under `idem serve`). The outages are
//! forced: the path to a real PostgreSQL or MariaDB server black-holed
//! through the test kit's fault proxy once the console has connections
//! (skipped when the server is down, a failure when `CI=true`), a server
//! that accepts connections and never answers, and one that refuses them.
//! A query the database refuses stays a 500.

mod common;
use common::*;
use idem_testkit::proxy::FaultProxy;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use std::time::{Duration, Instant};

const TOKEN: &str = "outage-write-token-7d2e9a41c05b";

/// The console's answer check (`read::READ_TIMEOUT`, 3 s) and a margin for
/// a loaded machine: no page may take longer during an outage. (The pools
/// below wait 30 s for a connection, sqlx's default: the bound must be the
/// console's own.)
const BOUND: Duration = Duration::from_secs(3 + 5);

/// The pages that read the database, and the confirmation of a requeue.
const PAGES: &[&str] = &[
    "/",
    "/live",
    "/messages?status=failed",
    "/dead-letters",
    "/requeue?all=1",
    "/records?key=k-1",
    "/archive",
    "POST /requeue",
];

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        // Past it the page hung: a failure, not a wait.
        .timeout(Duration::from_secs(40))
        .build()
        .unwrap()
}

/// `page` of `base` (a bearer's confirmation of message 1 for `POST
/// /requeue`): its status, `Retry-After`, body and how long it took.
async fn fetch(base: &str, page: &str) -> (StatusCode, Option<String>, String, Duration) {
    let start = Instant::now();
    let request = match page.strip_prefix("POST ") {
        Some(path) => client()
            .post(format!("{base}{path}"))
            .header(AUTHORIZATION, format!("Bearer {TOKEN}"))
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body("id=1&max_id=1"),
        None => client().get(format!("{base}{page}")),
    };
    let r = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{page}: no answer: {e}"));
    let status = r.status();
    let retry = r
        .headers()
        .get(RETRY_AFTER)
        .map(|v| v.to_str().unwrap_or("?").to_string());
    let body = r.text().await.unwrap_or_default();
    (status, retry, body, start.elapsed())
}

/// Every page answers 503 with `Retry-After`, each within [`BOUND`];
/// `/health` too. The pages are asked all at once, as by several tabs.
async fn every_page_is_unavailable(base: &str, what: &str) {
    let asked: Vec<_> = PAGES
        .iter()
        .copied()
        .chain(["/health"])
        .map(|page| {
            let base = base.to_string();
            (page, tokio::spawn(async move { fetch(&base, page).await }))
        })
        .collect();
    for (page, answer) in asked {
        let (status, retry, body, took) = answer.await.expect("the request's task");
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{what} {page}: after {took:?}: {body}"
        );
        assert!(
            retry.as_deref().is_some_and(|r| r.parse::<u64>().is_ok()),
            "{what} {page}: Retry-After {retry:?}"
        );
        assert!(took < BOUND, "{what} {page}: answered after {took:?}");
        if page != "/health" {
            assert!(
                body.contains("Database unavailable"),
                "{what} {page}: {body}"
            );
        }
    }
}

fn console(pool: AnyPool) -> Console<Any> {
    Console::new(pool)
        .write_token(TOKEN)
        .expect("a strong token")
}

/// A pool as `idem serve`'s, but waiting for a connection as long as
/// sqlx's default (30 s).
fn lazy_pool(url: &str) -> AnyPool {
    sqlx::any::install_default_drivers();
    sqlx::any::AnyPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(30))
        .connect_lazy(url)
        .expect("a lazy pool")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_answers_503_while_the_database_is_black_holed() {
    for db in databases("outage").await {
        if db.d == Dialect::Sqlite {
            continue; // no network to black-hole
        }
        let d = db.d;
        db.message("payments", "p1", "failed", 5, Some("boom"))
            .await;
        let proxy = FaultProxy::for_url(&db.url, 0.0)
            .await
            .expect("the fault proxy");
        let served = serve(console(lazy_pool(&proxy.url(&db.url)))).await;
        // Up: every page reads the database through the proxy, so the
        // pool holds connections when the path goes silent.
        for page in PAGES.iter().filter(|p| !p.starts_with("POST")) {
            let (status, _, body, _) = fetch(&served.base, page).await;
            // (No record with that key: 404.)
            assert!(
                status == StatusCode::OK || status == StatusCode::NOT_FOUND,
                "{d:?} {page}: {status} {body}"
            );
        }
        proxy.set_black_hole(true);
        every_page_is_unavailable(&served.base, &format!("{d:?} black-holed")).await;
        // Lifted: the pages answer again.
        proxy.set_black_hole(false);
        let start = Instant::now();
        loop {
            let (status, _, body, _) = fetch(&served.base, "/dead-letters").await;
            if status == StatusCode::OK {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{d:?}: not back 30 s after the hole was lifted: {status} {body}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_answers_503_when_the_database_never_answers_or_refuses() {
    // A server that accepts connections and never answers.
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let silent = hole.local_addr().unwrap().port();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = hole.accept().await {
            held.push(socket);
        }
    });
    // A port nothing listens on (bound, then closed).
    let refusing = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().unwrap().port()
    };
    for port in [silent, refusing] {
        for url in [
            format!("postgres://postgres@127.0.0.1:{port}/test"),
            format!("mysql://root@127.0.0.1:{port}/test"),
        ] {
            let served = serve(console(lazy_pool(&url))).await;
            every_page_is_unavailable(&served.base, &url).await;
        }
    }
    holder.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_the_database_refuses_is_still_a_500() {
    let db = databases("outage_refused")
        .await
        .into_iter()
        .next()
        .expect("sqlite");
    sqlx::query("DROP TABLE IF EXISTS idem_outbox_away")
        .execute(&db.pool)
        .await
        .expect("drop");
    let served = serve(console(db.pool.clone())).await;
    sqlx::query("ALTER TABLE idem_outbox RENAME TO idem_outbox_away")
        .execute(&db.pool)
        .await
        .expect("rename");
    let (status, retry, body, _) = fetch(&served.base, "/messages?status=failed").await;
    sqlx::query("ALTER TABLE idem_outbox_away RENAME TO idem_outbox")
        .execute(&db.pool)
        .await
        .expect("rename back");
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(retry, None);
    assert!(body.contains("Database error"), "{body}");
}

//! The operator's pages and actions in a real browser (headless Chromium
//! through chromedriver; skipped locally with a message when they are not
//! installed, a failure when `CI=true`), on SQLite, PostgreSQL and
//! MariaDB: a dead letter is opened from the dead letters, its attempt
//! log read, and it is discarded with a reason (gone from the dead
//! letters, archived with the reason); a topic is paused and resumed from
//! `/topics`; a request the `Idempotency-Key` layer kept is looked up; the
//! processes are listed. Every step is checked in the database.
//!
//! With `IDEM_CONSOLE_SHOTS=<directory>`, the first database's round
//! also saves a PNG of each page there (`message.png`, `discarded.png`,
//! `topics-paused.png`, `lookup.png`, `processes.png`).

mod common;
use common::*;
use idem_testkit::browser::Browser;
use idem_testkit::browser::fantoccini::{Client, Locator};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const TOKEN: &str = "browser-actions-token-3e9a07c5d1b6";

/// The element's text, if the page has it (none while a page loads).
async fn try_text(b: &Client, css: &str) -> Option<String> {
    let e = b.find(Locator::Css(css)).await.ok()?;
    Some(e.text().await.ok()?.trim().to_string())
}

/// Waits (up to 20 s) until the page has `css`; its text.
async fn wait_for(b: &Client, css: &str) -> String {
    let start = Instant::now();
    loop {
        if let Some(t) = try_text(b, css).await {
            return t;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting for {css} in {}",
            b.current_url()
                .await
                .map(|u| u.to_string())
                .unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn click(b: &Client, css: &str) {
    b.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css}: {e}"))
        .click()
        .await
        .unwrap();
}

async fn type_into(b: &Client, css: &str, text: &str) {
    b.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css}: {e}"))
        .send_keys(text)
        .await
        .unwrap();
}

/// Where to save the screenshots, if they are asked for.
fn shots() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("IDEM_CONSOLE_SHOTS").filter(|d| !d.is_empty())?);
    std::fs::create_dir_all(&dir).expect("the screenshots' directory");
    Some(dir)
}

/// Saves the page as `name` when the screenshots are asked for.
async fn shoot(browser: &Browser, dir: Option<&PathBuf>, name: &str) {
    if let Some(dir) = dir {
        browser.screenshot(&dir.join(name)).await;
    }
}

/// The incident: a dead letter with three failed attempts logged, beside
/// some traffic and two processes. Its id.
async fn incident(db: &Db) -> i64 {
    let d = db.d;
    sqlx::query(sql(
        d,
        "INSERT INTO idem_outbox (topic, msg_id, payload, headers, ordering_key, status, attempts, last_error) \
         VALUES ('charges', 'm-dead', ?, '{\"trace-id\":\"4bf92f35\"}', 'customer-17', 'failed', 3, \
         'handler: card processor timed out')",
    ))
    .bind(r#"{"order":"o-1017","amount":4200,"currency":"EUR"}"#)
    .execute(&db.pool)
    .await
    .unwrap();
    let dead = db
        .count("SELECT id FROM idem_outbox WHERE msg_id = 'm-dead'", &[])
        .await;
    for (n, outcome) in [(1, "retry"), (2, "retry"), (3, "dead")] {
        db.exec(format!(
            "INSERT INTO idem_outbox_attempt (outbox_id, attempt, outcome, detail, actor) \
             VALUES ({dead}, {n}, '{outcome}', 'card processor timed out after 30 s', 'relay-7f3a')"
        ))
        .await;
    }
    for i in 0..3 {
        db.message("mail", &format!("p{i}"), "pending", 0, None)
            .await;
    }
    db.message("mail", "f0", "failed", 8, Some("smtp: 550"))
        .await;
    let (a, b, c) = (db.now_plus(-900), db.now_plus(-2), db.now_plus(-40));
    db.exec(format!(
        "INSERT INTO idem_process (id, kind, name, host, pid, started_at, heartbeat_at) VALUES \
         ('relay-7f3a', 'relay', 'charges,mail', 'worker-1', 4242, {a}, {b}), \
         ('consumer-orders-2', 'consumer', 'orders', 'worker-2', 977, {a}, {c})"
    ))
    .await;
    dead
}

/// A request through the `Idempotency-Key` layer of an application on
/// the same database: the key it was sent with.
async fn a_kept_request(db: &Db) -> &'static str {
    let api_key = |p: &axum::http::request::Parts| {
        p.headers.get("x-api-key")?.to_str().ok().map(str::to_owned)
    };
    async fn pay(
        _tx: idem_runtime::http::RequestTx<Any>,
    ) -> (axum::http::StatusCode, &'static str) {
        (axum::http::StatusCode::CREATED, "{\"payment\":\"pay-88\"}")
    }
    let policy = idem_runtime::http::Idempotency::new("payments", api_key);
    let app = axum::Router::new().route(
        "/pay",
        axum::routing::post(pay).layer(policy.layer(&db.pool)),
    );
    let app = serve_router(app).await;
    let r = client()
        .post(format!("{}/pay", app.base))
        .header("x-api-key", "shop-42")
        .header("idempotency-key", "8e03978e-40d5-43e8")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::CREATED);
    "8e03978e-40d5-43e8"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_discards_a_dead_letter_pauses_a_topic_and_looks_up_a_request() {
    let Some(browser) = Browser::start("console_actions").await else {
        return;
    };
    let b = browser.client().clone();
    let shots = shots();
    for (round, db) in databases("browser_actions").await.into_iter().enumerate() {
        let dead = incident(&db).await;
        let key = a_kept_request(&db).await;
        let console = Console::new(db.pool.clone()).write_token(TOKEN).unwrap();
        let served = serve(console).await;
        let base = served.base.clone();
        let shots = shots.as_ref().filter(|_| round == 0);
        sign_in(&b, &base).await;
        discard_from_the_dead_letters(&browser, &db, &base, dead, shots).await;
        pause_and_resume(&browser, &db, &base, shots).await;
        look_up(&browser, &base, key, shots).await;
        b.goto(&format!("{base}/processes")).await.unwrap();
        wait_for(&b, "#processes").await;
        assert_eq!(
            try_text(&b, r#"tr[data-id="consumer-orders-2"] td.state"#)
                .await
                .as_deref(),
            Some("stale"),
            "{:?}",
            db.d
        );
        shoot(&browser, shots, "processes.png").await;
        b.delete_all_cookies().await.unwrap();
    }
    browser.close().await;
}

async fn sign_in(b: &Client, base: &str) {
    b.goto(&format!("{base}/login?next=/dead-letters"))
        .await
        .unwrap();
    type_into(b, "#token", TOKEN).await;
    click(b, "#sign-in-submit").await;
    let start = Instant::now();
    while try_text(b, "#mode").await.as_deref() != Some("write access") {
        assert!(start.elapsed() < Duration::from_secs(20), "not signed in");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// From the dead letters to the message's page, its attempt log read,
/// discarded with a reason: gone from the dead letters, archived with it.
async fn discard_from_the_dead_letters(
    browser: &Browser,
    db: &Db,
    base: &str,
    dead: i64,
    shots: Option<&PathBuf>,
) {
    let (b, d) = (browser.client(), db.d);
    b.goto(&format!("{base}/dead-letters")).await.unwrap();
    click(b, &format!(r#"tr[data-id="{dead}"] a.message-link"#)).await;
    assert_eq!(wait_for(b, "#msg-id").await, "m-dead", "{d:?}");
    let outcomes = b
        .find_all(Locator::Css("#attempt-log tbody tr"))
        .await
        .unwrap();
    assert_eq!(outcomes.len(), 3, "{d:?}");
    assert_eq!(
        try_text(b, "#attempt-log tbody tr:last-child td.outcome")
            .await
            .as_deref(),
        Some("dead")
    );
    assert!(
        wait_for(b, "#payload")
            .await
            .contains("\"order\": \"o-1017\"")
    );
    shoot(browser, shots, "message.png").await;
    let reason = "duplicate of order o-1016, refunded by hand";
    type_into(b, "#reason", reason).await;
    click(b, "#discard").await;
    assert!(
        wait_for(b, "#result").await.contains("was discarded"),
        "{d:?}"
    );
    shoot(browser, shots, "discarded.png").await;
    let (status, last_error): (String, String) = sqlx::query_as(sql(
        d,
        "SELECT status, last_error FROM idem_outbox_history WHERE id = ?",
    ))
    .bind(dead)
    .fetch_one(&db.pool)
    .await
    .expect("archived");
    assert_eq!(status, "failed", "{d:?}");
    assert!(last_error.contains(reason), "{d:?}: {last_error}");
    assert!(!db.rows().await.iter().any(|r| r.0 == dead), "{d:?}");
    b.goto(&format!("{base}/dead-letters")).await.unwrap();
    wait_for(b, "#count").await;
    assert!(
        b.find(Locator::Css(&format!(r#"tr[data-id="{dead}"]"#)))
            .await
            .is_err(),
        "{d:?}: still among the dead letters"
    );
    b.goto(&format!("{base}/messages/{dead}")).await.unwrap();
    assert!(wait_for(b, "#where").await.starts_with("archived"), "{d:?}");
    assert!(wait_for(b, "#last-error").await.contains(reason), "{d:?}");
}

/// `paused_by` of `topic`'s pause, if it is paused.
async fn paused_by(db: &Db, topic: &str) -> Option<String> {
    sqlx::query_scalar(sql(
        db.d,
        "SELECT paused_by FROM idem_topic_pause WHERE topic = ?",
    ))
    .bind(topic)
    .fetch_optional(&db.pool)
    .await
    .unwrap()
}

/// Pauses `mail` from `/topics` with a reason, then resumes it.
async fn pause_and_resume(browser: &Browser, db: &Db, base: &str, shots: Option<&PathBuf>) {
    let (b, d) = (browser.client(), db.d);
    let row = r#"tr[data-topic="mail"]"#;
    b.goto(&format!("{base}/topics")).await.unwrap();
    assert_eq!(
        wait_for(b, &format!("{row} td.state")).await,
        "running",
        "{d:?}"
    );
    type_into(b, &format!("{row} input.reason"), "SMTP relay maintenance").await;
    click(b, &format!("{row} button.pause")).await;
    assert!(wait_for(b, "#result").await.contains("is paused"), "{d:?}");
    let by = paused_by(db, "mail").await.expect("a pause row");
    assert!(by.starts_with("console:session-"), "{d:?}: {by}");
    click(b, "#back-to-topics").await;
    let state = wait_for(b, &format!("{row} td.state")).await;
    assert!(
        state.starts_with("paused") && state.contains("SMTP relay maintenance"),
        "{d:?}: {state}"
    );
    shoot(browser, shots, "topics-paused.png").await;
    click(b, &format!("{row} button.resume")).await;
    assert!(wait_for(b, "#result").await.contains("is resumed"), "{d:?}");
    assert_eq!(paused_by(db, "mail").await, None, "{d:?}: still paused");
}

/// Looks up the request sent with `key` by `shop-42`.
async fn look_up(browser: &Browser, base: &str, key: &str, shots: Option<&PathBuf>) {
    let b = browser.client();
    b.goto(&format!("{base}/lookup")).await.unwrap();
    type_into(b, "#key", key).await;
    type_into(b, "#caller", "shop-42").await;
    click(b, "#look-up").await;
    assert_eq!(wait_for(b, "#response-status").await, "201");
    assert_eq!(wait_for(b, "#state-badge").await, "answered");
    assert!(wait_for(b, "#response-body").await.contains("pay-88"));
    shoot(browser, shots, "lookup.png").await;
}

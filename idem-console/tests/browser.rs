//! The console in a real browser (headless Chromium, driven through
//! chromedriver; skipped locally with a message when they are not
//! installed, a failure when `CI=true`), on SQLite, PostgreSQL and
//! MariaDB: the overview's counts are the database's and refresh by
//! themselves; a dead letter requeued through the pages is delivered once
//! by a relay; a record is looked up; a write without the token is refused.
//! The second database's console is mounted under a path prefix inside an
//! application's router.

mod common;
use common::*;
use idem_runtime::idempotent;
use idem_runtime::outbox::Relay;
use idem_testkit::browser::Browser;
use idem_testkit::browser::fantoccini::{Client, Locator};
use sqlx::Transaction;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const TOKEN: &str = "browser-write-token-0123456789";

#[derive(serde::Serialize, serde::Deserialize)]
struct Charge {
    order: String,
}

/// Orders the handler's body ran for.
static CHARGED: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[idempotent(key = "charge:{c.order}", strategy = record, biz_type = "charge", biz_no = c.order)]
async fn charge(tx: &mut Transaction<'_, Any>, c: &Charge) -> Result<String, sqlx::Error> {
    let _ = tx;
    CHARGED.lock().unwrap().push(c.order.clone());
    Ok(format!("charged {}", c.order))
}

fn charged(order: &str) -> usize {
    CHARGED
        .lock()
        .unwrap()
        .iter()
        .filter(|o| *o == order)
        .count()
}

/// The element's text, if the page has it (none while a page loads).
async fn try_text(b: &Client, css: &str) -> Option<String> {
    let e = b.find(Locator::Css(css)).await.ok()?;
    Some(e.text().await.ok()?.trim().to_string())
}

async fn text(b: &Client, css: &str) -> String {
    match try_text(b, css).await {
        Some(t) => t,
        None => panic!(
            "no {css} in {}",
            b.current_url()
                .await
                .map(|u| u.to_string())
                .unwrap_or_default()
        ),
    }
}

async fn number(b: &Client, css: &str) -> i64 {
    let t = text(b, css).await;
    t.parse().unwrap_or_else(|_| panic!("{css} is {t:?}"))
}

/// Waits (up to 20 s) until `check` holds.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_requeues_a_dead_letter_and_the_relay_delivers_it_once() {
    let Some(browser) = Browser::start("an_operator_requeues_a_dead_letter").await else {
        return;
    };
    let b = browser.client().clone();
    for (round, db) in databases("browser").await.into_iter().enumerate() {
        let d = db.d;
        let order = format!("o-{}-{round}", idem_testkit::ids(1));
        let payload = serde_json::json!({ "order": order }).to_string();
        // The incident: a charge that gave up, beside some traffic.
        sqlx::query(sql(
            d,
            "INSERT INTO idem_outbox (topic, msg_id, payload, status, attempts, last_error) \
             VALUES ('charges', 'm-dead', ?, 'failed', 8, 'handler: card processor timed out')",
        ))
        .bind(&payload)
        .execute(&db.pool)
        .await
        .unwrap();
        let dead: i64 = db
            .count("SELECT id FROM idem_outbox WHERE msg_id = 'm-dead'", &[])
            .await;
        for i in 0..3 {
            db.message("mail", &format!("p{i}"), "pending", 0, None)
                .await;
        }
        db.message("mail", "s0", "success", 1, None).await;
        db.message("mail", "f0", "failed", 8, Some("smtp: 550"))
            .await;

        let console = Console::new(db.pool.clone())
            .write_token(TOKEN)
            .unwrap()
            .sample_every(Duration::from_millis(500));
        // Every other database's console is merged into an application
        // under a path prefix, as one inside an application is mounted:
        // the same steps must work there (links, forms, the cookie's path).
        let prefix = if round % 2 == 1 { "/ops/idem" } else { "" };
        let served = if prefix.is_empty() {
            serve(console).await
        } else {
            let app = axum::Router::new()
                .route("/", axum::routing::get(|| async { "the application" }))
                .merge(console.mount_at(prefix).unwrap().router());
            serve_router(app).await
        };
        let base = format!("{}{prefix}", served.base);

        // 1. The overview's counts are the database's.
        b.goto(&format!("{base}/")).await.unwrap();
        for (css, status) in [
            ("#total-pending", "pending"),
            ("#total-failed", "failed"),
            ("#total-success", "success"),
        ] {
            let in_db = match status {
                "pending" => {
                    db.count(
                        "SELECT COUNT(*) FROM idem_outbox WHERE status = 'pending'",
                        &[],
                    )
                    .await
                }
                "failed" => {
                    db.count(
                        "SELECT COUNT(*) FROM idem_outbox WHERE status = 'failed'",
                        &[],
                    )
                    .await
                }
                _ => {
                    db.count(
                        "SELECT COUNT(*) FROM idem_outbox WHERE status = 'success'",
                        &[],
                    )
                    .await
                }
            };
            assert_eq!(number(&b, css).await, in_db, "{d:?}: {css}");
        }
        assert_eq!(
            number(&b, r#"tr[data-topic="charges"] td.failed"#).await,
            1,
            "{d:?}"
        );
        assert_eq!(
            number(&b, r#"tr[data-topic="mail"] td.pending"#).await,
            3,
            "{d:?}"
        );
        assert_eq!(text(&b, "#mode").await, "read (signed out)");
        // ... and refresh by themselves: a new message shows up without a reload.
        db.message("mail", "p-new", "pending", 0, None).await;
        eventually("the overview refreshes", || {
            let b = b.clone();
            async move { try_text(&b, "#total-pending").await.as_deref() == Some("4") }
        })
        .await;

        // 2. Without the token, a write is refused: the preview offers a
        // sign-in instead of a confirmation, and a forged POST gets 403.
        b.goto(&format!("{base}/requeue?id={dead}")).await.unwrap();
        assert_eq!(number(&b, "#preview-count").await, 1, "{d:?}");
        assert!(b.find(Locator::Css("#confirm")).await.is_err(), "{d:?}");
        assert!(b.find(Locator::Css("#need-sign-in")).await.is_ok(), "{d:?}");
        let status = b
            .execute(
                "return fetch(arguments[1] + '/requeue', {method: 'POST', headers: {'Content-Type': \
                 'application/x-www-form-urlencoded'}, body: 'id=' + arguments[0] + \
                 '&max_id=' + arguments[0]}).then(r => r.status);",
                vec![serde_json::json!(dead), serde_json::json!(prefix)],
            )
            .await
            .unwrap();
        assert_eq!(status, serde_json::json!(403), "{d:?}");
        assert_eq!(
            db.status(dead).await,
            "failed",
            "{d:?}: a refused write changed the row"
        );

        // 3. Sign in, select the dead letter, preview, confirm.
        b.find(Locator::Css("#need-sign-in a"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        b.find(Locator::Css("#token"))
            .await
            .unwrap()
            .send_keys(TOKEN)
            .await
            .unwrap();
        b.find(Locator::Css("#sign-in-submit"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        eventually("signed in", || {
            let b = b.clone();
            async move { try_text(&b, "#mode").await.as_deref() == Some("write access") }
        })
        .await;
        let relay = Relay::new(db.pool.clone())
            .poll_interval(Duration::from_millis(100))
            .route("charges", |dl, c: Charge| async move {
                charge(dl.source(), &c).await
            })
            .spawn();
        b.goto(&format!("{base}/dead-letters?topic=charges"))
            .await
            .unwrap();
        assert!(
            text(&b, &format!(r#"tr[data-id="{dead}"] td.error"#))
                .await
                .contains("card processor timed out"),
            "{d:?}: the reason is shown"
        );
        b.find(Locator::Css(&format!(
            r#"input[name="id"][value="{dead}"]"#
        )))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
        b.find(Locator::Css("#preview-selected"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        eventually("the preview", || {
            let b = b.clone();
            async move { b.find(Locator::Css("#preview-count")).await.is_ok() }
        })
        .await;
        assert_eq!(number(&b, "#preview-count").await, 1, "{d:?}");
        assert_eq!(
            db.status(dead).await,
            "failed",
            "{d:?}: a preview changed the row"
        );
        b.find(Locator::Css("#confirm"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        eventually("the confirmation", || {
            let b = b.clone();
            async move { b.find(Locator::Css("#requeued-count")).await.is_ok() }
        })
        .await;
        assert_eq!(number(&b, "#requeued-count").await, 1, "{d:?}");

        // 4. The relay delivers it, once.
        let pool = db.pool.clone();
        eventually("the relay delivers the requeued message", || {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, String>(sql(
                    d,
                    "SELECT status FROM idem_outbox WHERE id = ?",
                ))
                .bind(dead)
                .fetch_one(&pool)
                .await
                .unwrap()
                    == "success"
            }
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        relay.shutdown().await;
        assert_eq!(
            charged(&order),
            1,
            "{d:?}: the charge ran {} times",
            charged(&order)
        );
        assert_eq!(db.status(dead).await, "success");
        // The overview follows (its figures are shared for one sampling
        // interval, so within that).
        eventually("the overview shows the delivery", || {
            let b = b.clone();
            let base = base.clone();
            async move {
                b.goto(&format!("{base}/")).await.unwrap();
                try_text(&b, r#"tr[data-topic="charges"] td.failed"#)
                    .await
                    .as_deref()
                    == Some("0")
                    && try_text(&b, r#"tr[data-topic="charges"] td.success"#)
                        .await
                        .as_deref()
                        == Some("1")
            }
        })
        .await;

        // 5. Its idempotency record, looked up by key.
        b.goto(&format!("{base}/records")).await.unwrap();
        b.find(Locator::Css("#key"))
            .await
            .unwrap()
            .send_keys(&format!("charge:{order}"))
            .await
            .unwrap();
        b.find(Locator::Css("#look-up"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        eventually("the record", || {
            let b = b.clone();
            async move { b.find(Locator::Css("table.record")).await.is_ok() }
        })
        .await;
        assert_eq!(text(&b, "td.biz-type").await, "charge", "{d:?}");
        assert_eq!(text(&b, "td.where").await, "online", "{d:?}");
        assert!(
            text(&b, "td.result")
                .await
                .contains(&format!("charged {order}")),
            "{d:?}"
        );

        // 6. Signed out, the same POST is refused again.
        b.find(Locator::Css("#who button"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        eventually("signed out", || {
            let b = b.clone();
            async move { try_text(&b, "#mode").await.as_deref() == Some("read (signed out)") }
        })
        .await;
        db.message("mail", "f-late", "failed", 8, Some("late"))
            .await;
        let late: i64 = db
            .count("SELECT id FROM idem_outbox WHERE msg_id = 'f-late'", &[])
            .await;
        let status = b
            .execute(
                "return fetch(arguments[1] + '/requeue', {method: 'POST', headers: {'Content-Type': \
                 'application/x-www-form-urlencoded'}, body: 'all=1&max_id=' + arguments[0]}).then(r => r.status);",
                vec![serde_json::json!(late), serde_json::json!(prefix)],
            )
            .await
            .unwrap();
        assert_eq!(status, serde_json::json!(403), "{d:?}");
        assert_eq!(db.status(late).await, "failed", "{d:?}");
        // Cookies are per console (127.0.0.1 with another port next round).
        b.delete_all_cookies().await.unwrap();
    }
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_console_shows_no_write_controls() {
    let Some(browser) = Browser::start("a_read_only_console_shows_no_write_controls").await else {
        return;
    };
    let b = browser.client().clone();
    let db = databases("browser_ro")
        .await
        .into_iter()
        .next()
        .expect("sqlite");
    let dead = db.message("t", "f", "failed", 3, Some("boom")).await;
    let served = serve(Console::new(db.pool.clone())).await;
    b.goto(&format!("{}/requeue?id={dead}", served.base))
        .await
        .unwrap();
    assert_eq!(text(&b, "#mode").await, "read-only");
    assert!(b.find(Locator::Css("#read-only")).await.is_ok());
    assert!(b.find(Locator::Css("#confirm")).await.is_err());
    b.goto(&format!("{}/login", served.base)).await.unwrap();
    assert!(
        b.find(Locator::Css("#token")).await.is_err(),
        "no sign-in form"
    );
    let status = b
        .execute(
            "return fetch('/requeue', {method: 'POST', headers: {'Content-Type': \
             'application/x-www-form-urlencoded', 'Authorization': 'Bearer ' + arguments[1]}, \
             body: 'id=' + arguments[0] + '&max_id=' + arguments[0]}).then(r => r.status);",
            vec![serde_json::json!(dead), serde_json::json!(TOKEN)],
        )
        .await
        .unwrap();
    assert_eq!(status, serde_json::json!(403));
    assert_eq!(db.status(dead).await, "failed");
    browser.close().await;
}

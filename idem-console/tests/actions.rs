//! The pages of one message, the topics, the processes and the HTTP
//! requests, and the operator's actions (retry now, discard, pause,
//! resume) over HTTP, on SQLite, PostgreSQL and MariaDB (through
//! `sqlx::Any`, as `idem serve` runs it). Every action is checked in the
//! database; every refused one (no token, no or a wrong CSRF token,
//! another origin, a read-only console) is checked to change nothing.

mod common;
use common::*;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, COOKIE};

const TOKEN: &str = "actions-write-token-8d2f6a1c94e7";

async fn get(url: &str, cookie: Option<&str>) -> (StatusCode, String) {
    let mut req = client().get(url);
    if let Some(c) = cookie {
        req = req.header(COOKIE, c);
    }
    let r = req.send().await.expect("GET");
    let status = r.status();
    (status, r.text().await.unwrap())
}

async fn post(url: &str, cookie: Option<&str>, body: String) -> (StatusCode, String) {
    let mut req = client()
        .post(url)
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(body);
    if let Some(c) = cookie {
        req = req.header(COOKIE, c);
    }
    let r = req.send().await.expect("POST");
    let status = r.status();
    (status, r.text().await.unwrap())
}

/// Inserts a message with its payload, headers and ordering key; its id.
async fn full_message(
    db: &Db,
    topic: &str,
    msg_id: &str,
    payload: &str,
    headers: Option<&str>,
    ordering_key: Option<&str>,
    status: &str,
) -> i64 {
    sqlx::query(sql(
        db.d,
        "INSERT INTO idem_outbox (topic, msg_id, payload, headers, ordering_key, status, attempts, last_error) \
         VALUES (?, ?, ?, ?, ?, ?, 3, 'handler: <b>boom</b>')",
    ))
    .bind(topic)
    .bind(msg_id)
    .bind(payload)
    .bind(headers)
    .bind(ordering_key)
    .bind(status)
    .execute(&db.pool)
    .await
    .expect("insert outbox row");
    db.count("SELECT id FROM idem_outbox WHERE msg_id = ?", &[msg_id])
        .await
}

/// Appends an entry to message `id`'s attempt log.
async fn log_attempt(db: &Db, id: i64, attempt: i64, outcome: &str, detail: &str, actor: &str) {
    sqlx::query(sql(
        db.d,
        "INSERT INTO idem_outbox_attempt (outbox_id, attempt, outcome, detail, actor) \
         VALUES (?, ?, ?, ?, ?)",
    ))
    .bind(id)
    .bind(attempt)
    .bind(outcome)
    .bind(detail)
    .bind(actor)
    .execute(&db.pool)
    .await
    .expect("insert attempt");
}

/// Gives message `id` a lease of `owner` ending `secs` from now (negative:
/// expired).
async fn lease(db: &Db, id: i64, owner: &str, secs: i64) {
    let until = db.now_plus(secs);
    db.exec(format!(
        "UPDATE idem_outbox SET lease_owner = '{owner}', locked_until = {until} WHERE id = {id}"
    ))
    .await;
}

/// Schedules message `id`'s next attempt `secs` from now.
async fn schedule(db: &Db, id: i64, secs: i64) {
    let at = db.now_plus(secs);
    db.exec(format!(
        "UPDATE idem_outbox SET next_attempt_at = {at} WHERE id = {id}"
    ))
    .await;
}

/// Whether message `id` is online and due (its next attempt not later
/// than the database's now).
async fn due(db: &Db, id: i64) -> bool {
    let q = format!(
        "SELECT COUNT(*) FROM idem_outbox WHERE id = {id} AND next_attempt_at <= {}",
        db.now_plus(0)
    );
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(q))
        .fetch_one(&db.pool)
        .await
        .unwrap()
        == 1
}

/// Everything an action may change: the outbox's rows, the history's,
/// the attempt log's and the paused topics.
async fn snapshot(
    db: &Db,
) -> (
    Vec<(i64, String, i64, Option<String>)>,
    i64,
    i64,
    Vec<String>,
) {
    let paused = sqlx::query_scalar("SELECT topic FROM idem_topic_pause ORDER BY topic")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    (
        db.rows().await,
        db.count("SELECT COUNT(*) FROM idem_outbox_history", &[])
            .await,
        db.count("SELECT COUNT(*) FROM idem_outbox_attempt", &[])
            .await,
        paused,
    )
}

/// The rows of the table `id` in the page.
fn rows_of(html: &str, id: &str) -> usize {
    let Some(at) = html.find(&format!("id=\"{id}\"")) else {
        return 0;
    };
    let table = &html[at..html[at..].find("</table>").map_or(html.len(), |e| at + e)];
    table.matches("<tr").count() - 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_page_shows_its_fields_payload_headers_and_attempt_log() {
    for db in databases("message_page").await {
        let d = db.d;
        let payload = r#"{"order":"o-1","note":"<script>alert(1)</script>"}"#;
        let headers = r#"{"trace-id":"t-<1>","n":2}"#;
        let dead = full_message(
            &db,
            "charges",
            "m-dead",
            payload,
            Some(headers),
            Some("cust-9"),
            "failed",
        )
        .await;
        log_attempt(&db, dead, 1, "retry", "timeout <a>", "relay-a").await;
        log_attempt(&db, dead, 2, "retry", "timeout", "relay-b").await;
        log_attempt(&db, dead, 3, "dead", "gave up", "relay-b").await;
        let raw = full_message(
            &db,
            "charges",
            "m-raw",
            "<not json>",
            Some("not {json"),
            None,
            "pending",
        )
        .await;
        lease(&db, raw, "relay-c", 60).await;
        let served = serve(Console::new(db.pool.clone())).await;
        let base = &served.base;

        let (status, html) = get(&format!("{base}/messages/{dead}"), None).await;
        assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
        assert_eq!(text_of(&html, "topic").as_deref(), Some("charges"), "{d:?}");
        assert_eq!(text_of(&html, "msg-id").as_deref(), Some("m-dead"));
        assert_eq!(text_of(&html, "status").as_deref(), Some("failed"));
        assert_eq!(number_of(&html, "attempts"), 3);
        assert_eq!(text_of(&html, "ordering-key").as_deref(), Some("cust-9"));
        assert_eq!(text_of(&html, "where").as_deref(), Some("online"));
        assert_eq!(
            text_of(&html, "lease-state").as_deref(),
            Some("none"),
            "{d:?}: {:?}",
            text_of(&html, "lease")
        );
        for id in ["created", "updated", "next-attempt"] {
            assert!(text_of(&html, id).unwrap().starts_with("20"), "{d:?} {id}");
        }
        assert!(html.contains("handler: &lt;b&gt;boom&lt;/b&gt;"), "{d:?}");
        // The log, oldest first, escaped.
        assert_eq!(rows_of(&html, "attempt-log"), 3, "{d:?}: {html}");
        let outcomes: Vec<&str> = html
            .split("data-outcome=\"")
            .skip(1)
            .map(|s| &s[..s.find('"').unwrap()])
            .collect();
        assert_eq!(outcomes, ["retry", "retry", "dead"], "{d:?}");
        assert!(
            html.contains("timeout &lt;a&gt;") && html.contains("relay-b"),
            "{d:?}"
        );
        // Headers as a table; the payload pretty-printed, escaped.
        assert_eq!(rows_of(&html, "headers"), 2, "{d:?}");
        assert!(html.contains("t-&lt;1&gt;"), "{d:?}");
        assert!(html.contains("data-json=\"true\""), "{d:?}");
        assert!(
            html.contains("\n  &quot;order&quot;: &quot;o-1&quot;"),
            "{d:?}: not pretty: {html}"
        );
        assert!(!html.contains("<script>alert"), "{d:?}");
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{d:?}"
        );
        // Read-only: no action forms.
        assert!(html.contains(r#"id="read-only""#) && !html.contains(r#"id="discard-form""#));

        other_pages(d, base, dead, raw).await;
    }
}

/// The POSTs of the actions, as a form would send them with `csrf`: what
/// each names (a message, a topic).
fn action_posts(dead: i64, csrf: &str) -> Vec<(String, String)> {
    let c = csrf.to_string();
    vec![
        (
            format!("/messages/{dead}/retry-now"),
            form(&[("csrf", c.clone())]),
        ),
        (
            format!("/messages/{dead}/discard"),
            form(&[("csrf", c.clone()), ("reason", "no".into())]),
        ),
        (
            "/topics/pause".into(),
            form(&[("csrf", c.clone()), ("topic", "mail".into())]),
        ),
        (
            "/topics/resume".into(),
            form(&[("csrf", c), ("topic", "paused".into())]),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_actions_change_nothing() {
    for db in databases("actions_refused").await {
        let d = db.d;
        let dead = db.message("mail", "f0", "failed", 5, Some("boom")).await;
        db.exec(
            "INSERT INTO idem_topic_pause (topic, reason, paused_by) VALUES ('paused', 'r', 'me')"
                .into(),
        )
        .await;
        let before = snapshot(&db).await;

        // A read-only console: every action 403, even with a bearer.
        let ro = serve(Console::new(db.pool.clone())).await;
        for (path, body) in action_posts(dead, "") {
            let (status, html) = post(&format!("{}{path}", ro.base), None, body.clone()).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{d:?} {path}: {html}");
            let r = client()
                .post(format!("{}{path}", ro.base))
                .header(AUTHORIZATION, format!("Bearer {TOKEN}"))
                .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "{d:?} {path}");
        }

        let served = serve(Console::new(db.pool.clone()).write_token(TOKEN).unwrap()).await;
        let base = &served.base;
        let cookie = sign_in_with(base, TOKEN).await;
        let (_, page) = get(&format!("{base}/messages/{dead}"), Some(&cookie)).await;
        let csrf = input_value(&page, "csrf").expect("the page's forms");
        for (path, body) in action_posts(dead, &csrf) {
            let url = format!("{base}{path}");
            // No session (the CSRF token alone is nothing).
            let (status, _) = post(&url, None, body.clone()).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{d:?} {path}: no session");
            // A session without its CSRF token, or with a wrong one.
            for bad in [
                String::new(),
                "00ff".into(),
                csrf[..csrf.len() - 2].to_string(),
            ] {
                let body = body.replace(&format!("csrf={csrf}"), &format!("csrf={bad}"));
                let (status, _) = post(&url, Some(&cookie), body).await;
                assert_eq!(status, StatusCode::FORBIDDEN, "{d:?} {path}: csrf {bad:?}");
            }
            // Another origin, with everything else right.
            for (header, value) in [
                ("origin", "http://evil.test"),
                ("sec-fetch-site", "cross-site"),
            ] {
                let r = client()
                    .post(&url)
                    .header(COOKIE, &cookie)
                    .header(header, value)
                    .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(body.clone())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), StatusCode::FORBIDDEN, "{d:?} {path}: {header}");
                assert!(
                    r.text()
                        .await
                        .unwrap()
                        .contains("cross-origin request refused")
                );
            }
            // A wrong bearer.
            let r = client()
                .post(&url)
                .header(AUTHORIZATION, "Bearer wrong-token-0123456789abc")
                .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(
                r.status(),
                StatusCode::FORBIDDEN,
                "{d:?} {path}: wrong bearer"
            );
        }
        assert_eq!(
            snapshot(&db).await,
            before,
            "{d:?}: a refused action changed the database"
        );
    }
}

/// `POST` of `path` with `fields` and the session's CSRF token.
async fn act(
    base: &str,
    cookie: &str,
    csrf: &str,
    path: &str,
    fields: &[(&str, &str)],
) -> (StatusCode, String) {
    let mut pairs: Vec<(&str, String)> = vec![("csrf", csrf.to_string())];
    pairs.extend(fields.iter().map(|(k, v)| (*k, v.to_string())));
    post(&format!("{base}{path}"), Some(cookie), form(&pairs)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_now_makes_a_message_due_and_discard_archives_it_with_its_reason() {
    for db in databases("actions_effects").await {
        let d = db.d;
        let dead = db
            .message("mail", "f0", "failed", 5, Some("smtp 550"))
            .await;
        let dead2 = db
            .message("mail", "f1", "failed", 5, Some("smtp 550"))
            .await;
        let waiting = db
            .message("mail", "p0", "pending", 2, Some("timeout"))
            .await;
        schedule(&db, waiting, 3600).await;
        let flying = db.message("mail", "p1", "pending", 1, None).await;
        lease(&db, flying, "relay-a", 120).await;
        let delivered = db.message("mail", "s0", "success", 1, None).await;
        let served = serve(Console::new(db.pool.clone()).write_token(TOKEN).unwrap()).await;
        let base = &served.base;
        let cookie = sign_in_with(base, TOKEN).await;
        let (status, page) = get(&format!("{base}/messages/{dead}"), Some(&cookie)).await;
        assert_eq!(status, StatusCode::OK, "{d:?}: {page}");
        assert!(
            page.contains(r#"id="retry-form""#) && page.contains(r#"id="discard-form""#),
            "{d:?}"
        );
        let csrf = input_value(&page, "csrf").unwrap();

        // Retry now: the dead letter pending again, attempts 0, due now.
        let (status, html) = act(
            base,
            &cookie,
            &csrf,
            &format!("/messages/{dead}/retry-now"),
            &[],
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
        assert_eq!(
            text_of(&html, "result").map(|t| t.contains("is due now")),
            Some(true),
            "{html}"
        );
        let row = db.rows().await.into_iter().find(|r| r.0 == dead).unwrap();
        assert_eq!((row.1.as_str(), row.2), ("pending", 0), "{d:?}");
        assert!(due(&db, dead).await, "{d:?}: not due now");
        let actor: String = sqlx::query_scalar(sql(
            d,
            "SELECT actor FROM idem_outbox_attempt WHERE outbox_id = ? AND outcome = 'retry_now'",
        ))
        .bind(dead)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert!(actor.starts_with("console:session-"), "{d:?}: {actor}");
        // A pending message waiting: due now, its attempts kept.
        assert!(!due(&db, waiting).await);
        let (status, _) = act(
            base,
            &cookie,
            &csrf,
            &format!("/messages/{waiting}/retry-now"),
            &[],
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{d:?}");
        assert!(due(&db, waiting).await, "{d:?}");
        assert_eq!(
            db.rows()
                .await
                .into_iter()
                .find(|r| r.0 == waiting)
                .unwrap()
                .2,
            2
        );
        refusals(&db, base, &cookie, &csrf, [flying, delivered, dead2]).await;
        discard_and_check(&db, base, &cookie, &csrf, dead2).await;
    }
}

/// Discards `id` (a dead letter) through the console: it leaves the
/// outbox and the dead letters, and is archived as failed with the
/// reason, which its page then shows.
async fn discard_and_check(db: &Db, base: &str, cookie: &str, csrf: &str, id: i64) {
    let d = db.d;
    let reason = "duplicate of <f0>";
    let (status, html) = act(
        base,
        cookie,
        csrf,
        &format!("/messages/{id}/discard"),
        &[("reason", reason)],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
    assert!(html.contains("duplicate of &lt;f0&gt;"), "{d:?}: {html}");
    assert!(
        !db.rows().await.iter().any(|r| r.0 == id),
        "{d:?}: still online"
    );
    let (status, last_error): (String, String) = sqlx::query_as(sql(
        d,
        "SELECT status, last_error FROM idem_outbox_history WHERE id = ?",
    ))
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .expect("archived");
    assert_eq!(status, "failed", "{d:?}");
    assert!(last_error.contains(reason), "{d:?}: {last_error}");
    let detail: String = sqlx::query_scalar(sql(
        d,
        "SELECT detail FROM idem_outbox_attempt WHERE outbox_id = ? AND outcome = 'discarded'",
    ))
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(detail, reason, "{d:?}");
    let (_, list) = get(&format!("{base}/dead-letters"), Some(cookie)).await;
    assert!(
        !list.contains(&format!("data-id=\"{id}\"")),
        "{d:?}: still a dead letter"
    );
    let (status, page) = get(&format!("{base}/messages/{id}"), Some(cookie)).await;
    assert_eq!(status, StatusCode::OK, "{d:?}");
    assert!(
        text_of(&page, "where").unwrap().starts_with("archived"),
        "{d:?}"
    );
    assert!(page.contains("duplicate of &lt;f0&gt;"), "{d:?}");
    assert!(
        page.contains(r#"id="no-actions""#),
        "{d:?}: an archived message has no actions"
    );
    // A script: the token as a bearer, no session or CSRF; its actor says so.
    let r = client()
        .post(format!("{base}/messages/{id}/retry-now"))
        .header(AUTHORIZATION, format!("Bearer {TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::CONFLICT,
        "{d:?}: an archived message is left alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_retries_a_message_and_is_the_actor() {
    for db in databases("actions_bearer").await {
        let d = db.d;
        let dead = db.message("t", "f", "failed", 5, Some("boom")).await;
        let served = serve(Console::new(db.pool.clone()).write_token(TOKEN).unwrap()).await;
        let r = client()
            .post(format!("{}/messages/{dead}/retry-now", served.base))
            .header(AUTHORIZATION, format!("Bearer {TOKEN}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{d:?}");
        assert_eq!(db.status(dead).await, "pending", "{d:?}");
        let actor: String = sqlx::query_scalar(sql(
            d,
            "SELECT actor FROM idem_outbox_attempt WHERE outbox_id = ?",
        ))
        .bind(dead)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(actor, "console:bearer", "{d:?}");
    }
}

/// `(topic, reason, paused_by)` of every paused topic.
async fn pauses(db: &Db) -> Vec<(String, Option<String>, Option<String>)> {
    sqlx::query_as("SELECT topic, reason, paused_by FROM idem_topic_pause ORDER BY topic")
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_are_paused_and_resumed_exactly_as_named() {
    for db in databases("topics").await {
        let d = db.d;
        db.message("pay", "p0", "pending", 0, None).await;
        db.message("pay ", "p1", "pending", 0, None).await;
        db.message("pay ", "f1", "failed", 3, Some("boom")).await;
        let served = serve(Console::new(db.pool.clone()).write_token(TOKEN).unwrap()).await;
        let base = &served.base;
        let cookie = sign_in_with(base, TOKEN).await;
        let (status, html) = get(&format!("{base}/topics"), Some(&cookie)).await;
        assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
        assert_eq!(rows_of(&html, "topic-states"), 2, "{d:?}: {html}");
        assert!(
            html.contains(r#"<tr data-topic="pay " data-state="running">"#),
            "{d:?}: {html}"
        );
        assert!(
            html.contains(r#"name="topic" value="pay ""#),
            "{d:?}: the form carries the topic exactly"
        );
        let csrf = input_value(&html, "csrf").unwrap();

        // Pause "pay ": its row only, with the reason and the actor.
        let (status, html) = act(
            base,
            &cookie,
            &csrf,
            "/topics/pause",
            &[("topic", "pay "), ("reason", "card <outage>")],
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
        assert_eq!(
            text_of(&html, "result").map(|t| t.contains("is paused")),
            Some(true),
            "{html}"
        );
        let rows = pauses(&db).await;
        assert_eq!(rows.len(), 1, "{d:?}: {rows:?}");
        assert_eq!(
            (rows[0].0.as_str(), rows[0].1.as_deref()),
            ("pay ", Some("card <outage>")),
            "{d:?}"
        );
        assert!(
            rows[0]
                .2
                .as_deref()
                .unwrap()
                .starts_with("console:session-"),
            "{d:?}: {rows:?}"
        );
        let (_, html) = get(&format!("{base}/topics"), Some(&cookie)).await;
        assert!(
            html.contains(r#"<tr data-topic="pay " data-state="paused">"#),
            "{d:?}: {html}"
        );
        assert!(html.contains("card &lt;outage&gt;"), "{d:?}");
        assert!(
            html.contains(r#"<tr data-topic="pay" data-state="running">"#),
            "{d:?}"
        );
        pause_again_by_name_and_resume(&db, base, &cookie, &csrf, rows).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_show_their_heartbeats_and_the_stale_ones() {
    for db in databases("processes").await {
        let d = db.d;
        let served = serve(Console::new(db.pool.clone())).await;
        let (status, html) = get(&format!("{}/processes", served.base), None).await;
        assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
        assert!(html.contains(r#"id="no-processes""#), "{d:?}");
        let (started, beat, old_start, old_beat) = (
            db.now_plus(-600),
            db.now_plus(-1),
            db.now_plus(-3600),
            db.now_plus(-60),
        );
        db.exec(format!(
            "INSERT INTO idem_process (id, kind, name, host, pid, started_at, heartbeat_at) VALUES \
             ('relay-1', 'relay', 'mail,pay', 'host-a', 4242, {started}, {beat}), \
             ('consumer-1', 'consumer', 'orders <q>', NULL, NULL, {old_start}, {old_beat})"
        ))
        .await;
        let (status, html) = get(&format!("{}/processes", served.base), None).await;
        assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
        assert_eq!(rows_of(&html, "processes"), 2, "{d:?}: {html}");
        assert!(
            html.contains(r#"<tr data-id="relay-1" data-state="alive">"#),
            "{d:?}: {html}"
        );
        assert!(
            html.contains(r#"<tr data-id="consumer-1" data-state="stale">"#),
            "{d:?}: {html}"
        );
        assert!(
            html.contains("orders &lt;q&gt;") && html.contains("4242") && html.contains("host-a"),
            "{d:?}"
        );
        assert_eq!(
            text_of(&html, "process-count").as_deref(),
            Some("2 process(es), 1 stale."),
            "{d:?}"
        );
        let rule = text_of(&html, "stale-rule").unwrap();
        assert!(
            rule.contains("every 5 s") && rule.contains("more than 15 s old"),
            "{rule}"
        );
    }
}

/// The caller of a request: its `x-api-key` header.
fn api_key(parts: &axum::http::request::Parts) -> Option<String> {
    parts
        .headers
        .get("x-api-key")?
        .to_str()
        .ok()
        .map(str::to_owned)
}

/// An application route behind the `Idempotency-Key` layer.
async fn pay(_tx: idem_runtime::http::RequestTx<Any>) -> axum::response::Response {
    use axum::response::IntoResponse;
    (axum::http::StatusCode::CREATED, "<b>paid</b>").into_response()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_idempotency_layer_kept_is_looked_up() {
    for db in databases("lookup").await {
        let d = db.d;
        let policy = idem_runtime::http::Idempotency::new("console_lookup", api_key);
        let app = axum::Router::new().route(
            "/pay",
            axum::routing::post(pay).layer(policy.layer(&db.pool)),
        );
        let app = serve_router(app).await;
        let key = "order-<1>";
        let r = client()
            .post(format!("{}/pay", app.base))
            .header("x-api-key", "caller-1")
            .header("idempotency-key", key)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED, "{d:?}");
        let served = serve(Console::new(db.pool.clone())).await;
        let lookup = |key: &str, caller: &str| {
            format!(
                "{}/lookup?{}",
                served.base,
                form(&[("key", key.into()), ("caller", caller.into())])
            )
        };
        let (status, html) = get(&lookup(key, "caller-1"), None).await;
        assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
        assert_eq!(
            text_of(&html, "request-key").as_deref(),
            Some("order-&lt;1&gt;"),
            "{d:?}"
        );
        assert_eq!(
            text_of(&html, "request-scope").as_deref(),
            Some("console_lookup")
        );
        assert_eq!(
            text_of(&html, "state-badge").as_deref(),
            Some("answered"),
            "{d:?}"
        );
        assert_eq!(number_of(&html, "response-status"), 201, "{d:?}");
        assert_eq!(
            text_of(&html, "response-body").as_deref(),
            Some("&lt;b&gt;paid&lt;/b&gt;"),
            "{d:?}"
        );
        assert_eq!(
            text_of(&html, "request-where").as_deref(),
            Some("online"),
            "{d:?}"
        );
        assert!(!html.contains("<b>paid"), "{d:?}: unescaped");
        // The form keeps what was asked, escaped.
        assert!(html.contains(r#"value="order-&lt;1&gt;""#), "{d:?}");
        // Another caller's key is another request.
        let (status, html) = get(&lookup(key, "caller-2"), None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{d:?}");
        assert!(
            text_of(&html, "not-found")
                .unwrap()
                .starts_with("No such request"),
            "{d:?}"
        );
        // No caller, a key no request can send: 400, the form kept.
        for (k, c) in [
            (key, ""),
            ("clé", "caller-1"),
            (&*"k".repeat(129), "caller-1"),
        ] {
            let (status, html) = get(&lookup(k, c), None).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{d:?} {k:?} {c:?}: {html}");
            assert!(
                html.contains(r#"id="lookup-error""#) && html.contains(r#"id="lookup""#),
                "{d:?}"
            );
        }
        let (status, html) = get(&format!("{}/lookup", served.base), None).await;
        assert_eq!(status, StatusCode::OK, "{d:?}");
        assert!(html.contains(r#"id="lookup""#), "{d:?}");
    }
}

/// The page of a message whose payload and headers are no JSON, the
/// answers to unknown and malformed ids, the lists' links.
async fn other_pages(d: Dialect, base: &str, dead: i64, raw: i64) {
    // Neither JSON: shown as they are, escaped; the lease live.
    let (status, html) = get(&format!("{base}/messages/{raw}"), None).await;
    assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
    assert_eq!(
        text_of(&html, "lease-state").as_deref(),
        Some("live"),
        "{d:?}"
    );
    assert!(text_of(&html, "lease").unwrap().contains("relay-c"));
    assert_eq!(
        text_of(&html, "payload").as_deref(),
        Some("&lt;not json&gt;")
    );
    assert_eq!(text_of(&html, "headers-raw").as_deref(), Some("not {json"));
    assert!(html.contains(r#"id="no-attempts""#), "{d:?}");

    // Unknown and malformed ids.
    let (status, html) = get(&format!("{base}/messages/987654321"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{d:?}");
    assert!(
        text_of(&html, "error")
            .unwrap()
            .contains("no message with id 987654321")
    );
    for bad in ["abc", "-3", "1.5", "%FF"] {
        let (status, html) = get(&format!("{base}/messages/{bad}"), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{d:?} {bad}: {html}");
        assert!(html.contains(r#"id="error""#), "{bad}: {html}");
    }
    // The lists link each message to its page.
    let (_, list) = get(&format!("{base}/dead-letters"), None).await;
    assert!(
        list.contains(&format!(r#"href="/messages/{dead}""#)),
        "{d:?}: {list}"
    );
    let (_, list) = get(&format!("{base}/messages?status=pending"), None).await;
    assert!(
        list.contains(&format!(r#"href="/messages/{raw}""#)),
        "{d:?}"
    );
}

/// Actions on a message in flight, a delivered one, and a discard
/// without a reason: refused, nothing changed. `[flying, delivered, dead]`.
async fn refusals(db: &Db, base: &str, cookie: &str, csrf: &str, ids: [i64; 3]) {
    let (d, [flying, delivered, dead2]) = (db.d, ids);
    // In flight, delivered: refused, unchanged.
    let before = snapshot(db).await;
    for (id, path, says) in [
        (flying, "retry-now", "in flight"),
        (flying, "discard", "in flight"),
        (delivered, "retry-now", "left alone"),
        (delivered, "discard", "left alone"),
    ] {
        let (status, html) = act(
            base,
            cookie,
            csrf,
            &format!("/messages/{id}/{path}"),
            &[("reason", "x")],
        )
        .await;
        assert_eq!(status, StatusCode::CONFLICT, "{d:?} {id} {path}: {html}");
        assert!(
            text_of(&html, "result").unwrap().contains(says),
            "{d:?}: {html}"
        );
    }
    // A discard without a reason: 400.
    for blank in ["", "   "] {
        let (status, _) = act(
            base,
            cookie,
            csrf,
            &format!("/messages/{dead2}/discard"),
            &[("reason", blank)],
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{d:?}");
    }
    assert_eq!(snapshot(db).await, before, "{d:?}");
}

/// After `pay ` was paused (`rows`): pausing it again changes nothing; a
/// topic without messages is paused by name; `pay ` resumed; bad forms.
async fn pause_again_by_name_and_resume(
    db: &Db,
    base: &str,
    cookie: &str,
    csrf: &str,
    rows: Vec<(String, Option<String>, Option<String>)>,
) {
    let d = db.d;
    // Again: nothing changes, the first reason stays.
    let (status, html) = act(
        base,
        cookie,
        csrf,
        "/topics/pause",
        &[("topic", "pay "), ("reason", "other")],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{d:?}");
    assert!(
        text_of(&html, "result").unwrap().contains("already paused"),
        "{html}"
    );
    assert_eq!(pauses(db).await, rows, "{d:?}");
    // A topic without messages, by name, without a reason.
    let (status, _) = act(
        base,
        cookie,
        csrf,
        "/topics/pause",
        &[("topic", "later topic")],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{d:?}");
    let (_, html) = get(&format!("{base}/topics"), Some(cookie)).await;
    assert!(
        html.contains(r#"<tr data-topic="later topic" data-state="paused">"#),
        "{d:?}"
    );
    assert!(
        text_of(&html, "paused-count")
            .unwrap()
            .starts_with("2 paused"),
        "{d:?}"
    );
    // Resume: its row removed; again: nothing changed.
    let (status, html) = act(base, cookie, csrf, "/topics/resume", &[("topic", "pay ")]).await;
    assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
    assert!(
        text_of(&html, "result").unwrap().contains("is resumed"),
        "{html}"
    );
    let left: Vec<String> = pauses(db).await.into_iter().map(|r| r.0).collect();
    assert_eq!(left, ["later topic"], "{d:?}");
    let (_, html) = act(base, cookie, csrf, "/topics/resume", &[("topic", "pay ")]).await;
    assert!(
        text_of(&html, "result").unwrap().contains("was not paused"),
        "{html}"
    );
    // No topic, a control character, an over-long reason: 400.
    let long = "r".repeat(501);
    for fields in [
        vec![("reason", "x")],
        vec![("topic", "a\u{0}b")],
        vec![("topic", "pay"), ("reason", long.as_str())],
    ] {
        let (status, html) = act(base, cookie, csrf, "/topics/pause", &fields).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{d:?} {fields:?}: {html}");
    }
    assert_eq!(pauses(db).await.len(), 1, "{d:?}");
}

//! Every endpoint of the console over HTTP, on SQLite, PostgreSQL and
//! MariaDB (through `sqlx::Any`, as `idem serve` runs it), each test on a
//! database of its own. Every write is checked in the database: what the
//! page says and what the rows are.

mod common;
use common::*;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, COOKIE, LOCATION, ORIGIN, SET_COOKIE};

const TOKEN: &str = "test-write-token-0123456789";

async fn get(url: &str) -> (StatusCode, String) {
    let r = client().get(url).send().await.expect("GET");
    let status = r.status();
    (status, r.text().await.unwrap())
}

async fn get_with(url: &str, cookie: &str) -> (StatusCode, String) {
    let r = client()
        .get(url)
        .header(COOKIE, cookie)
        .send()
        .await
        .expect("GET");
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

/// Signs in: the session cookie (`name=value`).
async fn sign_in(base: &str) -> String {
    let set = sign_in_under(base, "").await;
    set.split(';').next().unwrap().to_string()
}

/// Signs in to a console mounted at `prefix` of `server` (`""`: the
/// root), sent on to its dead letters: the whole `Set-Cookie`.
async fn sign_in_under(server: &str, prefix: &str) -> String {
    let r = client()
        .post(format!("{server}{prefix}/login"))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(form(&[
            ("token", TOKEN.into()),
            ("next", "/dead-letters".into()),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()[LOCATION], format!("{prefix}/dead-letters"));
    let set = r.headers()[SET_COOKIE].to_str().unwrap().to_string();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    assert!(
        !set.contains(TOKEN),
        "the token must not be in the cookie: {set}"
    );
    set
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_shows_the_databases_counts() {
    for db in databases("overview").await {
        let d = db.d;
        for i in 0..2 {
            db.message("payments", &format!("p{i}"), "pending", 0, None)
                .await;
        }
        db.message("payments", "s0", "success", 1, None).await;
        for i in 0..3 {
            db.message(
                "payments",
                &format!("f{i}"),
                "failed",
                5,
                Some("handler: boom"),
            )
            .await;
        }
        db.message("mail", "p0", "pending", 0, None).await;
        // A lease held by a relay, live.
        let leased = db.message("mail", "p1", "pending", 1, None).await;
        let hold = match d {
            Dialect::Postgres => {
                "UPDATE idem_outbox SET lease_owner = 'relay-a', locked_until = now() + interval '1 minute' WHERE id = $1"
            }
            Dialect::MySql => {
                "UPDATE idem_outbox SET lease_owner = 'relay-a', locked_until = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE WHERE id = ?"
            }
            Dialect::Sqlite => {
                "UPDATE idem_outbox SET lease_owner = 'relay-a', locked_until = strftime('%Y-%m-%d %H:%M:%f', 'now', '+1 minute') WHERE id = ?"
            }
        };
        sqlx::query(sqlx::AssertSqlSafe(hold))
            .bind(leased)
            .execute(&db.pool)
            .await
            .unwrap();
        let served = serve(Console::new(db.pool.clone())).await;
        let (status, html) = get(&format!("{}/", served.base)).await;
        assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
        let pending = db
            .count(
                "SELECT COUNT(*) FROM idem_outbox WHERE status = 'pending'",
                &[],
            )
            .await;
        let failed = db
            .count(
                "SELECT COUNT(*) FROM idem_outbox WHERE status = 'failed'",
                &[],
            )
            .await;
        let success = db
            .count(
                "SELECT COUNT(*) FROM idem_outbox WHERE status = 'success'",
                &[],
            )
            .await;
        assert_eq!((pending, failed, success), (4, 3, 1), "{d:?}");
        assert_eq!(number_of(&html, "total-pending"), pending, "{d:?}");
        assert_eq!(number_of(&html, "total-failed"), failed, "{d:?}");
        assert_eq!(number_of(&html, "total-success"), success, "{d:?}");
        assert_eq!(number_of(&html, "lease-holders"), 1, "{d:?}");
        assert!(html.contains(r#"data-owner="relay-a""#), "{d:?}");
        assert!(html.contains(r#"<tr data-topic="payments">"#), "{d:?}");
        assert!(html.contains(r#"<svg id="chart""#), "{d:?}");
        let oldest = text_of(&html, "oldest-pending").unwrap();
        assert!(
            oldest.ends_with('s') || oldest.ends_with('m'),
            "{d:?}: {oldest}"
        );
        // /live: the same numbers, without the page around them.
        let (status, live) = get(&format!("{}/live", served.base)).await;
        assert_eq!(status, StatusCode::OK);
        assert!(!live.contains("<html"), "{d:?}");
        assert_eq!(number_of(&live, "total-pending"), pending);
        // Read-only: the page says so.
        assert_eq!(text_of(&html, "mode").as_deref(), Some("read-only"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_walk_every_message_once_a_page_at_a_time() {
    for db in databases("pages").await {
        let d = db.d;
        let mut failed = Vec::new();
        for i in 0..23 {
            failed.push(
                db.message(
                    "orders",
                    &format!("f{i:02}"),
                    "failed",
                    3,
                    Some(&format!("reason {i}")),
                )
                .await,
            );
            db.message("orders", &format!("p{i:02}"), "pending", 0, None)
                .await;
        }
        let served = serve(Console::new(db.pool.clone())).await;
        let mut seen = Vec::new();
        let mut url = format!("{}/dead-letters?limit=10", served.base);
        let mut pages = 0;
        loop {
            let (status, html) = get(&url).await;
            assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
            pages += 1;
            for part in html.split(r#"<tr data-id=""#).skip(1) {
                seen.push(part[..part.find('"').unwrap()].parse::<i64>().unwrap());
            }
            assert!(html.contains("reason "), "{d:?}: the reasons are shown");
            let next = r#"id="next-page" href=""#;
            match html.find(next) {
                Some(at) => {
                    let rest = &html[at + next.len()..];
                    let href = rest[..rest.find('"').unwrap()].replace("&amp;", "&");
                    url = format!("{}{href}", served.base);
                }
                None => break,
            }
        }
        assert_eq!(seen, failed, "{d:?}: every dead letter once, in id order");
        // Each row offers the preview of its own requeue.
        let (_, html) = get(&format!("{}/dead-letters", served.base)).await;
        assert!(
            html.contains(&format!(r#"href="/requeue?id={}""#, failed[0])),
            "{d:?}"
        );
        assert_eq!(pages, 3, "{d:?}");
        // Another status, filtered by topic.
        let (_, html) = get(&format!(
            "{}/messages?status=pending&topic=orders&limit=500",
            served.base
        ))
        .await;
        assert_eq!(html.matches(r#"<tr data-id=""#).count(), 23, "{d:?}");
        let (_, html) = get(&format!(
            "{}/messages?status=pending&topic=nothing",
            served.base
        ))
        .await;
        assert!(html.contains(r#"id="empty""#), "{d:?}");
        // Bad parameters: a clear 400, no SQL.
        for bad in [
            "/messages?status=bogus",
            "/messages?limit=0",
            "/messages?limit=501",
            "/messages?after=1%20OR%201=1",
            "/dead-letters?status=pending",
        ] {
            let (status, html) = get(&format!("{}{bad}", served.base)).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{d:?} {bad}: {html}");
            assert!(html.contains(r#"id="error""#), "{bad}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_console_refuses_every_write() {
    for db in databases("readonly").await {
        let d = db.d;
        let id = db
            .message("payments", "f0", "failed", 5, Some("boom"))
            .await;
        let served = serve(Console::new(db.pool.clone())).await;
        let before = db.rows().await;
        // The preview works (it is a dry run) but offers no confirmation.
        let (status, html) = get(&format!("{}/requeue?id={id}", served.base)).await;
        assert_eq!(status, StatusCode::OK, "{d:?}");
        assert_eq!(number_of(&html, "preview-count"), 1);
        assert!(html.contains(r#"id="read-only""#) && !html.contains(r#"id="confirm""#));
        // Every POST: 403, nothing changed.
        let confirm = form(&[("id", id.to_string()), ("max_id", id.to_string())]);
        for (path, body) in [
            ("/requeue", confirm.clone()),
            ("/login", form(&[("token", TOKEN.into())])),
            ("/logout", String::new()),
        ] {
            let (status, html) = post(&format!("{}{path}", served.base), None, body).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{d:?} {path}: {html}");
        }
        let r = client()
            .post(format!("{}/requeue", served.base))
            .header(AUTHORIZATION, format!("Bearer {TOKEN}"))
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(confirm)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            db.rows().await,
            before,
            "{d:?}: a refused write changed rows"
        );
        assert_eq!(db.status(id).await, "failed");
        // A GET never writes either.
        let (status, _) = get(&format!("{}/requeue?id={id}&max_id={id}", served.base)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(db.rows().await, before);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_takes_what_its_preview_showed_and_only_dead_letters() {
    for db in databases("requeue").await {
        let d = db.d;
        let f1 = db
            .message("payments", "f1", "failed", 5, Some("handler: boom"))
            .await;
        let f2 = db
            .message("payments", "f2", "failed", 5, Some("handler: boom"))
            .await;
        let p = db.message("payments", "p", "pending", 1, None).await;
        let s = db.message("payments", "s", "success", 1, None).await;
        let other = db
            .message("mail", "f", "failed", 2, Some("smtp down"))
            .await;
        let console = Console::new(db.pool.clone()).write_token(TOKEN).unwrap();
        let served = serve(console).await;
        let base = &served.base;

        // Sign-in: a wrong token is refused, the right one gives a cookie.
        let (status, html) = post(
            &format!("{base}/login"),
            None,
            form(&[("token", "wrong-token-but-long-enough".into())]),
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(html.contains(r#"id="login-error""#));
        let cookie = sign_in(base).await;

        // An id named twice is one message.
        let (_, html) = get_with(&format!("{base}/requeue?id={f1}&id={f1}"), &cookie).await;
        assert_eq!(number_of(&html, "preview-count"), 1, "{d:?}");
        assert!(!html.contains(r#"id="not-failed""#), "{d:?}: {html}");
        // A selection with a pending and a delivered message in it.
        let q = format!("id={f1}&id={p}&id={s}");
        let (status, html) = get_with(&format!("{base}/requeue?{q}"), &cookie).await;
        assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
        assert_eq!(number_of(&html, "preview-count"), 1, "{d:?}");
        assert!(html.contains(r#"id="not-failed""#), "{d:?}");
        let csrf = input_value(&html, "csrf").expect("a CSRF token in the form");
        let max_id = input_value(&html, "max_id").unwrap();
        assert_eq!(max_id, f1.to_string());
        let before = db.rows().await;

        // Without the CSRF token, with a wrong one, from another origin: 403.
        let fields = |csrf: &str| {
            form(&[
                ("id", f1.to_string()),
                ("id", p.to_string()),
                ("id", s.to_string()),
                ("max_id", max_id.clone()),
                ("previewed", "1".into()),
                ("csrf", csrf.to_string()),
            ])
        };
        for bad in ["", "00ff", &csrf[..csrf.len() - 2]] {
            let (status, _) = post(&format!("{base}/requeue"), Some(&cookie), fields(bad)).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{d:?}: csrf {bad:?}");
        }
        let (status, _) = post(&format!("{base}/requeue"), None, fields(&csrf)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{d:?}: no session");
        let r = client()
            .post(format!("{base}/requeue"))
            .header(COOKIE, &cookie)
            .header(ORIGIN, "http://evil.test")
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(fields(&csrf))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{d:?}: cross-origin");
        assert_eq!(
            db.rows().await,
            before,
            "{d:?}: a refused write changed rows"
        );

        // Confirmed: exactly the failed one of the selection.
        let (_, overview) = get(&format!("{base}/")).await;
        assert_eq!(number_of(&overview, "total-failed"), 3, "{d:?}");
        let (status, html) = post(&format!("{base}/requeue"), Some(&cookie), fields(&csrf)).await;
        assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
        assert_eq!(number_of(&html, "requeued-count"), 1);
        // The overview shows it at once, within its sampling interval.
        let (_, overview) = get(&format!("{base}/")).await;
        assert_eq!(
            number_of(&overview, "total-failed"),
            2,
            "{d:?}: the counts were not refreshed"
        );
        let after = db.rows().await;
        for (b, a) in before.iter().zip(&after) {
            if b.0 == f1 {
                assert_eq!((a.1.as_str(), a.2), ("pending", 0), "{d:?}");
                assert_eq!(a.3.as_deref(), Some("requeued: handler: boom"));
            } else {
                assert_eq!(a, b, "{d:?}: message {} changed", b.0);
            }
        }

        // A topic: the preview counts 1 (f2); a message of the topic that
        // fails after the preview is not taken by its confirmation.
        let (_, html) = get_with(&format!("{base}/requeue?topic=payments"), &cookie).await;
        assert_eq!(number_of(&html, "preview-count"), 1);
        let max_id = input_value(&html, "max_id").unwrap();
        assert_eq!(max_id, f2.to_string());
        let late = db
            .message("payments", "late", "failed", 5, Some("later"))
            .await;
        let (status, html) = post(
            &format!("{base}/requeue"),
            Some(&cookie),
            form(&[
                ("topic", "payments".into()),
                ("max_id", max_id),
                ("previewed", "1".into()),
                ("csrf", csrf.clone()),
            ]),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
        assert_eq!(number_of(&html, "requeued-count"), 1);
        assert_eq!(db.status(f2).await, "pending");
        assert_eq!(
            db.status(late).await,
            "failed",
            "{d:?}: taken without a preview"
        );
        assert_eq!(db.status(other).await, "failed", "{d:?}: another topic");
        assert_eq!(db.status(s).await, "success");

        // A script: the token as a bearer, no session, no CSRF.
        let r = client()
            .post(format!("{base}/requeue"))
            .header(AUTHORIZATION, format!("Bearer {TOKEN}"))
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form(&[("all", "1".into()), ("max_id", other.to_string())]))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(db.status(other).await, "pending");
        assert_eq!(db.status(late).await, "failed", "{d:?}: above max_id");
        let r = client()
            .post(format!("{base}/requeue"))
            .header(AUTHORIZATION, "Bearer wrong-token-0123456789")
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form(&[("all", "1".into()), ("max_id", late.to_string())]))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert_eq!(db.status(late).await, "failed");

        // Malformed confirmations: 400, nothing changed.
        let before = db.rows().await;
        for bad in [
            form(&[("csrf", csrf.clone())]),
            form(&[("topic", "payments".into()), ("csrf", csrf.clone())]),
            form(&[
                ("id", "x".into()),
                ("max_id", "9".into()),
                ("csrf", csrf.clone()),
            ]),
            form(&[
                ("id", "1".into()),
                ("topic", "payments".into()),
                ("max_id", "9".into()),
                ("csrf", csrf.clone()),
            ]),
        ] {
            let (status, html) = post(&format!("{base}/requeue"), Some(&cookie), bad.clone()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{d:?} {bad}: {html}");
        }
        assert_eq!(db.rows().await, before);

        // Sign out: the cookie is cleared.
        let r = client()
            .post(format!("{base}/logout"))
            .header(COOKIE, &cookie)
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form(&[("csrf", csrf.clone())]))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        assert!(
            r.headers()[SET_COOKIE]
                .to_str()
                .unwrap()
                .contains("Max-Age=0")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_preview_counts_every_dead_letter_and_lists_the_first_hundred() {
    for db in databases("bigpreview").await {
        let d = db.d;
        let mut ids = Vec::new();
        for i in 0..130 {
            ids.push(
                db.message("bulk", &format!("f{i:03}"), "failed", 5, Some("boom"))
                    .await,
            );
        }
        let console = Console::new(db.pool.clone()).write_token(TOKEN).unwrap();
        let served = serve(console).await;
        let cookie = sign_in(&served.base).await;
        let (status, html) =
            get_with(&format!("{}/requeue?topic=bulk", served.base), &cookie).await;
        assert_eq!(status, StatusCode::OK, "{d:?}");
        assert_eq!(number_of(&html, "preview-count"), 130, "{d:?}");
        assert_eq!(html.matches(r#"<tr data-id=""#).count(), 100, "{d:?}");
        assert!(html.contains(r#"id="shown""#), "{d:?}");
        assert_eq!(input_value(&html, "max_id"), Some(ids[129].to_string()));
        assert_eq!(input_value(&html, "previewed").as_deref(), Some("130"));
        assert_eq!(
            db.count(
                "SELECT COUNT(*) FROM idem_outbox WHERE status = 'failed'",
                &[]
            )
            .await,
            130
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_found_online_and_archived() {
    for db in databases("records").await {
        let d = db.d;
        let (created, expired, later) = match d {
            Dialect::Postgres => (
                "now() - interval '2 hours'",
                "now() - interval '1 hour'",
                "now() + interval '1 day'",
            ),
            Dialect::MySql => (
                "UTC_TIMESTAMP(6) - INTERVAL 2 HOUR",
                "UTC_TIMESTAMP(6) - INTERVAL 1 HOUR",
                "UTC_TIMESTAMP(6) + INTERVAL 1 DAY",
            ),
            Dialect::Sqlite => (
                "strftime('%Y-%m-%d %H:%M:%f', 'now', '-2 hours')",
                "strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 hour')",
                "strftime('%Y-%m-%d %H:%M:%f', 'now', '+1 day')",
            ),
        };
        let mark = |n| {
            if d == Dialect::Postgres {
                format!("${n}")
            } else {
                "?".into()
            }
        };
        for (key, expire, result) in [
            ("live-1", later, "{\"ok\":1}"),
            ("old-1", expired, "<b>old</b>"),
        ] {
            let insert = format!(
                "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time) \
                 VALUES ({}, 'pay', 'no-1', 'fp-abc', {}, {created}, {expire})",
                mark(1),
                mark(2)
            );
            sqlx::query(sqlx::AssertSqlSafe(insert))
                .bind(key)
                .bind(result)
                .execute(&db.pool)
                .await
                .unwrap();
        }
        // Archive the expired one.
        let moved = idem_runtime::archive::Archiver::new(db.pool.clone())
            .run_once(|_| {})
            .await
            .unwrap();
        assert_eq!(moved.records, 1, "{d:?}");
        let served = serve(Console::new(db.pool.clone())).await;
        let (status, html) = get(&format!("{}/records?key=live-1", served.base)).await;
        assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
        assert!(
            html.contains("fp-abc")
                && html.contains("pay")
                && html.contains(r#"class="badge online""#),
            "{d:?}: {html}"
        );
        assert!(
            html.contains("{&quot;ok&quot;:1}") || html.contains("{\"ok\":1}"),
            "{d:?}"
        );
        let (status, html) = get(&format!("{}/records?key=old-1&biz_type=pay", served.base)).await;
        assert_eq!(status, StatusCode::OK, "{d:?}");
        assert!(html.contains(r#"class="badge archived""#), "{d:?}: {html}");
        assert!(
            html.contains("&lt;b&gt;old&lt;/b&gt;"),
            "{d:?}: the stored result is escaped"
        );
        let (status, html) = get(&format!(
            "{}/records?key=live-1&biz_type=other",
            served.base
        ))
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(html.contains(r#"id="not-found""#));
        let (status, _) = get(&format!("{}/records?key={}", served.base, "k".repeat(200))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, html) = get(&format!("{}/records", served.base)).await;
        assert_eq!(status, StatusCode::OK);
        assert!(html.contains(r#"id="lookup""#));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archive_page_counts_what_the_archiver_then_moves() {
    for db in databases("archive").await {
        let d = db.d;
        for i in 0..3 {
            db.message("t", &format!("s{i}"), "success", 1, None).await;
        }
        db.message("t", "f", "failed", 5, Some("x")).await;
        db.message("t", "p", "pending", 0, None).await;
        let served =
            serve(Console::new(db.pool.clone()).outbox_retention(std::time::Duration::ZERO)).await;
        // Let the rows' update times fall behind a zero retention.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let (status, html) = get(&format!("{}/archive", served.base)).await;
        assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
        let eligible = |html: &str| {
            let row = &html[html.find(r#"id="archive-outbox""#).unwrap()..];
            let cell = &row[row.find(r#"class="num eligible">"#).unwrap() + 21..];
            cell[..cell.find('<').unwrap()].parse::<i64>().unwrap()
        };
        assert_eq!(
            eligible(&html),
            4,
            "{d:?}: finished messages, not the pending one"
        );
        assert!(html.contains("never"), "{d:?}");
        let moved = idem_runtime::archive::Archiver::new(db.pool.clone())
            .outbox_retention(std::time::Duration::ZERO)
            .run_once(|_| {})
            .await
            .unwrap();
        assert_eq!(moved.outbox, 4, "{d:?}");
        let (_, html) = get(&format!("{}/archive", served.base)).await;
        assert_eq!(eligible(&html), 0, "{d:?}");
        let history = db
            .count("SELECT COUNT(*) FROM idem_outbox_history", &[])
            .await;
        assert_eq!(history, 4);
        assert!(
            html.contains(r#"<td class="num history">4</td>"#),
            "{d:?}: {html}"
        );
        assert!(
            !text_of(&html, "archive-outbox").unwrap().contains("never"),
            "{d:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_serve_the_outbox_gauges_and_health_the_database() {
    for db in databases("metrics").await {
        let d = db.d;
        db.message("payments", "p", "pending", 0, None).await;
        db.message("payments", "f1", "failed", 5, None).await;
        db.message("payments", "f2", "failed", 5, None).await;
        db.message("mail \"quoted\"", "p", "pending", 0, None).await;
        let served = serve(
            Console::new(db.pool.clone()).sample_every(std::time::Duration::from_millis(200)),
        )
        .await;
        let r = client()
            .get(format!("{}/metrics", served.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert!(
            r.headers()[CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/plain; version=0.0.4")
        );
        let text = r.text().await.unwrap();
        for line in [
            r#"idem_outbox_pending{topic="payments"} 1"#,
            r#"idem_outbox_failed{topic="payments"} 2"#,
            r#"idem_outbox_pending{topic="mail \"quoted\""} 1"#,
            "idem_console_database_up 1",
            "# TYPE idem_outbox_oldest_pending_age_seconds gauge",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{d:?}: no {line:?} in\n{text}"
            );
        }
        // A topic that leaves the outbox leaves the output.
        sqlx::query(sql(d, "DELETE FROM idem_outbox WHERE topic = ?"))
            .bind("payments")
            .execute(&db.pool)
            .await
            .unwrap();
        // (Within one sampling interval: the figures are shared for that long.)
        let start = std::time::Instant::now();
        loop {
            let (_, text) = get(&format!("{}/metrics", served.base)).await;
            if !text.contains(r#"topic="payments""#) {
                break;
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "{d:?}: {text}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }

        let r = client()
            .get(format!("{}/health", served.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["status"], "ok");
        db.pool.close().await;
        let r = client()
            .get(format!("{}/health", served.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "{d:?}");
        let (status, text) = get(&format!("{}/metrics", served.base)).await;
        assert_eq!(status, StatusCode::OK);
        assert!(text.contains("idem_console_database_up 0"), "{d:?}: {text}");
        // The overview's figures outlive the database by one sampling
        // interval at most.
        let start = std::time::Instant::now();
        let html = loop {
            let (status, html) = get(&format!("{}/", served.base)).await;
            if status == StatusCode::INTERNAL_SERVER_ERROR {
                break html;
            }
            assert_eq!(status, StatusCode::OK, "{d:?}");
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "{d:?}: still served"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        };
        assert!(
            html.contains("the database could not answer this page"),
            "{d:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_escape_what_the_database_holds_and_set_safety_headers() {
    let db = databases("escape")
        .await
        .into_iter()
        .next()
        .expect("sqlite");
    db.message(
        "<script>alert(1)</script>",
        "m\"1",
        "failed",
        1,
        Some("<img src=x onerror=alert(2)>"),
    )
    .await;
    let served = serve(Console::new(db.pool.clone())).await;
    for path in [
        "/",
        "/dead-letters",
        "/messages?status=failed",
        "/requeue?all=1",
        "/topics",
        "/messages/1",
    ] {
        let r = client()
            .get(format!("{}{path}", served.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        let h = r.headers();
        assert!(
            h["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("script-src 'self'")
        );
        assert_eq!(h["x-frame-options"], "DENY");
        assert_eq!(h["x-content-type-options"], "nosniff");
        let html = r.text().await.unwrap();
        assert!(!html.contains("<script>alert"), "{path}: {html}");
        assert!(!html.contains("<img src=x"), "{path}");
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{path}: {html}"
        );
    }
    let (status, _) = get(&format!("{}/nowhere", served.base)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, js) = get(&format!("{}/static/console.js", served.base)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(js.contains("data-refresh"));
    let (status, css) = get(&format!("{}/static/console.css", served.base)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(css.contains("#chart"));
    // A next= that leaves the console goes to the overview instead.
    let (status, html) = get(&format!("{}/login?next=//evil.test/", served.base)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains(r#"id="read-only""#));
}

/// What a URL in a page is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Use {
    /// `href`, `src`, `data-refresh`: fetched as it is.
    Get,
    /// A GET form's `action`: fetched with the form's fields.
    GetForm,
    /// A POST form's `action`.
    PostForm,
}

/// Every `href`, `src`, `action` and `data-refresh` of a page (entities
/// undone), with what it is for.
fn links(html: &str) -> Vec<(String, Use)> {
    let mut out = Vec::new();
    for attr in [" href=\"", " src=\"", " action=\"", " data-refresh=\""] {
        let mut rest = html;
        while let Some(at) = rest.find(attr) {
            let tag_start = rest[..at].rfind('<').unwrap_or(0);
            let after = &rest[at + attr.len()..];
            let end = after.find('"').expect("a closed attribute");
            let tag_end = after.find('>').unwrap_or(after.len());
            let tag = format!("{}{}", &rest[tag_start..at], &after[..tag_end]);
            let use_ = match (attr == " action=\"", tag.contains("method=\"post\"")) {
                (false, _) => Use::Get,
                (true, false) => Use::GetForm,
                (true, true) => Use::PostForm,
            };
            out.push((after[..end].replace("&amp;", "&"), use_));
            rest = &after[end..];
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounted_under_a_prefix_every_link_form_redirect_and_cookie_stay_under_it() {
    // The prefix is the router's business, not the backend's: SQLite.
    let db = databases("mounted")
        .await
        .into_iter()
        .next()
        .expect("sqlite");
    let failed = db
        .message("payments", "f1", "failed", 5, Some("handler: boom"))
        .await;
    db.message("payments", "p1", "pending", 1, None).await;
    db.message("payments", "s1", "success", 1, None).await;
    let console = Console::new(db.pool.clone())
        .write_token(TOKEN)
        .unwrap()
        .mount_at("/ops/idem/")
        .unwrap();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "the application" }))
        .fallback(|| async { (StatusCode::NOT_FOUND, "the application's 404") })
        .merge(console.router());
    let served = serve_router(app).await;
    let base = &served.base;
    let prefix = "/ops/idem/";

    // The application keeps its own routes and fallback.
    assert_eq!(get(&format!("{base}/")).await.1, "the application");
    assert_eq!(
        get(&format!("{base}/dead-letters")).await,
        (StatusCode::NOT_FOUND, "the application's 404".to_string())
    );
    // The prefix without its slash leads to the overview.
    let r = client()
        .get(format!("{base}/ops/idem"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(r.headers()[LOCATION], prefix);

    // Signed in, so that the write forms are on the pages too; sent on
    // to the dead letters under the prefix.
    let set = sign_in_under(base, "/ops/idem").await;
    assert!(set.contains("Path=/ops/idem/;"), "{set}");
    let cookie = set.split(';').next().unwrap().to_string();

    // Crawl from the overview: every link, form and script is under the
    // prefix, and every GET link answers.
    let mut todo = vec![prefix.to_string(), format!("{prefix}records?key=nothing")];
    let mut seen = std::collections::BTreeSet::new();
    let mut forms = std::collections::BTreeSet::new();
    while let Some(path) = todo.pop() {
        if !seen.insert(path.clone()) {
            continue;
        }
        assert!(seen.len() < 200, "the crawl does not end: {seen:?}");
        let (status, body) = get_with(&format!("{base}{path}"), &cookie).await;
        let expected = if path.contains("key=nothing") {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::OK
        };
        assert_eq!(status, expected, "{path}: {body}");
        for (link, use_) in links(&body) {
            assert!(
                link.starts_with(prefix),
                "{path} links to {link:?}, outside {prefix}"
            );
            match use_ {
                Use::Get => todo.push(link),
                form => {
                    forms.insert((link, form));
                }
            }
        }
    }
    for page in [
        "",
        "messages",
        "dead-letters",
        "records",
        "archive",
        "metrics",
        "live",
        "topics",
        "processes",
        "lookup",
    ] {
        assert!(
            seen.iter()
                .any(|s| s.split('?').next() == Some(&format!("{prefix}{page}"))),
            "the crawl never reached {prefix}{page}: {seen:?}"
        );
    }
    assert!(
        seen.contains(&format!("{prefix}requeue?id={failed}")),
        "{seen:?}"
    );
    assert!(
        seen.contains(&format!("{prefix}messages/{failed}")),
        "{seen:?}"
    );
    // The write forms, a message's id written `{id}`.
    let mut posts: Vec<String> = forms
        .iter()
        .filter(|(_, u)| *u == Use::PostForm)
        .map(|(l, _)| {
            l.split('/')
                .map(|seg| {
                    if !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_digit()) {
                        "{id}"
                    } else {
                        seg
                    }
                })
                .collect::<Vec<_>>()
                .join("/")
        })
        .collect();
    posts.sort();
    posts.dedup();
    assert_eq!(
        posts,
        [
            "/ops/idem/logout",
            "/ops/idem/messages/{id}/discard",
            "/ops/idem/messages/{id}/retry-now",
            "/ops/idem/requeue",
            "/ops/idem/topics/pause",
        ],
        "the write forms"
    );
    // The GET forms: the filters, the selection to preview, the lookup.
    for action in ["messages", "dead-letters", "requeue", "records", "lookup"] {
        assert!(
            forms.contains(&(format!("{prefix}{action}"), Use::GetForm)),
            "no GET form to {prefix}{action}: {forms:?}"
        );
    }

    // A requeue through the mounted pages changes the row.
    let (_, html) = get_with(&format!("{base}/ops/idem/requeue?id={failed}"), &cookie).await;
    let csrf = input_value(&html, "csrf").expect("the confirmation form");
    let max_id = input_value(&html, "max_id").unwrap();
    let (status, html) = post(
        &format!("{base}/ops/idem/requeue"),
        Some(&cookie),
        form(&[
            ("csrf", csrf.clone()),
            ("max_id", max_id),
            ("id", failed.to_string()),
        ]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert_eq!(number_of(&html, "requeued-count"), 1);
    assert_eq!(db.status(failed).await, "pending");
    assert!(
        links(&html).iter().all(|(l, _)| l.starts_with(prefix)),
        "{html}"
    );

    // An unknown page under the prefix is the console's 404, whose links
    // stay under it too.
    let (status, html) = get(&format!("{base}/ops/idem/nowhere")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(html.contains(r#"id="error""#), "{html}");
    let error_links = links(&html);
    assert!(!error_links.is_empty());
    assert!(
        error_links.iter().all(|(l, _)| l.starts_with(prefix)),
        "{error_links:?}"
    );
    assert_eq!(
        get(&format!("{base}/ops/idem/health")).await.0,
        StatusCode::OK
    );

    // Signing out clears the cookie on the prefix and goes to its overview.
    let r = client()
        .post(format!("{base}/ops/idem/logout"))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(COOKIE, &cookie)
        .body(form(&[("csrf", csrf)]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()[LOCATION], prefix);
    let cleared = r.headers()[SET_COOKIE].to_str().unwrap();
    assert!(
        cleared.contains("Path=/ops/idem/;") && cleared.contains("Max-Age=0"),
        "{cleared}"
    );
}

#[tokio::test]
async fn a_mount_path_that_is_no_plain_path_is_refused() {
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .connect_lazy("sqlite::memory:")
        .unwrap();
    for bad in ["ops", "/ops//idem", "/ops/{id}", "/ops/../x", "/a b"] {
        let e = Console::new(pool.clone()).mount_at(bad).unwrap_err();
        assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
    }
    assert!(Console::new(pool).mount_at("/").is_ok());
}

//! Signing out ends the session on the server (issue 36, defect 3; OWASP
//! ASVS 3.3.1): `/logout` only cleared the cookie, and a session cookie
//! captured before it still requeued (200) until it expired, 12 h later.
//! A captured cookie replayed after its sign-out, or after a restart, is
//! refused, and nothing is requeued (checked in the database), on SQLite,
//! PostgreSQL and MariaDB.

mod common;
use common::*;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};

const TOKEN: &str = "logout-write-token-9e4b17c03a58";

async fn post(url: &str, cookie: &str, body: String) -> reqwest::Response {
    client()
        .post(url)
        .header(COOKIE, cookie)
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .expect("POST")
}

async fn sign_in(base: &str) -> String {
    sign_in_with(base, TOKEN).await
}

/// The preview of a requeue of message `id` under `cookie`: the
/// confirmation's fields (with the session's CSRF token, if signed in).
async fn preview(base: &str, cookie: &str, id: i64) -> (Vec<(&'static str, String)>, bool) {
    let r = client()
        .get(format!("{base}/requeue?id={id}"))
        .header(COOKIE, cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let html = r.text().await.unwrap();
    let csrf = input_value(&html, "csrf");
    let signed_in = csrf.is_some() && html.contains(r#"id="confirm-form""#);
    let fields = vec![
        ("id", id.to_string()),
        ("max_id", id.to_string()),
        ("previewed", "1".into()),
        ("csrf", csrf.unwrap_or_default()),
    ];
    (fields, signed_in)
}

/// A requeue with `cookie` and `fields` is refused (not 200: 403, or a
/// redirect to the sign-in) and changes no row.
async fn refused(db: &Db, base: &str, cookie: &str, fields: &[(&str, String)], why: &str) {
    let before = db.rows().await;
    let r = post(&format!("{base}/requeue"), cookie, form(fields)).await;
    let status = r.status();
    let page = r.text().await.unwrap();
    assert!(
        matches!(
            status,
            StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED | StatusCode::SEE_OTHER
        ),
        "{:?}: {why}: the captured cookie requeued ({status}):\n{page}",
        db.d
    );
    assert_eq!(db.rows().await, before, "{:?}: {why}: rows changed", db.d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_replayed_after_logout_or_a_restart_is_refused_and_requeues_nothing() {
    for db in databases("logout").await {
        let d = db.d;
        let f = db
            .message("logout-t", "m1", "failed", 5, Some("boom"))
            .await;
        let console = Console::new(db.pool.clone()).write_token(TOKEN).unwrap();
        let served = serve(console).await;
        let base = &served.base;

        // Signed in: the preview offers the confirmation; capture the
        // cookie and the form's fields.
        let captured = sign_in(base).await;
        let (fields, signed_in) = preview(base, &captured, f).await;
        assert!(signed_in, "{d:?}");
        let csrf = fields[3].1.clone();

        // Sign out, as the page's button does.
        let r = post(
            &format!("{base}/logout"),
            &captured,
            form(&[("csrf", csrf.clone())]),
        )
        .await;
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "{d:?}");
        assert_eq!(r.headers()[LOCATION], "/");
        assert!(
            r.headers()[SET_COOKIE]
                .to_str()
                .unwrap()
                .contains("Max-Age=0"),
            "{d:?}"
        );

        // The captured cookie, replayed: signed out, and refused.
        let (_, signed_in) = preview(base, &captured, f).await;
        assert!(!signed_in, "{d:?}: the page still offers a requeue");
        refused(&db, base, &captured, &fields, "after logout").await;
        assert_eq!(db.status(f).await, "failed", "{d:?}");
        // Its sign-out again is refused too (nothing left to end).
        let r = post(
            &format!("{base}/logout"),
            &captured,
            form(&[("csrf", csrf)]),
        )
        .await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{d:?}");

        // Another session, and a restart (a new console over the same
        // database and token): its cookie is refused as well.
        let before_restart = sign_in(base).await;
        let (fields, signed_in) = preview(base, &before_restart, f).await;
        assert!(signed_in, "{d:?}");
        drop(served);
        let console = Console::new(db.pool.clone()).write_token(TOKEN).unwrap();
        let served = serve(console).await;
        let base = &served.base;
        refused(&db, base, &before_restart, &fields, "after a restart").await;
        assert_eq!(db.status(f).await, "failed", "{d:?}");

        // A fresh session requeues: the refusals above were the sessions'.
        let fresh = sign_in(base).await;
        let (fields, signed_in) = preview(base, &fresh, f).await;
        assert!(signed_in, "{d:?}");
        let r = post(&format!("{base}/requeue"), &fresh, form(&fields)).await;
        assert_eq!(r.status(), StatusCode::OK, "{d:?}");
        assert_eq!(number_of(&r.text().await.unwrap(), "requeued-count"), 1);
        assert_eq!(db.status(f).await, "pending", "{d:?}");
    }
}

//! Filters that are no topic, key or type (issue 24, defect 8): a NUL,
//! another control character or an over-long value is a 400 in the
//! console's words, before any SQL, on SQLite, PostgreSQL and MariaDB.

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_filters_are_a_400_in_the_consoles_words() {
    for db in databases("bad_filters").await {
        let d = db.d;
        db.message("payments", "f0", "failed", 5, None).await;
        let served = serve(Console::new(db.pool.clone())).await;
        let long = "t".repeat(129);
        let key = "k".repeat(600);
        let cases = [
            ("/messages?topic=a%00b".to_string(), "control character"),
            (
                "/messages?status=failed&topic=%00".into(),
                "control character",
            ),
            ("/dead-letters?topic=%01".into(), "control character"),
            ("/dead-letters?topic=a%0Ab".into(), "control character"),
            (format!("/messages?topic={long}"), "at most 128 bytes"),
            ("/records?key=k%00".into(), "control character"),
            ("/records?key=k&biz_type=%00".into(), "control character"),
            (format!("/records?key={key}"), "at most"),
            ("/requeue?topic=%00".into(), "control character"),
            (format!("/requeue?topic={long}"), "at most 128 bytes"),
        ];
        for (path, says) in cases {
            let r = reqwest::get(format!("{}{path}", served.base))
                .await
                .expect("GET");
            let status = r.status();
            let body = r.text().await.expect("the body");
            assert_eq!(
                status,
                reqwest::StatusCode::BAD_REQUEST,
                "{d:?} {path}: {body}"
            );
            assert!(body.contains(says), "{d:?} {path}: no {says:?} in\n{body}");
            assert!(
                !body.contains("database error"),
                "{d:?} {path}: the database's words:\n{body}"
            );
        }
        // A good filter still answers.
        let r = reqwest::get(format!("{}/dead-letters?topic=payments", served.base))
            .await
            .unwrap();
        assert_eq!(r.status(), reqwest::StatusCode::OK, "{d:?}");
    }
}

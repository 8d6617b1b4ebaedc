//! A row that is not UTF-8 is shown lossily (issue 24, defect 7): every
//! page and `/metrics` still answer, with U+FFFD for the bytes that are
//! no text. SQLite stores such text as it is given; MariaDB (strict mode)
//! and PostgreSQL refuse it, which the test checks rather than skips.

mod common;
use common::*;

/// Two rows whose topic, msg_id, last_error or lease_owner are bytes that
/// are no UTF-8 (`ff 41`, `ff 42`, `fe`, `c3 28`, `fd 52`), in each
/// database's way of writing bytes.
fn bad_rows(d: Dialect) -> String {
    let bytes = |hex: &str| match d {
        Dialect::Sqlite => format!("CAST(x'{hex}' AS TEXT)"),
        Dialect::MySql => format!("x'{hex}'"),
        Dialect::Postgres => format!("convert_from('\\x{hex}'::bytea, 'UTF8')"),
    };
    format!(
        "INSERT INTO idem_outbox (topic, msg_id, payload, status, attempts, last_error, lease_owner) \
         VALUES ({}, 'bad-1', '{{}}', 'failed', 5, {}, NULL), \
                ({}, {}, '{{}}', 'pending', 1, NULL, {})",
        bytes("ff41"),
        // A BLOB where SQLite expects text.
        if d == Dialect::Sqlite {
            "x'c328'".to_string()
        } else {
            bytes("c328")
        },
        bytes("ff42"),
        bytes("fe"),
        bytes("fd52"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_of_invalid_utf8_is_shown_lossily() {
    for db in databases("invalid_utf8").await {
        let d = db.d;
        db.message("payments", "ok", "failed", 5, Some("fine"))
            .await;
        let stored = sqlx::query(sqlx::AssertSqlSafe(bad_rows(d)))
            .execute(&db.pool)
            .await;
        match (d, stored) {
            (Dialect::Sqlite, Ok(_)) => {}
            (Dialect::Sqlite, Err(e)) => panic!("SQLite stores any bytes: {e}"),
            (_, Ok(_)) => panic!("{d:?} stored bytes that are not UTF-8"),
            // It cannot hold them: nothing to show.
            (_, Err(_)) => continue,
        }
        let served = serve(Console::new(db.pool.clone())).await;
        for (path, shows) in [
            ("/", "\u{FFFD}A"),
            ("/live", "\u{FFFD}R"),
            ("/dead-letters", "\u{FFFD}("),
            ("/messages?status=failed", "\u{FFFD}A"),
            ("/messages?status=pending", "\u{FFFD}B"),
            ("/requeue?all=1", "\u{FFFD}("),
            ("/metrics", "idem_outbox_failed{topic=\"\u{FFFD}A\"} 1"),
        ] {
            let r = reqwest::get(format!("{}{path}", served.base))
                .await
                .expect("GET");
            let status = r.status();
            let body = r.text().await.expect("the body");
            assert_eq!(status, reqwest::StatusCode::OK, "{d:?} {path}: {body}");
            assert!(
                body.contains(shows),
                "{d:?} {path}: no {shows:?} in\n{body}"
            );
        }
        let r = reqwest::get(format!("{}/metrics", served.base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            r.contains(r#"idem_outbox_failed{topic="payments"} 1"#),
            "{d:?}: {r}"
        );
    }
}

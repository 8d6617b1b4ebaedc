//! `idem record show` against real databases: SQLite (a fresh file,
//! always), PostgreSQL and MariaDB when reachable (skipped locally when
//! down, a failure when `CI=true`). It finds a record online, then in the
//! archive; it lists one record per `biz_type` and filters by `biz_type`.
//! Each test works on its own keys.

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_show_finds_online_then_archived_records() {
    for (url, pool) in databases().await {
        let d = dialect(&pool);
        let key = format!("cli-show:{}", ids(1));
        let insert = match d {
            Dialect::Postgres => {
                "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time) \
                 VALUES (?, 'cli', 'no-1', 'abc', '{\"ok\":true}', now() - interval '2 hours', now() - interval '1 hour')"
            }
            Dialect::MySql => {
                "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time) \
                 VALUES (?, 'cli', 'no-1', 'abc', '{\"ok\":true}', UTC_TIMESTAMP(6) - INTERVAL 2 HOUR, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR)"
            }
            Dialect::Sqlite => {
                "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time) \
                 VALUES (?, 'cli', 'no-1', 'abc', '{\"ok\":true}', strftime('%Y-%m-%d %H:%M:%f', 'now', '-2 hours'), strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 hour'))"
            }
        };
        sqlx::query(sql(d, insert))
            .bind(&key)
            .execute(&pool)
            .await
            .expect("insert record");

        let online = json(&url, &["record", "show", &key]);
        assert_eq!(online["key"], key.as_str(), "{d:?}: {online}");
        assert_eq!(online["archived"], false);
        assert_eq!(online["result"], "{\"ok\":true}");
        let table = ok(&url, &["record", "show", &key]);
        assert!(table.contains("no (online)"), "{table}");

        // The record expired an hour ago: the archiver moves it.
        let report = json(&url, &["archive", "--batch", "50"]);
        assert!(report["records"].as_u64().unwrap() >= 1, "{d:?}: {report}");
        assert!(report["batches"].as_u64().unwrap() >= 1);
        let left: i64 = sqlx::query_scalar(sql(
            d,
            "SELECT COUNT(*) FROM idem_record WHERE idempotency_key = ?",
        ))
        .bind(&key)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(left, 0, "{d:?}: not archived");

        let archived = json(&url, &["record", "show", &key]);
        assert_eq!(archived["archived"], true, "{d:?}: {archived}");
        assert_eq!(archived["biz_no"], "no-1");
        assert!(archived["archived_at"].as_str().unwrap().starts_with("20"));
        let text = ok(&url, &["archive"]);
        assert!(text.starts_with("archived "), "{text}");

        // Unknown key: exit code 1 and a clear message.
        let missing = idem(&url, &["record", "show", "cli-show:no-such-key"]);
        assert_eq!(missing.status.code(), Some(1), "{d:?}");
        let err = String::from_utf8_lossy(&missing.stderr);
        assert!(err.contains("no idempotency record with key"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_show_lists_one_record_per_biz_type_and_filters_by_biz_type() {
    for (url, pool) in databases().await {
        let d = dialect(&pool);
        let key = format!("cli-types:{}", ids(1));
        let later = match d {
            Dialect::Postgres => "now() + interval '1 hour'",
            Dialect::MySql => "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR",
            Dialect::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now', '+1 hour')",
        };
        for biz_type in ["send_email", "award_points"] {
            let mark = if d == Dialect::Postgres { "$1" } else { "?" };
            let insert = format!(
                "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, result, expire_time) \
                 VALUES ({mark}, '{biz_type}', 'no-1', 'abc', '\"{biz_type}\"', {later})"
            );
            sqlx::query(sqlx::AssertSqlSafe(insert))
                .bind(&key)
                .execute(&pool)
                .await
                .expect("insert record");
        }
        // Several: an array ordered by biz_type, and a note in the table.
        let all = json(&url, &["record", "show", &key]);
        let types: Vec<&str> = all
            .as_array()
            .unwrap_or_else(|| panic!("{d:?}: not an array: {all}"))
            .iter()
            .map(|r| r["biz_type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["award_points", "send_email"], "{d:?}");
        let table = ok(&url, &["record", "show", &key]);
        assert!(table.contains("2 records of this key"), "{table}");
        // One business type: one object.
        let one = json(&url, &["record", "show", &key, "--biz-type", "send_email"]);
        assert_eq!(one["biz_type"], "send_email", "{d:?}: {one}");
        assert_eq!(one["result"], "\"send_email\"");
        let none = idem(&url, &["record", "show", &key, "--biz-type", "nope"]);
        assert_eq!(none.status.code(), Some(1), "{d:?}");
        assert!(String::from_utf8_lossy(&none.stderr).contains("biz_type \"nope\""));
    }
}

//! What the tests share: the servers' URLs with the skip rule, a number new
//! on every run, and `?` placeholders renumbered for PostgreSQL.

#![allow(dead_code)]

use std::sync::atomic::{AtomicI64, Ordering};

/// The URL of a server (`IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_MYSQL_URL`),
/// or the local default.
pub(crate) fn url(var: &str, default: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// PostgreSQL's URL.
pub(crate) fn postgres_url() -> String {
    url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

/// MariaDB's URL.
pub(crate) fn mysql_url() -> String {
    url("IDEM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
}

/// The skip rule: a run that could not reach its server prints SKIPPED
/// and the test returns, unless `CI=true`, where it fails.
pub(crate) fn skipped(result: &Result<idem_test::Report, idem_test::Error>, test: &str) -> bool {
    match result {
        Err(e) if e.is_unreachable() => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: the server is down and CI=true: {e}"
            );
            eprintln!("SKIPPED: {test}: {e}");
            true
        }
        _ => false,
    }
}

/// A number no earlier run used: ids and keys on a server never meet an
/// earlier run's.
pub(crate) fn run_base() -> i64 {
    static SEQ: AtomicI64 = AtomicI64::new(0);
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    (millis % 1_000_000_000) * 10_000 + SEQ.fetch_add(1, Ordering::Relaxed) * 1_000
}

/// `text` with its `?` placeholders renumbered `$1, $2, …` (PostgreSQL).
pub(crate) fn numbered(text: &str) -> String {
    let mut out = String::new();
    let mut n = 0;
    for c in text.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(c);
        }
    }
    out
}

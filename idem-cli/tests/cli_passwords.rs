//! No password of the database URL in the CLI's messages (issue 45): a
//! "cannot connect to …" error names the URL with its passwords hidden,
//! wherever the URL holds them, or does not echo a URL it cannot read.

use std::process::Output;

/// `idem --database-url <url> outbox stats`, nothing listening on port 1.
fn stats(url: &str) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .env_remove("DATABASE_URL")
        .args(["--database-url", url, "--connect-timeout", "5s"])
        .args(["outbox", "stats"])
        .output()
        .unwrap()
}

#[test]
fn a_connection_error_shows_no_password() {
    for (url, secret, shown) in [
        // A password as a query parameter, which sqlx accepts.
        (
            "postgres://app@127.0.0.1:1/orders?password=s3cret",
            "s3cret",
            "postgres://app@127.0.0.1:1/orders?password=***",
        ),
        (
            "postgres://app@127.0.0.1:1/orders?sslmode=disable&sslpassword=s3cret",
            "s3cret",
            "postgres://app@127.0.0.1:1/orders?sslmode=disable&sslpassword=***",
        ),
        // An unescaped `@` in the password: none of it, not its tail.
        (
            "postgres://u:p@ss@127.0.0.1:1/db",
            "ss@",
            "postgres://u:***@127.0.0.1:1/db",
        ),
        (
            "mysql://root:pa%40ss@127.0.0.1:1/test",
            "ss",
            "mysql://root:***@127.0.0.1:1/test",
        ),
        // The userinfo cut short by a `/` in the password: not echoed.
        (
            "postgres://u:12/s3cret@127.0.0.1:1/db",
            "s3cret",
            "<unparsable URL>",
        ),
    ] {
        let out = stats(url);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{url}: {err}");
        assert!(
            err.contains(&format!("cannot connect to {shown}")),
            "{url}: {err}"
        );
        assert!(!err.contains(secret), "{url}: {secret:?} printed: {err}");
    }
}

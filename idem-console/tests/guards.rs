//! The console's guards against a hostile page or network, over real
//! HTTP: the `Host` allowlist (DNS rebinding), the sign-in throttle and
//! the token strength check, the public origin behind a reverse proxy
//! that rewrites `Host`. On SQLite, PostgreSQL and MariaDB where a page
//! reads the database.

mod common;
use common::*;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HOST};

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .unwrap()
}

/// GETs `url` with `Host: host`: the status and the body.
async fn get_as(url: &str, host: &str) -> (StatusCode, String) {
    let r = client()
        .get(url)
        .header(HOST, host)
        .send()
        .await
        .expect("GET");
    let status = r.status();
    (status, r.text().await.unwrap())
}

/// A page of another site that points a name of its own at the console
/// (DNS rebinding) sends that name as `Host`: refused, on every path;
/// the console's own addresses and the names it was given pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_answers_only_to_its_addresses_and_the_hosts_it_was_given() {
    for db in databases("guards_hosts").await {
        let d = db.d;
        db.message("payments", "f0", "failed", 5, Some("secret reason"))
            .await;
        let served = serve(Console::new(db.pool.clone())).await;
        let base = &served.base;
        let port = base.rsplit(':').next().unwrap();
        for path in [
            "/",
            "/live",
            "/dead-letters",
            "/metrics",
            "/health",
            "/nowhere",
        ] {
            let (status, body) = get_as(&format!("{base}{path}"), "evil.example").await;
            assert_eq!(
                status,
                StatusCode::MISDIRECTED_REQUEST,
                "{d:?} {path}: {body}"
            );
            assert!(!body.contains("secret reason"), "{d:?} {path}: {body}");
            assert!(
                body.contains("evil.example") && body.contains("--allowed-host"),
                "{d:?} {path}: {body}"
            );
        }
        let (status, _) = get_as(&format!("{base}/"), &format!("evil.example:{port}")).await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{d:?}");
        let r = client()
            .post(format!("{base}/login"))
            .header(HOST, "evil.example")
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body("token=whatever-it-may-be-0123")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::MISDIRECTED_REQUEST, "{d:?}");
        // Its own address, localhost, IP addresses: answered.
        for host in [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("LocalHost:{port}"),
            format!("[::1]:{port}"),
        ] {
            let (status, body) = get_as(&format!("{base}/dead-letters"), &host).await;
            assert_eq!(status, StatusCode::OK, "{d:?} {host}: {body}");
            assert!(body.contains("secret reason"), "{d:?} {host}");
        }

        // Given names: at any port, or at the one given.
        let console = Console::new(db.pool.clone())
            .allowed_host("console.example.com")
            .unwrap()
            .allowed_host("ops.example.com:8443")
            .unwrap();
        let served = serve(console).await;
        let base = &served.base;
        for (host, expected) in [
            ("console.example.com", StatusCode::OK),
            ("Console.Example.com:8080", StatusCode::OK),
            ("ops.example.com:8443", StatusCode::OK),
            ("ops.example.com", StatusCode::MISDIRECTED_REQUEST),
            ("example.com", StatusCode::MISDIRECTED_REQUEST),
            ("evil.example", StatusCode::MISDIRECTED_REQUEST),
        ] {
            let (status, body) = get_as(&format!("{base}/dead-letters"), host).await;
            assert_eq!(status, expected, "{d:?} {host}: {body}");
        }
        let (status, _) = get_as(&format!("{base}/"), "127.0.0.1").await;
        assert_eq!(status, StatusCode::OK, "{d:?}");

        // Mounted in an application: its own routes stay its own.
        let app = axum::Router::new()
            .route("/", axum::routing::get(|| async { "the application" }))
            .merge(
                Console::new(db.pool.clone())
                    .mount_at("/ops/idem")
                    .unwrap()
                    .router(),
            );
        let served = serve_router(app).await;
        let base = &served.base;
        let (status, body) = get_as(&format!("{base}/"), "app.example").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "the application"));
        let (status, _) = get_as(&format!("{base}/ops/idem/"), "app.example").await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{d:?}");
    }
    let pool = any(&idem_testkit::sqlite_url(), 1).await.unwrap();
    for bad in ["", "a b", "https://console.example.com", "host:port", "a/b"] {
        let e = Console::new(pool.clone()).allowed_host(bad).unwrap_err();
        assert!(
            e.to_string().starts_with("unusable allowed host"),
            "{bad:?}: {e}"
        );
    }
}

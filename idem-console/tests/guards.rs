//! The console's guards against a hostile page or network, over real
//! HTTP: the `Host` allowlist (DNS rebinding), the sign-in throttle and
//! the token strength check, the public origin behind a reverse proxy
//! that rewrites `Host`. On SQLite, PostgreSQL and MariaDB where a page
//! reads the database.

mod common;
use common::*;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, COOKIE, HOST, LOCATION, ORIGIN, RETRY_AFTER, SET_COOKIE};

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

const TOKEN: &str = "guards-write-token-5f1c9e27b3a4";

/// A console served with its peers' addresses (as `idem serve` serves
/// it, so that the throttle tells clients apart), until dropped.
struct WithPeers {
    base: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WithPeers {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_with_peers<DB: idem_runtime::Operable>(console: Console<DB>) -> WithPeers {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = console
        .router()
        .into_make_service_with_connect_info::<std::net::SocketAddr>();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    WithPeers { base, task }
}

/// A client whose connections come from `ip` (one of 127.0.0.0/8).
fn client_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(std::time::Duration::from_secs(10))
        .local_address(ip.parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap()
}

/// Signs in with `token`: the status, `Retry-After` (if any) and the body.
async fn sign_in(
    http: &reqwest::Client,
    base: &str,
    token: &str,
) -> (StatusCode, Option<u64>, String) {
    let body = form_urlencoded::Serializer::new(String::new())
        .append_pair("token", token)
        .finish();
    let r = http
        .post(format!("{base}/login"))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .expect("POST /login");
    let status = r.status();
    let retry = r.headers().get(RETRY_AFTER).map(|v| {
        v.to_str()
            .unwrap()
            .parse::<u64>()
            .expect("Retry-After in seconds")
    });
    (status, retry, r.text().await.unwrap())
}

/// Wrong tokens in a row: the first five are checked (403), then every
/// attempt is refused unchecked (429 and `Retry-After`), even the right
/// token, a bearer's too, until the back-off ends; another client is not
/// held back; after the back-off the right token signs in. Over HTTP with
/// the peers' addresses, as `idem serve` serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_are_throttled_per_client_and_the_right_one_signs_in_after_the_back_off() {
    // Sign-in reads no table: SQLite is enough.
    let pool = any(&idem_testkit::sqlite_url(), 1).await.unwrap();
    let console = Console::new(pool).write_token(TOKEN).unwrap();
    let served = serve_with_peers(console).await;
    let base = &served.base;
    let me = client_from("127.0.0.1");
    let wrong = "wrong-token-0123456789abcdef";
    let mut before_fifth = std::time::Instant::now();
    for i in 0..5 {
        before_fifth = std::time::Instant::now();
        let (status, retry, html) = sign_in(&me, base, wrong).await;
        assert_eq!(
            (status, retry),
            (StatusCode::FORBIDDEN, None),
            "attempt {i}: {html}"
        );
        assert!(html.contains(r#"id="login-error""#), "{html}");
    }
    // The sixth, even with the right token, and a bearer: refused
    // unchecked (sent well within the first back-off, 1 s).
    if before_fifth.elapsed() < std::time::Duration::from_millis(500) {
        let (status, retry, html) = sign_in(&me, base, TOKEN).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{html}");
        assert_eq!(retry, Some(1));
        assert!(html.contains("Too many wrong tokens"), "{html}");
    }
    if before_fifth.elapsed() < std::time::Duration::from_millis(500) {
        let bearer = me
            .post(format!("{base}/requeue"))
            .bearer_auth(wrong)
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body("id=1&max_id=1")
            .send()
            .await
            .unwrap();
        assert_eq!(bearer.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(bearer.headers()[RETRY_AFTER], "1");
        let page = bearer.text().await.unwrap();
        assert!(page.contains("Too many wrong tokens"), "{page}");
    }
    // Hammering: the tokens are no longer checked.
    let (mut refused, mut checked) = (0, 0);
    let start = std::time::Instant::now();
    for _ in 0..200 {
        let (status, retry, html) = sign_in(&me, base, wrong).await;
        match status {
            StatusCode::TOO_MANY_REQUESTS => {
                let retry = retry.expect("Retry-After");
                assert!((1..=300).contains(&retry), "{retry}");
                refused += 1;
            }
            StatusCode::FORBIDDEN => checked += 1,
            other => panic!("{other}: {html}"),
        }
    }
    let took = start.elapsed();
    println!(
        "200 attempts after 5 wrong tokens in {took:?}: {refused} refused unchecked, \
         {checked} checked"
    );
    // Back-offs of 1, 2, 4… s: at most one more check per doubling.
    let doublings = (before_fifth.elapsed().as_secs_f64() + 1.0).log2().ceil() as usize + 1;
    assert!(checked <= doublings, "{checked} checked in {took:?}");
    assert!(refused >= 200 - doublings, "{refused}");

    // Another client is checked, not held back.
    let other = client_from("127.0.0.2");
    let (status, retry, _) = sign_in(&other, base, wrong).await;
    assert_eq!((status, retry), (StatusCode::FORBIDDEN, None));

    // 40 wrong tokens at once from a third client: five are checked.
    let third = client_from("127.0.0.3");
    let start = std::time::Instant::now();
    let burst: Vec<_> = (0..40)
        .map(|_| {
            let (third, base) = (third.clone(), base.clone());
            tokio::spawn(async move { sign_in(&third, &base, wrong).await.0 })
        })
        .collect();
    let mut statuses = Vec::new();
    for b in burst {
        statuses.push(b.await.unwrap());
    }
    let checked = statuses
        .iter()
        .filter(|s| **s == StatusCode::FORBIDDEN)
        .count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    println!(
        "40 at once: {checked} checked, {refused} refused, in {:?}",
        start.elapsed()
    );
    assert_eq!(checked + refused, 40, "{statuses:?}");
    if start.elapsed() < std::time::Duration::from_millis(900) {
        assert_eq!(checked, 5, "{statuses:?}");
    }

    // After the back-off (as long as Retry-After says), the right token
    // signs in; the count then starts afresh.
    let mut signed_in = false;
    for _ in 0..5 {
        let (status, retry, html) = sign_in(&me, base, TOKEN).await;
        match (status, retry) {
            (StatusCode::SEE_OTHER, _) => {
                signed_in = true;
                break;
            }
            (StatusCode::TOO_MANY_REQUESTS, Some(secs)) => {
                tokio::time::sleep(std::time::Duration::from_millis(secs * 1000 + 100)).await;
            }
            other => panic!("{other:?}: {html}"),
        }
    }
    assert!(signed_in, "the right token after the back-off");
    let (status, retry, _) = sign_in(&me, base, wrong).await;
    assert_eq!((status, retry), (StatusCode::FORBIDDEN, None));
}

/// A write token that is short or easy to guess is refused when the
/// console is built, saying why and how to make one.
#[tokio::test]
async fn weak_write_tokens_are_refused_at_start_up() {
    let pool = any(&idem_testkit::sqlite_url(), 1).await.unwrap();
    for (weak, says) in [
        ("aaaaaaaaaaaaaaaa", "easy to guess"),
        ("0123456789abcdef", "easy to guess"),
        ("abcdefghijklmnopqrstuvwxyz", "easy to guess"),
        ("password12345678", "easy to guess"),
        ("short", "at least 16 characters"),
    ] {
        let e = Console::new(pool.clone())
            .write_token(weak)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(says) && e.contains("openssl rand -hex 16"),
            "{weak}: {e}"
        );
    }
    for strong in [
        TOKEN,
        "ac457a4b69173f7967c2b78204bc04da",
        "Zq3vL9xR2mT8wK4p",
    ] {
        assert!(
            Console::new(pool.clone()).write_token(strong).is_ok(),
            "{strong}"
        );
    }
}

/// Behind nginx's default `proxy_pass http://127.0.0.1:8080`, a browser
/// at `https://console.example.com` sends that as `Origin` while the
/// console sees `Host: 127.0.0.1:8080`: without `public_origin` every
/// sign-in and requeue is refused as cross-origin; with it they pass, and
/// another origin is still refused. Caddy passes `Host` on: the public
/// origin's host is answered too. On the three backends (the requeue
/// changes the row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_proxy_that_rewrites_host_the_public_origin_signs_in_and_requeues() {
    const PUBLIC: &str = "https://console.example.com";
    for db in databases("guards_proxy").await {
        let d = db.d;
        let dead = db
            .message("payments", "f0", "failed", 5, Some("boom"))
            .await;
        // As nginx forwards a browser's sign-in: Host is the upstream's.
        let login = |base: String, origin: &'static str| async move {
            let body = form_urlencoded::Serializer::new(String::new())
                .append_pair("token", TOKEN)
                .append_pair("next", "/dead-letters")
                .finish();
            client()
                .post(format!("{base}/login"))
                .header(ORIGIN, origin)
                .header("sec-fetch-site", "same-origin")
                .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(body)
                .send()
                .await
                .expect("POST /login")
        };
        let plain = serve(Console::new(db.pool.clone()).write_token(TOKEN).unwrap()).await;
        let r = login(plain.base.clone(), PUBLIC).await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{d:?}");
        let html = r.text().await.unwrap();
        assert!(html.contains("--public-origin"), "{d:?}: {html}");

        let console = Console::new(db.pool.clone())
            .write_token(TOKEN)
            .unwrap()
            .public_origin(PUBLIC)
            .unwrap();
        let served = serve(console).await;
        let base = &served.base;
        let r = login(base.clone(), "https://evil.example").await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{d:?}: another origin");
        let r = login(base.clone(), "http://console.example.com").await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{d:?}: another scheme");
        let r = login(base.clone(), PUBLIC).await;
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "{d:?}");
        assert_eq!(r.headers()[LOCATION], "/dead-letters");
        let set = r.headers()[SET_COOKIE].to_str().unwrap();
        let cookie = set.split(';').next().unwrap().to_string();

        // The requeue, confirmed from the preview as the browser would.
        let r = client()
            .get(format!("{base}/requeue?id={dead}"))
            .header(COOKIE, &cookie)
            .send()
            .await
            .unwrap();
        let html = r.text().await.unwrap();
        let csrf = input_value(&html, "csrf").expect("the preview's form");
        let confirm = |origin: &'static str| {
            let body = form_urlencoded::Serializer::new(String::new())
                .append_pair("id", &dead.to_string())
                .append_pair("max_id", &dead.to_string())
                .append_pair("previewed", "1")
                .append_pair("csrf", &csrf)
                .finish();
            client()
                .post(format!("{base}/requeue"))
                .header(COOKIE, &cookie)
                .header(ORIGIN, origin)
                .header("sec-fetch-site", "same-origin")
                .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(body)
                .send()
        };
        let r = confirm("https://evil.example").await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{d:?}");
        assert_eq!(db.status(dead).await, "failed", "{d:?}");
        let r = confirm(PUBLIC).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{d:?}");
        assert_eq!(db.status(dead).await, "pending", "{d:?}");

        // Caddy forwards the browser's Host: the public origin's is answered.
        let (status, _) = get_as(&format!("{base}/dead-letters"), "console.example.com").await;
        assert_eq!(status, StatusCode::OK, "{d:?}");
        let (status, _) = get_as(&format!("{base}/dead-letters"), "evil.example").await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{d:?}");
    }
    let pool = any(&idem_testkit::sqlite_url(), 1).await.unwrap();
    for bad in [
        "console.example.com",
        "https://console.example.com/ops",
        "ftp://x",
        "null",
    ] {
        let e = Console::new(pool.clone()).public_origin(bad).unwrap_err();
        assert!(
            e.to_string().starts_with("unusable public origin"),
            "{bad:?}: {e}"
        );
    }
}

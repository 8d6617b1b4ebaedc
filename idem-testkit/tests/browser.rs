//! The browser harness on a real headless Chromium: a tiny axum app served
//! in-process (a page with a form that POSTs, and a result page) driven
//! through `chromedriver`; a screenshot; and no process of the browser left
//! once its handle is closed, dropped without `close`, or dropped by the
//! unwinding of a test that panics (`pgrep -f <its scratch directory>`).
//!
//! Skipped (with a `SKIPPED: …` line) when `chromium` or `chromedriver` is
//! not installed, e.g. `IDEM_TEST_CHROMEDRIVER=/nonexistent`; a failure
//! when `CI=true`.

use axum::Router;
use axum::extract::Form;
use axum::response::Html;
use axum::routing::{get, post};
use idem_testkit::browser::Browser;
use idem_testkit::browser::fantoccini::Locator;
use idem_testkit::cluster::Scratch;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

const PAGE: &str = r#"<!doctype html>
<html><head><title>Idem console</title></head>
<body>
  <h1 id="title">Console</h1>
  <p id="greeting">Hello from idem</p>
  <form method="post" action="/submit">
    <input name="name" id="name">
    <button type="submit" id="send">Send</button>
  </form>
</body></html>"#;

/// The result page: what the form sent, escaped.
async fn submit(Form(fields): Form<HashMap<String, String>>) -> Html<String> {
    let name = fields
        .get("name")
        .map(String::as_str)
        .unwrap_or("")
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    Html(format!(
        "<!doctype html><html><head><title>Sent</title></head>\
         <body><p id=\"result\">Received: {name}</p></body></html>"
    ))
}

/// Serves the app on 127.0.0.1 (a port of its own); returns its base URL.
async fn serve() -> String {
    let app = Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/submit", post(submit));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the app");
    let addr = listener.local_addr().expect("the app's address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve the app") });
    format!("http://{addr}")
}

/// The processes `pgrep -f` finds naming `dir` (pids, one a line).
fn pgrep(dir: &Path) -> String {
    let out = Command::new("pgrep")
        .arg("-a")
        .arg("-f")
        .arg(dir)
        .output()
        .expect("run pgrep");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn form_round_trip_and_screenshot() {
    let Some(browser) = Browser::start("browser_form_round_trip").await else {
        return;
    };
    let base = serve().await;
    let page = browser.client();

    page.goto(&format!("{base}/")).await.expect("load the page");
    assert_eq!(page.title().await.expect("title"), "Idem console");
    let greeting = page
        .find(Locator::Css("#greeting"))
        .await
        .expect("find #greeting")
        .text()
        .await
        .expect("its text");
    assert_eq!(greeting, "Hello from idem");

    let form = page
        .form(Locator::Css("form"))
        .await
        .expect("find the form");
    form.set_by_name("name", "Ada <3")
        .await
        .expect("fill the name");
    form.submit().await.expect("submit the form");
    // While the browser navigates to the result page, a look-up can fail
    // with "aborted by navigation" instead of "no such element": both mean
    // "not there yet", until the deadline.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let result = loop {
        let found = match page.find(Locator::Id("result")).await {
            Ok(e) => e.text().await,
            Err(e) => Err(e),
        };
        match found {
            Ok(text) => break text,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the result page: {e:?}"),
        }
    };
    assert_eq!(result, "Received: Ada <3");
    let url = page.current_url().await.expect("current URL");
    assert_eq!(url.path(), "/submit");

    let shots = Scratch::new("browser-shots");
    let png = shots.join("result.png");
    browser.screenshot(&png).await;
    let bytes = std::fs::read(&png).expect("read the screenshot");
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "not a PNG: {:?}",
        &bytes[..bytes.len().min(16)]
    );
    assert!(
        bytes.len() > 1000,
        "a tiny screenshot: {} bytes",
        bytes.len()
    );

    let dir = browser.dir().to_path_buf();
    assert!(
        !pgrep(&dir).is_empty(),
        "Chromium runs with its profile in {}",
        dir.display()
    );
    browser.close().await;
    let left = pgrep(&dir);
    assert!(left.is_empty(), "left after close():\n{left}");
    assert!(!dir.exists(), "the scratch directory is removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_without_close_leaves_no_process() {
    let Some(browser) = Browser::start("browser_dropped_without_close").await else {
        return;
    };
    let base = serve().await;
    browser
        .client()
        .goto(&format!("{base}/"))
        .await
        .expect("load the page");
    let dir = browser.dir().to_path_buf();
    let running = pgrep(&dir);
    assert!(
        running.lines().count() >= 2,
        "Chromium and its helpers run with {} in their command line:\n{running}",
        dir.display()
    );

    eprintln!("running before the drop:\n{running}");

    // As when a test panics: no close(), the handle just drops.
    drop(browser);
    let left = pgrep(&dir);
    assert!(left.is_empty(), "left after drop:\n{left}");
    assert!(!dir.exists(), "the scratch directory is removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_that_panics_leaves_no_process() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    // A test body that panics while its Browser is open: the unwinding
    // drops it.
    let body = tokio::spawn(async move {
        let Some(browser) = Browser::start("browser_panics").await else {
            return;
        };
        browser
            .client()
            .goto("about:blank")
            .await
            .expect("load a page");
        let dir = browser.dir().to_path_buf();
        let running = pgrep(&dir);
        tx.send(dir).expect("send the directory");
        assert!(running.is_empty(), "the test fails here, as intended");
    });
    match body.await {
        Ok(()) => return, // skipped: chromium or chromedriver not installed
        Err(e) => assert!(e.is_panic(), "the body panicked: {e}"),
    }
    let dir = rx.await.expect("the directory, sent before the panic");
    let left = pgrep(&dir);
    assert!(left.is_empty(), "left after a panic:\n{left}");
    assert!(!dir.exists(), "the scratch directory is removed");
}

//! Saves a PNG of a console page, as headless Chromium renders it: how the
//! README's picture is made.
//!
//! ```text
//! cargo run -p idem-examples --bin coupon                  # an incident, in /tmp/idem-coupon-example.db
//! cargo run -p idem-cli -- --database-url sqlite:///tmp/idem-coupon-example.db serve &
//! cargo run -p idem-console --example screenshot -- http://127.0.0.1:8080/ docs/console.png
//! ```
//!
//! Needs Debian's `chromium` and `chromium-driver`. Waits a few seconds
//! first, so that the chart holds some backlog samples.

use idem_testkit::browser::Browser;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(url), Some(out)) = (args.first(), args.get(1)) else {
        eprintln!("usage: screenshot <url> <out.png> [wait seconds, default 8]");
        return ExitCode::from(2);
    };
    let wait: u64 = args.get(2).and_then(|w| w.parse().ok()).unwrap_or(8);
    let Some(browser) = Browser::start("screenshot").await else {
        eprintln!("chromium or chromedriver is not installed");
        return ExitCode::from(2);
    };
    if let Err(e) = browser.client().goto(url).await {
        eprintln!("cannot open {url}: {e}");
        browser.close().await;
        return ExitCode::from(1);
    }
    tokio::time::sleep(Duration::from_secs(wait)).await;
    browser.screenshot(Path::new(out)).await;
    browser.close().await;
    println!("saved {out}");
    ExitCode::SUCCESS
}

//! The gauges read from the database, exported once per database whatever
//! the number of consoles: two consoles over one database, each with
//! `database_gauges_apart`, leave them out of their `/metrics` and serve
//! the same ones at `/metrics/database`, which is scraped through one
//! address (whichever console answers). A console without it keeps them
//! in `/metrics`, as before.

use crate::common::relay::*;
use idem_console::Console;
use idem_runtime::Operable;

/// Serves `console` on a loopback port; its base URL.
async fn serve<DB: Operable>(console: Console<DB>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, console.router()).await });
    format!("http://{at}")
}

async fn get(url: String) -> String {
    let r = reqwest::get(&url).await.unwrap();
    assert!(r.status().is_success(), "{url}: {}", r.status());
    r.text().await.unwrap()
}

/// The sample lines of `text` that name `topic`.
fn lines_of(text: &str, topic: &str) -> Vec<String> {
    let label = format!("topic=\"{topic}\"");
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(&label))
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

macro_rules! gauge_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn two_consoles_export_the_database_gauges_once() {
                let Some(pool) = pool().await else { return };
                let topic = topic("gauges");
                produce(&pool, &topic, 3).await;
                let a = serve(Console::new(pool.clone()).database_gauges_apart()).await;
                let b = serve(Console::new(pool.clone()).database_gauges_apart()).await;
                let both = serve(Console::new(pool.clone())).await;

                // Each console's own scrape: no database gauge.
                for url in [&a, &b] {
                    let own = get(format!("{url}/metrics")).await;
                    assert!(lines_of(&own, &topic).is_empty(), "{own}");
                    assert!(own.contains("idem_console_database_up 1"), "{own}");
                }
                // The database scrape, through one address: the same gauges
                // whichever console answers, each one once.
                let from_a = get(format!("{a}/metrics/database")).await;
                let from_b = get(format!("{b}/metrics/database")).await;
                // (The age of the oldest pending message grows between two
                // scrapes: the figures, not the age, are compared.)
                let counts = |text: &str| -> Vec<String> {
                    let mut l = lines_of(text, &topic);
                    l.retain(|l| !l.starts_with("idem_outbox_oldest_pending_age_seconds"));
                    l
                };
                let gauges = counts(&from_a);
                assert_eq!(gauges.len(), 3, "{from_a}");
                assert_eq!(gauges, counts(&from_b));
                let pending = format!("idem_outbox_pending{{topic=\"{topic}\"}} 3");
                assert_eq!(
                    gauges.iter().filter(|l| **l == pending).count(),
                    1,
                    "{from_a}"
                );
                assert!(from_a.contains("# HELP idem_outbox_pending "), "{from_a}");
                assert!(!from_a.contains("idem_console_database_up"), "{from_a}");

                // Scraping every target of both jobs: the pending gauge
                // once in all.
                let mut scraped = String::new();
                for url in [
                    format!("{a}/metrics"),
                    format!("{b}/metrics"),
                    format!("{a}/metrics/database"),
                ] {
                    scraped += &get(url).await;
                }
                let pending_lines = scraped.lines().filter(|l| **l == *pending).count();
                assert_eq!(pending_lines, 1, "{scraped}");

                // Without the option, `/metrics` carries them, as before.
                let all = get(format!("{both}/metrics")).await;
                assert!(all.lines().any(|l| l == pending), "{all}");
            }
        }
    };
}

idem_testkit::for_each_backend!(gauge_tests);

//! The overview's chart holds what the sampler read, never what page
//! views add (issue 24, defect 5): however many GETs of `/` and `/live`,
//! the backlog line keeps its points, on SQLite, PostgreSQL and MariaDB.

mod common;
use common::*;
use std::time::{Duration, Instant};

const LINE: &str = r#"class="backlog" fill="none" points=""#;

/// The backlog line's points in a `/live` answer.
fn backlog_points(html: &str) -> usize {
    let at = html
        .find(LINE)
        .unwrap_or_else(|| panic!("no backlog line in\n{html}"));
    let rest = &html[at + LINE.len()..];
    rest[..rest.find('"').expect("a closed attribute")]
        .split_whitespace()
        .count()
}

async fn live(base: &str) -> String {
    let r = reqwest::get(format!("{base}/live"))
        .await
        .expect("GET /live");
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    r.text().await.expect("the body")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_views_add_no_chart_points() {
    for db in databases("chart_points").await {
        let d = db.d;
        db.message("payments", "p0", "pending", 0, None).await;
        // One sample an hour: the sampler's first, at start, is all the
        // chart may hold during the test.
        let served =
            serve(Console::new(db.pool.clone()).sample_every(Duration::from_secs(3600))).await;
        let start = Instant::now();
        let (points, size) = loop {
            let html = live(&served.base).await;
            let n = backlog_points(&html);
            if n > 0 {
                break (n, html.len());
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{d:?}: the sampler took no sample"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // 400 views, unauthenticated, 16 at a time.
        let client = reqwest::Client::new();
        for round in 0..25 {
            let views: Vec<_> = (0..16)
                .map(|i| {
                    let path = if (round + i) % 2 == 0 { "/live" } else { "/" };
                    let req = client.get(format!("{}{path}", served.base)).send();
                    tokio::spawn(async move { req.await.expect("GET").status() })
                })
                .collect();
            for v in views {
                assert_eq!(v.await.unwrap(), reqwest::StatusCode::OK, "{d:?}");
            }
        }
        let html = live(&served.base).await;
        assert_eq!(
            backlog_points(&html),
            points,
            "{d:?}: page views added chart points"
        );
        assert!(
            html.len() < size + 200,
            "{d:?}: /live grew from {size} to {} bytes",
            html.len()
        );
    }
}

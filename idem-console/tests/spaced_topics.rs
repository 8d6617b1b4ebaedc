//! Topics with spaces (issue 36, defect 2): topics are compared byte for
//! byte where they are stored, so `"pay "` and `" pay"` are topics of their
//! own beside `pay`. The console takes filter and requeue values exactly
//! as sent (it trimmed them: requeueing `"pay "` took `pay`'s two messages
//! and left its own), shows such topics quoted so their spaces are seen,
//! and its forms carry them back unchanged. On SQLite, PostgreSQL and
//! MariaDB; every requeue checked in the database.

mod common;
use common::*;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, COOKIE};

const TOKEN: &str = "spaced-topics-token-4c81e0b95d27";

async fn get(url: &str, cookie: &str) -> (StatusCode, String) {
    let r = client()
        .get(url)
        .header(COOKIE, cookie)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.text().await.unwrap())
}

fn query(pairs: &[(&str, &str)]) -> String {
    form(
        &pairs
            .iter()
            .map(|(k, v)| (*k, v.to_string()))
            .collect::<Vec<_>>(),
    )
}

async fn sign_in(base: &str) -> String {
    sign_in_with(base, TOKEN).await
}

/// The ids of the rows of the page's message table.
fn listed(html: &str) -> Vec<i64> {
    html.split("data-id=\"")
        .skip(1)
        .map(|s| s[..s.find('"').unwrap()].parse().unwrap())
        .collect()
}

/// Previews a requeue of `topic`, confirms it: how many it requeued.
async fn requeue_topic(base: &str, cookie: &str, topic: &str, expect: i64) -> i64 {
    let url = format!("{base}/requeue?{}", query(&[("topic", topic)]));
    let (status, html) = get(&url, cookie).await;
    assert_eq!(status, StatusCode::OK, "{topic:?}: {html}");
    assert_eq!(number_of(&html, "preview-count"), expect, "{topic:?}");
    // The confirmation carries the topic back exactly.
    assert_eq!(
        input_value(&html, "topic").as_deref(),
        Some(topic),
        "{html}"
    );
    let fields = form(&[
        ("topic", topic.to_string()),
        ("max_id", input_value(&html, "max_id").unwrap()),
        ("previewed", expect.to_string()),
        ("csrf", input_value(&html, "csrf").unwrap()),
    ]);
    let r = client()
        .post(format!("{base}/requeue"))
        .header(COOKIE, cookie)
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(fields)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    number_of(&r.text().await.unwrap(), "requeued-count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_with_spaces_is_its_own_topic_in_lists_previews_and_requeues() {
    for db in databases("spaced_topics").await {
        let d = db.d;
        let pay1 = db.message("pay", "m1", "failed", 5, Some("boom")).await;
        let pay2 = db.message("pay", "m2", "failed", 5, Some("boom")).await;
        let trailing = db.message("pay ", "m3", "failed", 5, Some("boom")).await;
        let leading = db.message(" pay", "m4", "failed", 5, Some("boom")).await;
        let console = Console::new(db.pool.clone()).write_token(TOKEN).unwrap();
        let served = serve(console).await;
        let base = &served.base;
        let cookie = sign_in(base).await;

        // The overview tells the three topics apart: the spaced ones quoted.
        let (_, html) = get(&format!("{base}/"), &cookie).await;
        for shown in ["&quot;pay\u{a0}&quot;", "&quot;\u{a0}pay&quot;"] {
            assert!(html.contains(shown), "{d:?}: no {shown:?} in\n{html}");
        }
        assert!(html.contains(r#"data-topic="pay ""#), "{d:?}");

        // A list of one spaced topic: its message only; the filter's
        // option holds the topic exactly and is the one selected.
        let url = format!("{base}/dead-letters?{}", query(&[("topic", "pay ")]));
        let (status, html) = get(&url, &cookie).await;
        assert_eq!(status, StatusCode::OK, "{d:?}: {html}");
        assert_eq!(listed(&html), vec![trailing], "{d:?}: {html}");
        assert!(
            text_of(&html, "count").unwrap().starts_with("1 failed"),
            "{d:?}: {:?}",
            text_of(&html, "count")
        );
        assert!(html.contains(r#"<option value="pay " selected>"#), "{html}");
        assert!(html.contains(r#"<option value=" pay">"#), "{html}");
        let url = format!("{base}/dead-letters?{}", query(&[("topic", "pay")]));
        assert_eq!(listed(&get(&url, &cookie).await.1), vec![pay1, pay2]);
        // An empty value is no filter.
        let (_, html) = get(&format!("{base}/dead-letters?topic="), &cookie).await;
        assert_eq!(listed(&html), vec![pay1, pay2, trailing, leading], "{d:?}");

        // Requeueing "pay " takes its one message, not pay's two.
        assert_eq!(requeue_topic(base, &cookie, "pay ", 1).await, 1, "{d:?}");
        assert_eq!(db.status(trailing).await, "pending", "{d:?}");
        for id in [pay1, pay2, leading] {
            assert_eq!(db.status(id).await, "failed", "{d:?}: message {id}");
        }
        assert_eq!(requeue_topic(base, &cookie, " pay", 1).await, 1, "{d:?}");
        assert_eq!(db.status(leading).await, "pending", "{d:?}");
        for id in [pay1, pay2] {
            assert_eq!(db.status(id).await, "failed", "{d:?}: message {id}");
        }
        assert_eq!(requeue_topic(base, &cookie, "pay", 2).await, 2, "{d:?}");
        assert_eq!(
            db.count(
                "SELECT COUNT(*) FROM idem_outbox WHERE status = 'failed'",
                &[]
            )
            .await,
            0,
            "{d:?}"
        );
    }
}

//! Topics with spaces in the `idem` binary (issue 36, defect 2): topics
//! are compared byte for byte where they are stored, so `--topic "pay "`
//! lists and requeues that topic's messages only, never `pay`'s; its
//! tables quote such a topic so that its spaces are seen; an empty
//! `--topic` filters nothing (and is refused for a requeue, which would
//! otherwise take nothing or everything).
//!
//! On the shared servers each run has topics of its own (`cli-sp-<n>`,
//! with spaces added around them); the SQLite file is the test's own.

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_with_spaces_is_listed_shown_and_requeued_exactly() {
    for (url, pool) in databases().await {
        let d = dialect(&pool);
        let plain = format!("cli-sp-{}", ids(1));
        let trailing = format!("{plain} ");
        let leading = format!(" {plain}");
        let failed = |topic: &str, msg: &str| {
            let (pool, topic, msg) = (pool.clone(), topic.to_string(), msg.to_string());
            async move { insert_message(&pool, &topic, &msg, "{}", "failed", 5, Some("boom")).await }
        };
        let p1 = failed(&plain, "m1").await;
        let p2 = failed(&plain, "m2").await;
        let t1 = failed(&trailing, "m3").await;
        let l1 = failed(&leading, "m4").await;
        let listed = |topic: &str| -> Vec<i64> {
            json(&url, &["outbox", "list", "--topic", topic])
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].as_i64().unwrap())
                .collect()
        };
        assert_eq!(listed(&plain), vec![p1, p2], "{d:?}");
        assert_eq!(listed(&trailing), vec![t1], "{d:?}");
        assert_eq!(listed(&leading), vec![l1], "{d:?}");

        // The tables quote the spaced topics; the plain one as it is.
        let table = ok(&url, &["outbox", "list", "--topic", &trailing]);
        assert!(table.contains(&format!("\"{plain} \"")), "{d:?}:\n{table}");
        let table = ok(&url, &["outbox", "stats", "--topic", &leading]);
        assert!(table.contains(&format!("\" {plain}\"")), "{d:?}:\n{table}");
        let table = ok(&url, &["outbox", "list", "--topic", &plain]);
        assert!(!table.contains('"'), "{d:?}:\n{table}");

        // Requeueing "pay " takes its one message, not pay's two.
        let done = json(&url, &["outbox", "requeue", "--topic", &trailing]);
        assert_eq!(done["requeued"], 1, "{d:?}: {done}");
        let status = |rows: Vec<(i64, String, i64, Option<String>)>| {
            rows.into_iter().map(|r| (r.0, r.1)).collect::<Vec<_>>()
        };
        assert_eq!(
            status(rows_of(&pool, &trailing).await),
            vec![(t1, "pending".into())]
        );
        assert_eq!(
            status(rows_of(&pool, &plain).await),
            vec![(p1, "failed".into()), (p2, "failed".into())],
            "{d:?}"
        );
        assert_eq!(
            status(rows_of(&pool, &leading).await),
            vec![(l1, "failed".into())]
        );

        // An empty --topic: no filter for a list; refused for a requeue.
        let out = idem(&url, &["outbox", "requeue", "--topic", ""]);
        assert_eq!(out.status.code(), Some(2), "{d:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--topic is empty"), "{err}");
        assert_eq!(
            status(rows_of(&pool, &plain).await),
            vec![(p1, "failed".into()), (p2, "failed".into())]
        );
        if d == Dialect::Sqlite {
            // The file is the test's own: every failed message is listed.
            assert_eq!(listed(""), vec![p1, p2, l1], "{d:?}");
        }
    }
}

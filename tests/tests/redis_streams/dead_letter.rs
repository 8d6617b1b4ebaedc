//! Poison entries between healthy ones, on SQLite: one without a
//! `msg_id` field, one whose payload is not JSON, one whose handler
//! always fails (retryable) and so gives up after `max_attempts` tries.
//! Each lands in the dead-letter stream with its fields, its reason and
//! where it came from; every entry is acknowledged and the healthy ones
//! act once: nothing dropped, nothing lost.

use crate::common::hooks;
use crate::common::redis_streams::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_entries_are_dead_lettered_with_their_reason() {
    let _one = hooks::shared().await;
    let Some(client) = shared_redis().await else {
        return;
    };
    let Some((pool, d)) = database("sqlite").await else {
        return;
    };
    let stream = unique("idem_rs_dead");
    let dead_stream = format!("{stream}:dlq");
    let group = "effects";
    let coupons = coupons(&pool, d, 20).await;
    let doomed = crate::common::redis_streams::coupons(&pool, d, 1).await[0];
    let publisher = Publisher::new(client.clone());
    let (one, two) = coupons.split_at(10);
    let job = |c| Use {
        coupon_id: c,
        ..Use::default()
    };
    publish(&publisher, &stream, one, 1, job).await;
    add_raw(&client, &stream, &[("payload", r#"{"coupon_id":1}"#)]).await;
    add_raw(
        &client,
        &stream,
        &[("msg_id", "bad-json"), ("payload", "{not json")],
    )
    .await;
    publish(&publisher, &stream, &[doomed], 1, |c| Use {
        coupon_id: c,
        fail_attempts: u32::MAX,
    })
    .await;
    publish(&publisher, &stream, two, 1, job).await;

    let running = consumer(&client, &stream, group, &pool, d, "solo")
        .max_attempts(3)
        .spawn()
        .await
        .expect("consumer");
    assert_eq!(running.dead_letter_stream(), dead_stream);
    wait_for("three dead letters", Duration::from_secs(60), || {
        let dead = counts(&running).4;
        async move { dead >= 3 }
    })
    .await;
    wait_for(
        "every coupon used and awarded",
        Duration::from_secs(60),
        || {
            let (pool, coupons) = (&pool, &coupons);
            async move { done(pool, d, coupons).await == coupons.len() }
        },
    )
    .await;
    wait_for("every entry acknowledged", Duration::from_secs(30), || {
        let (client, stream) = (&client, &stream);
        async move { pending(client, stream, group).await == 0 }
    })
    .await;
    let c = counts(&running);
    running.shutdown().await.expect("clean shutdown");
    let letters = entries(&client, &dead_stream).await;
    delete(&client, &[&stream, &dead_stream]).await;
    eprintln!(
        "redis streams dead letters: (received, executed, duplicates, retried, dead, settle_failed) = {c:?}; {letters:?}"
    );

    assert_once(&pool, d, &coupons).await;
    assert_eq!(
        effects(&pool, d, &[doomed]).await[0].2,
        0,
        "the failing handler's writes rolled back"
    );
    assert_letters(&letters, &stream, group, doomed);
    assert!(c.3 >= 2, "the failing handler tried again twice: {c:?}");
}

/// The three dead letters: each with the original fields and where it
/// came from, and the reason of each (found by its msg_id: they were
/// written as they happened, concurrently).
fn assert_letters(letters: &[Vec<(String, String)>], stream: &str, group: &str, doomed: i64) {
    assert_eq!(letters.len(), 3, "three dead letters: {letters:?}");
    for l in letters {
        assert_eq!(field(l, "stream"), Some(stream), "{l:?}");
        assert_eq!(field(l, "group"), Some(group), "{l:?}");
        assert!(
            field(l, "entry_id").is_some_and(|e| e.contains('-')),
            "{l:?}"
        );
        assert!(field(l, "payload").is_some(), "the original fields: {l:?}");
    }
    let by_id = |id: Option<&str>| {
        letters
            .iter()
            .find(|l| field(l, "msg_id") == id)
            .and_then(|l| field(l, DEAD_REASON_FIELD))
            .unwrap_or_default()
    };
    let unkeyed = by_id(None);
    assert!(unkeyed.contains("no `msg_id` field"), "{unkeyed}");
    let unparsable = by_id(Some("bad-json"));
    assert!(unparsable.contains("unparsable payload"), "{unparsable}");
    let doomed_id = format!("m-{doomed}");
    let gave_up = by_id(Some(&doomed_id));
    assert!(
        gave_up.contains("gave up after 3 attempts") && gave_up.contains("downstream unavailable"),
        "{gave_up}"
    );
}

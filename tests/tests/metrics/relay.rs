//! The relay's metrics on every backend, checked against the database:
//! one handler-duration sample per settled attempt and one attempts sample
//! per message done with, labelled by topic and outcome; the retry and
//! dead-letter counters by topic; the relay's counters through the facade,
//! equal to its `RelayStats`; topics past the label limit as `other`.

use crate::common::hooks;
use crate::common::relay::*;
use crate::recorder::recorded;
use idem_runtime::metrics::{DEFAULT_TOPIC_LABEL_LIMIT, OTHER_TOPIC, set_topic_label_limit};

const DURATION: &str = "idem_outbox_handler_duration_seconds";
const ATTEMPTS: &str = "idem_outbox_attempts";
const SUBSCRIBER: &str = "idem_subscriber_duration_seconds";
const LATENCY: &str = "idem_outbox_enqueue_to_settle_seconds";

/// The samples of `name` for `topic` and `outcome`.
fn samples(name: &str, topic: &str, outcome: &str) -> Vec<f64> {
    recorded().samples(name, &[("outcome", outcome), ("topic", topic)])
}

/// Waits (at most 10 s) until `done` holds: a message's row is written
/// before its attempt's metrics are.
async fn eventually(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The label-less relay counters, read now.
fn relay_counters() -> [u64; 5] {
    [
        "idem_relay_claims_total",
        "idem_relay_claimed_total",
        "idem_relay_executed_total",
        "idem_relay_duplicates_total",
        "idem_relay_batches_total",
    ]
    .map(|name| recorded().counter(name, &[]))
}

/// Sets the topic label limit back to its default when dropped.
struct LimitBack;

impl Drop for LimitBack {
    fn drop(&mut self) {
        set_topic_label_limit(DEFAULT_TOPIC_LABEL_LIMIT);
    }
}

macro_rules! metrics_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            // The shared fixtures serve every relay module; this one uses
            // only part of them.
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn settled_attempts_are_histograms_by_topic_and_outcome() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                recorded();
                let ok = topic("ok");
                for n in 0..6 {
                    // Every third coupon has its message twice: a duplicate.
                    produce(&pool, &ok, if n % 3 == 0 { 2 } else { 1 }).await;
                }
                let slow = topic("slow");
                produce(&pool, &slow, 1).await;
                let hopeless = topic("hopeless");
                produce(&pool, &hopeless, 1).await;
                produce(&pool, &hopeless, 1).await;
                let relay = Relay::new(pool.clone())
                    .route(ok.clone(), |d, m: Deduct| async move {
                        deduct(d.source(), &m).await
                    })
                    .route(slow.clone(), |d, m: Deduct| async move {
                        deduct_slow(d.source(), &m, Duration::from_millis(80)).await
                    })
                    .route(hopeless.clone(), |_d, _m: Deduct| async move {
                        Err::<Outcome<()>, _>(Error::retryable("still down"))
                    })
                    .backoff(Duration::from_millis(10), Duration::from_millis(20))
                    .max_attempts(2)
                    .spawn();
                for t in [&ok, &slow, &hopeless] {
                    drained(&pool, t).await;
                }
                eventually(|| {
                    samples(ATTEMPTS, &ok, "success").len()
                        + samples(ATTEMPTS, &ok, "duplicate").len()
                        == 8
                        && samples(ATTEMPTS, &hopeless, "dead").len() == 2
                        && samples(ATTEMPTS, &slow, "success").len() == 1
                })
                .await;
                relay.shutdown().await;

                // The delivered topic: one sample per message, each done
                // on its first attempt, as the rows say.
                assert_eq!(by_status(&pool, &ok, "success").await, 8);
                assert_eq!(attempts_of(&pool, &ok).await, vec![1; 8]);
                assert_eq!(samples(DURATION, &ok, "success").len(), 6);
                assert_eq!(samples(DURATION, &ok, "duplicate").len(), 2);
                assert_eq!(samples(ATTEMPTS, &ok, "success"), vec![1.0; 6]);
                assert_eq!(samples(ATTEMPTS, &ok, "duplicate"), vec![1.0; 2]);
                for s in samples(DURATION, &ok, "success") {
                    assert!(s.is_finite() && s >= 0.0, "{s}");
                }
                // The duration is the handler's: at least its 80 ms pause.
                let slow_runs = samples(DURATION, &slow, "success");
                assert_eq!(slow_runs.len(), 1);
                assert!(slow_runs[0] >= 0.08, "{slow_runs:?}");

                // The failing topic: a retry, then a dead letter, per message.
                assert_eq!(by_status(&pool, &hopeless, "failed").await, 2);
                assert_eq!(attempts_of(&pool, &hopeless).await, vec![2, 2]);
                assert_eq!(samples(DURATION, &hopeless, "retry").len(), 2);
                assert_eq!(samples(DURATION, &hopeless, "dead").len(), 2);
                assert_eq!(samples(ATTEMPTS, &hopeless, "dead"), vec![2.0, 2.0]);
                assert!(
                    samples(ATTEMPTS, &hopeless, "retry").is_empty(),
                    "only final settlements"
                );
                let of = [("topic", hopeless.as_str())];
                assert_eq!(recorded().counter("idem_outbox_retries_total", &of), 2);
                assert_eq!(recorded().counter("idem_outbox_dead_letters_total", &of), 2);

                // Enqueue to settlement: once per message done with.
                assert_eq!(samples(LATENCY, &ok, "success").len(), 6);
                assert_eq!(samples(LATENCY, &ok, "duplicate").len(), 2);
                assert_eq!(samples(LATENCY, &hopeless, "dead").len(), 2);
                assert!(samples(LATENCY, &hopeless, "retry").is_empty(), "only final settlements");
                // At least the slow handler's own run.
                let slow_latency = samples(LATENCY, &slow, "success");
                assert!(slow_latency.len() == 1 && slow_latency[0] >= 0.08, "{slow_latency:?}");
            }

            /// The latency counts from the enqueue, by the database's
            /// clock: a message delayed 400 ms settles at least 400 ms
            /// after its enqueue, however soon after its claim.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn enqueue_to_settle_counts_from_the_enqueue() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                recorded();
                let delayed = topic("delayed");
                let options = idem_runtime::outbox::EnqueueOptions::new().delay(Duration::from_millis(400));
                let mut tx = pool.begin().await.expect("begin");
                for n in 0..3 {
                    let msg = serde_json::json!({"coupon_id": ids(1), "order_id": n});
                    idem_runtime::outbox::enqueue_with(&mut tx, &delayed, &format!("d-{n}"), &msg, &options)
                        .await
                        .expect("enqueue");
                }
                tx.commit().await.expect("commit");
                let relay = Relay::new(pool.clone())
                    .route(delayed.clone(), |_d, _m: Deduct| async move { Ok(Outcome::Executed(())) })
                    .poll_interval(Duration::from_millis(20))
                    .spawn();
                drained(&pool, &delayed).await;
                eventually(|| samples(LATENCY, &delayed, "success").len() == 3).await;
                relay.shutdown().await;
                let latency = samples(LATENCY, &delayed, "success");
                assert_eq!(latency.len(), 3);
                for s in latency {
                    assert!((0.4..60.0).contains(&s), "{s} s from enqueue to settlement");
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fanned_out_subscribers_are_histograms_by_handler() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                recorded();
                let topic = topic("fanned");
                for _ in 0..3 {
                    produce(&pool, &topic, 1).await;
                }
                let (audit, deducting) = (format!("{topic}.audit"), format!("{topic}.deduct"));
                let relay = Relay::new(pool.clone())
                    .subscribe(topic.clone(), audit.clone(), |_d, _m: Deduct| async move {
                        tokio::time::sleep(Duration::from_millis(30)).await;
                        Ok::<_, Error>(Outcome::Executed(()))
                    })
                    .subscribe(
                        topic.clone(),
                        deducting.clone(),
                        |d, m: Deduct| async move { deduct(d.source(), &m).await },
                    )
                    .spawn();
                drained(&pool, &topic).await;
                eventually(|| samples(ATTEMPTS, &topic, "success").len() == 3).await;
                relay.shutdown().await;
                assert_eq!(by_status(&pool, &topic, "success").await, 3);
                let of = |handler: &str| {
                    recorded().samples(SUBSCRIBER, &[("handler", handler), ("outcome", "executed")])
                };
                let audits = of(&audit);
                assert_eq!(audits.len(), 3, "one sample per message and subscriber");
                assert!(audits.iter().all(|s| *s >= 0.03), "{audits:?}");
                assert_eq!(of(&deducting).len(), 3);
                // The attempt's duration spans both subscribers.
                let attempts = samples(DURATION, &topic, "success");
                assert_eq!(attempts.len(), 3);
                assert!(attempts.iter().all(|s| *s >= 0.03), "{attempts:?}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn relay_counters_are_exported_as_the_relay_counts_them() {
                // No other relay of this binary counts meanwhile.
                let _hooks = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                recorded();
                let topic = topic("counted");
                for _ in 0..10 {
                    produce(&pool, &topic, 1).await;
                }
                let before = relay_counters();
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), |d, m: Deduct| async move {
                        deduct(d.source(), &m).await
                    })
                    .commit_batch(4);
                // Rounds run here, not in a task: when the last one
                // returns, the relay counts nothing more.
                while by_status(&pool, &topic, "pending").await > 0 {
                    run_once_retrying(&relay, false).await;
                }
                let stats = relay.stats().snapshot();
                let after = relay_counters();
                let delta: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
                assert_eq!(by_status(&pool, &topic, "success").await, 10);
                assert_eq!(
                    delta,
                    [
                        stats.claims,
                        stats.claimed,
                        stats.executed,
                        stats.duplicates,
                        stats.batches
                    ],
                    "claims, claimed, executed, duplicates, batches: {stats:?}"
                );
                assert_eq!(stats.claimed, 10, "{stats:?}");
                assert!(stats.batches > 0, "delivered in batches: {stats:?}");
                // The batch path records its handlers' durations too.
                assert_eq!(samples(DURATION, &topic, "success").len(), 10);
                assert_eq!(samples(ATTEMPTS, &topic, "success"), vec![1.0; 10]);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn topics_past_the_label_limit_are_other() {
                // The limit is the process's: no other test runs meanwhile.
                let _hooks = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                recorded();
                let _back = LimitBack;
                let (first, later) = (topic("first"), topic("later"));
                let relay = |pool: &sqlx::Pool<Db>| {
                    Relay::new(pool.clone())
                        .route(first.clone(), |d, m: Deduct| async move {
                            deduct(d.source(), &m).await
                        })
                        .route(later.clone(), |d, m: Deduct| async move {
                            deduct(d.source(), &m).await
                        })
                };
                // `first` is labelled while the limit allows...
                set_topic_label_limit(usize::MAX);
                produce(&pool, &first, 1).await;
                run_once_retrying(&relay(&pool), true).await;
                // ...and keeps its label once the limit is reached; a new
                // topic past it is `other`.
                set_topic_label_limit(0);
                let others_before = samples(ATTEMPTS, OTHER_TOPIC, "success").len();
                produce(&pool, &first, 1).await;
                produce(&pool, &later, 1).await;
                let r = relay(&pool);
                while by_status(&pool, &first, "pending").await
                    + by_status(&pool, &later, "pending").await
                    > 0
                {
                    run_once_retrying(&r, false).await;
                }
                assert_eq!(samples(ATTEMPTS, &first, "success").len(), 2);
                assert!(
                    samples(ATTEMPTS, &later, "success").is_empty(),
                    "no series of its own"
                );
                let others = samples(ATTEMPTS, OTHER_TOPIC, "success").len();
                assert_eq!(others, others_before + 1, "`later` counted as other");
                assert!(
                    recorded()
                        .histogram_series(DURATION, "topic", &later)
                        .is_empty()
                );
            }
        }
    };
}

idem_testkit::for_each_backend!(metrics_tests);

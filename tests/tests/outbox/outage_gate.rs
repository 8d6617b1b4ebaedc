//! An outage holds back only its own topic, and only its topic's claims:
//! an attempt that failed in an outage closes the topic's gate for
//! `outage_retry`, so the relay stops claiming (and giving back) that
//! topic's backlog while another topic's messages keep flowing. Here the
//! gated topic's broker never comes back (`outage_retry` one hour, so no
//! gate opens during the test): its handler runs for the first claimed
//! messages only, none of its 200 messages is counted or dead-lettered,
//! and the other topic drains. The control turns the gate off and sees
//! the relay claim (and give back) every message of the gated topic.

use crate::common::hooks;
use crate::common::relay::*;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

const GATED: usize = 200;
const OPEN: usize = 40;

macro_rules! gate_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);

            /// How many times the gated topic's handler ran.
            async fn run() -> Option<usize> {
                let pool = pool().await?;
                let (down, up) = (topic("gate.down"), topic("gate.up"));
                for _ in 0..GATED {
                    produce(&pool, &down, 1).await;
                }
                let mut coupons = Vec::new();
                for _ in 0..OPEN {
                    coupons.push(produce(&pool, &up, 1).await);
                }
                let calls = Arc::new(AtomicUsize::new(0));
                let c = calls.clone();
                let relay = Relay::new(pool.clone())
                    .route(down.clone(), move |_d, _m: Deduct| {
                        c.fetch_add(1, Ordering::SeqCst);
                        async move {
                            Err::<Outcome<()>, _>(Error::broker_unavailable(
                                "test",
                                "the broker is down",
                            ))
                        }
                    })
                    .route(up.clone(), |d, m: Deduct| async move {
                        deduct(d.source(), &m).await
                    })
                    .concurrency(8)
                    .batch_size(8)
                    .poll_interval(Duration::from_millis(10))
                    .outage_retry(Duration::from_secs(3600))
                    .spawn();
                drained(&pool, &up).await;
                // Many claim rounds after the outage began.
                let claims = relay.stats().claims();
                let start = Instant::now();
                while relay.stats().claims() < claims + 30 {
                    assert!(
                        start.elapsed() < Duration::from_secs(60),
                        "the relay stopped claiming"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                relay.shutdown().await;
                for coupon in coupons {
                    assert_eq!(
                        deductions(&pool, coupon).await,
                        1,
                        "the open topic acts once"
                    );
                }
                assert_eq!(by_status(&pool, &down, "failed").await, 0, "dead letters");
                let counted: i64 = sqlx::query_scalar(sql(
                    D,
                    "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND attempts > 0",
                ))
                .bind(&down)
                .fetch_one(&pool)
                .await
                .expect("count");
                assert_eq!(counted, 0, "attempts counted in the outage");
                Some(calls.load(Ordering::SeqCst))
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_outage_holds_back_its_topic_s_claims_and_only_its_topic() {
                let _hooks = hooks::shared().await;
                let Some(calls) = run().await else { return };
                eprintln!(
                    "{}: {calls} of {GATED} messages of the topic in an outage claimed",
                    stringify!($module)
                );
                // The first claimed batches only (8 at a time, a batch ahead).
                assert!(calls <= 4 * 8, "{calls} attempts in the outage");
            }

            /// The control: without the gate every message of the topic is
            /// claimed and given back.
            #[cfg_attr(
                not(idem_broken),
                ignore = "a control: needs RUSTFLAGS=\"--cfg idem_broken\" (see .ci/run)"
            )]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn control_outage_ungated_claims_the_whole_backlog() {
                let _hooks = hooks::exclusive().await;
                idem_runtime::testing::set_broken_outage_ungated(true);
                let calls = run().await;
                idem_runtime::testing::set_broken_outage_ungated(false);
                let Some(calls) = calls else { return };
                eprintln!(
                    "control, {}: {calls} of {GATED} claimed",
                    stringify!($module)
                );
                assert!(calls >= GATED / 2, "only {calls} claimed without the gate");
            }
        }
    };
}

idem_testkit::for_each_backend!(gate_tests);

//! The relay under lost acknowledgements of its own commits, on every
//! backend against the real servers (PostgreSQL and MariaDB through the
//! fault proxy, which lets the server commit and then drops the reply;
//! SQLite through the `testing` hook, which now covers claims, renewals and
//! bookkeeping too): a claim whose acknowledgement is lost is read back and
//! delivered at once, so the drain never waits out a lease (60 s here) and
//! no attempt is burnt; a failed attempt is put back and counted even when
//! its bookkeeping's acknowledgement is lost. Counted in the database:
//! every coupon deducted exactly once, every message a success, attempts.
//!
//! The control turns claim recovery off and catches the messages of a lost
//! claim stuck under its lease.
//!
//! Its tests run one at a time, and beside no other test of the binary
//! that commits through idem (`common::hooks`): the `testing` hook is
//! process-wide, and would otherwise lose acknowledgements of the other
//! backends' tests too.

use crate::common::hooks;
use crate::common::relay::*;

use idem_testkit::proxy::FaultProxy;

/// The lease of every relay here: a drain that waited out one lease would
/// take at least this long.
const LEASE: Duration = Duration::from_secs(60);
/// A drain must end well before the lease could have expired.
const BEFORE_EXPIRY: Duration = Duration::from_secs(20);
/// The fraction of acknowledgements lost.
const LOSS: f64 = 0.3;
const MESSAGES: usize = 40;

/// Where a backend loses its acknowledgements: its own proxy, or the
/// process-wide hook (SQLite).
struct Faults {
    proxy: Option<FaultProxy>,
}

impl Faults {
    fn set(&self, rate: f64) {
        match &self.proxy {
            Some(p) => p.set_drop_fraction(rate),
            None => idem_runtime::testing::set_lost_ack_rate(rate),
        }
    }
}

impl Drop for Faults {
    fn drop(&mut self) {
        // A failed assertion must not leave the hook on for the next test.
        self.set(0.0);
    }
}

macro_rules! recovery_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr, $url:expr) => {
        mod $module {
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);
            use idem_runtime::testing::{Kind, lost_acks_on};

            /// The direct pool (setup, counting) and the relays' lossy one.
            async fn pools() -> Option<(Pool<Db>, Pool<Db>, Faults)> {
                let direct = pool().await?;
                let url: Option<String> = $url;
                match url {
                    Some(url) => {
                        let proxy = FaultProxy::for_url(&url, 0.0).await.expect("start proxy");
                        let lossy = sqlx::pool::PoolOptions::<Db>::new()
                            .max_connections(8)
                            .acquire_timeout(Duration::from_secs(30))
                            .connect(&proxy.url(&url))
                            .await
                            .expect("pool through the proxy");
                        Some((direct, lossy, Faults { proxy: Some(proxy) }))
                    }
                    None => Some((direct.clone(), direct, Faults { proxy: None })),
                }
            }

            async fn produce_all(pool: &Pool<Db>, topic: &str) -> Vec<i64> {
                let mut coupons = Vec::new();
                for _ in 0..MESSAGES {
                    coupons.push(produce(pool, topic, 1).await);
                }
                coupons
            }

            /// Waits until nothing of `topic` is pending; false if that
            /// took longer than `BEFORE_EXPIRY`.
            async fn drained_before_expiry(pool: &Pool<Db>, topic: &str) -> bool {
                let start = Instant::now();
                while by_status(pool, topic, "pending").await > 0 {
                    if start.elapsed() > BEFORE_EXPIRY {
                        return false;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                true
            }

            fn relay(lossy: &Pool<Db>, topic: &str, fail_first: bool) -> Relay<Db> {
                Relay::new(lossy.clone())
                    .route(topic.to_string(), move |d, m: Deduct| async move {
                        if fail_first && d.message().attempts == 1 {
                            return Err(Error::retryable("downstream busy"));
                        }
                        deduct(d.source(), &m).await
                    })
                    .lease(LEASE)
                    .concurrency(4)
                    .batch_size(8)
                    .poll_interval(Duration::from_millis(10))
                    // Longer than the bookkeeping's own retries: a failed
                    // attempt is never claimed again before its
                    // bookkeeping has been confirmed.
                    .backoff(Duration::from_millis(500), Duration::from_secs(1))
            }

            /// Starts `relay` with every acknowledgement lost until one of
            /// its claims has lost its own, then at the `LOSS` rate: the
            /// lost claim these tests are about is forced, not left to the
            /// odds of the few claims a drain takes (about one in six runs
            /// lost none at 30 %).
            async fn spawn_with_a_lost_claim(relay: &Relay<Db>, faults: &Faults) -> idem_runtime::outbox::RelayHandle {
                faults.set(1.0);
                let running = relay.clone().spawn();
                let start = Instant::now();
                while relay.stats().lost_claims() == 0 {
                    assert!(start.elapsed() < BEFORE_EXPIRY, "no claim lost its acknowledgement at a 100 % loss");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                faults.set(LOSS);
                running
            }

            /// Every coupon deducted once, every message a success.
            async fn exactly_once(pool: &Pool<Db>, topic: &str, coupons: &[i64]) {
                assert_eq!(by_status(pool, topic, "success").await, MESSAGES as i64);
                let (mut double, mut lost) = (0, 0);
                for c in coupons {
                    let n = deductions(pool, *c).await;
                    double += usize::from(n > 1);
                    lost += usize::from(n == 0);
                }
                assert_eq!((double, lost), (0, 0), "double and lost deductions");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn lost_claim_acks_are_read_back_without_waiting_the_lease() {
                let _one = hooks::exclusive().await;
                let Some((direct, lossy, faults)) = pools().await else { return };
                let topic = topic("lostclaim");
                let coupons = produce_all(&direct, &topic).await;
                let claims_lost_before = lost_acks_on(Kind::Claim);
                let relay = relay(&lossy, &topic, false);
                let running = spawn_with_a_lost_claim(&relay, &faults).await;
                let drained = drained_before_expiry(&direct, &topic).await;
                faults.set(0.0);
                running.shutdown().await;
                assert!(drained, "the drain waited for a lease ({LEASE:?}) to expire");
                exactly_once(&direct, &topic, &coupons).await;
                let attempts = attempts_of(&direct, &topic).await;
                assert!(
                    attempts.iter().all(|a| *a <= 2),
                    "no handler failed, yet attempts were burnt: {attempts:?}"
                );
                let s = relay.stats();
                let (lost, recovered) = (
                    s.lost_claims(),
                    s.recovered(),
                );
                assert!(lost > 0, "no claim lost its acknowledgement");
                assert!(recovered > 0, "{lost} lost claims, none recovered");
                assert_eq!(s.reclaimed(), 0, "no lease expired");
                assert_eq!(s.retried(), 0, "no handler failed");
                if D == Dialect::Sqlite {
                    assert!(lost_acks_on(Kind::Claim) > claims_lost_before, "the hook hit claims");
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn failed_attempts_are_put_back_and_counted_under_lost_acks() {
                let _one = hooks::exclusive().await;
                let Some((direct, lossy, faults)) = pools().await else { return };
                let topic = topic("lostsettle");
                let coupons = produce_all(&direct, &topic).await;
                let settles_lost_before = lost_acks_on(Kind::Settle);
                // Every first attempt fails: its bookkeeping (on SQLite
                // through the lossy hook too) puts it back for a retry.
                let relay = relay(&lossy, &topic, true);
                let running = spawn_with_a_lost_claim(&relay, &faults).await;
                let drained = drained_before_expiry(&direct, &topic).await;
                faults.set(0.0);
                running.shutdown().await;
                assert!(drained, "the drain waited for a lease ({LEASE:?}) to expire");
                exactly_once(&direct, &topic, &coupons).await;
                assert_eq!(
                    attempts_of(&direct, &topic).await,
                    vec![2; MESSAGES],
                    "the failed attempt and the retry, nothing more"
                );
                let s = relay.stats();
                // A put-back whose acknowledgement was lost is confirmed by
                // reading the row; when the retry's claim took the row in
                // between, the read-back cannot tell and counts it `stale`
                // (seen once in ten loaded runs). The attempts above are
                // the authority; the counters only have to add up.
                let (retried, stale) = (s.retried(), s.stale());
                assert!(
                    retried <= MESSAGES as u64 && retried + stale >= MESSAGES as u64,
                    "every failed attempt put back is counted: retried {retried}, stale {stale}"
                );
                assert!(s.lost_claims() > 0);
                if D == Dialect::Sqlite {
                    assert!(lost_acks_on(Kind::Settle) > settles_lost_before, "the hook hit the bookkeeping");
                }
            }

            /// The control: without claim recovery, the messages of a
            /// claim whose acknowledgement was lost sit under its lease
            /// with nobody running them, which the tests above catch.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn control_without_recovery_lost_claims_wait_their_lease() {
                let _one = hooks::exclusive().await;
                let Some((direct, lossy, faults)) = pools().await else { return };
                let topic = topic("norecovery");
                produce_all(&direct, &topic).await;
                let relay = relay(&lossy, &topic, false).claim_recovery(false);
                let running = spawn_with_a_lost_claim(&relay, &faults).await;
                // Until every message is either done or held by a claim
                // (none left to claim, none running).
                let start = Instant::now();
                loop {
                    let free: i64 = sqlx::query_scalar(sql(
                        D,
                        "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'pending' AND lease_owner IS NULL",
                    ))
                    .bind(&topic)
                    .fetch_one(&direct)
                    .await
                    .expect("count");
                    let s = relay.stats();
                    let ended = [s.executed(), s.duplicates(), s.retried(), s.stale(), s.dead_lettered()]
                        .iter()
                        .sum::<u64>();
                    if free == 0 && ended == s.claimed() {
                        break;
                    }
                    assert!(start.elapsed() < BEFORE_EXPIRY, "the control did not settle");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                faults.set(0.0);
                let stuck = by_status(&direct, &topic, "pending").await;
                let lost = relay.stats().lost_claims();
                running.shutdown().await;
                assert!(lost > 0, "no claim lost its acknowledgement");
                assert!(
                    stuck > 0,
                    "{lost} claims lost their acknowledgement, yet no message waits for its lease"
                );
            }
        }
    };
}

idem_testkit::for_each_backend!(recovery_tests;
    postgres => (Some(idem_testkit::postgres_url())),
    mariadb => (Some(idem_testkit::mysql_url())),
    sqlite => (None),
);

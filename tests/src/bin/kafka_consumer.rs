//! A Kafka consumer process for the rebalance test
//! (`tests/kafka/rebalance.rs`): one member of a consumer group running
//! the tests' two handlers (`tests/common/kafka.rs`) until it is killed.
//! Its offsets are committed only every 60 s (and on a revocation), so a
//! SIGKILL leaves every record it settled since its assignment
//! uncommitted: the partitions' next owner reads them again.
//!
//! Usage: kafka_consumer BROKERS GROUP TOPIC DATABASE_URL OWNER
//!
//! `IDEM_KAFKA_CONTROL=settle-first` (a `--cfg idem_broken` build): the
//! control's consumer, storing each offset before its handler and
//! committing every 100 ms.

#[path = "../../tests/common/kafka.rs"]
mod kafka;

use kafka::*;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, brokers, group, topic, url, owner] = &args[..] else {
        eprintln!("usage: kafka_consumer BROKERS GROUP TOPIC DATABASE_URL OWNER");
        std::process::exit(2);
    };
    let pool = idem_testkit::any(url, 8).await.expect("the database");
    let d = <Any as Backend>::pool_dialect(&pool);
    let control = std::env::var("IDEM_KAFKA_CONTROL").is_ok_and(|c| c == "settle-first");
    #[cfg(idem_broken)]
    idem_runtime::testing::set_broken_settle_first(control);
    #[cfg(not(idem_broken))]
    assert!(!control, "the control needs a --cfg idem_broken build");
    let every = if control {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(60)
    };
    let running = consumer(brokers, group, topic, &pool, d, owner)
        .commit_interval(every)
        .spawn()
        .await
        .expect("consumer");
    // Until killed.
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        let _ = counts(&running);
    }
}

//! A RocketMQ consumer process for the incident test
//! (`tests/rocketmq/incident.rs`): one member of a consumer group running
//! the tests' two handlers (`tests/common/rocketmq.rs`) until it is
//! killed. Its offsets are committed only every hour, so a SIGKILL leaves
//! every message it settled uncommitted: the queues' next owner reads
//! them again.
//!
//! Usage: rocketmq_consumer NAMESRV GROUP TOPIC DATABASE_URL OWNER
//!
//! `IDEM_ROCKETMQ_CONTROL=settle-first` (a `--cfg idem_broken` build): the
//! control's consumer, committing each offset as the message arrives,
//! before its handler, every 100 ms.

#[path = "../../tests/common/rocketmq.rs"]
mod rocketmq;

use rocketmq::*;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, namesrv, group, topic, url, owner] = &args[..] else {
        eprintln!("usage: rocketmq_consumer NAMESRV GROUP TOPIC DATABASE_URL OWNER");
        std::process::exit(2);
    };
    let pool = idem_testkit::any(url, 8).await.expect("the database");
    let d = <Any as Backend>::pool_dialect(&pool);
    let control = std::env::var("IDEM_ROCKETMQ_CONTROL").is_ok_and(|c| c == "settle-first");
    #[cfg(idem_broken)]
    idem_runtime::testing::set_broken_settle_first(control);
    #[cfg(not(idem_broken))]
    assert!(!control, "the control needs a --cfg idem_broken build");
    let every = if control {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(3600)
    };
    let running = consumer(namesrv, group, topic, &pool, d, owner)
        .commit_interval(every)
        .max_in_flight(2)
        .spawn()
        .await
        .expect("consumer");
    // Until killed.
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        let _ = counts(&running);
    }
}

//! A Redis Streams consumer process for the kill test
//! (`tests/redis_streams/killed.rs`): one consumer of a group running the
//! tests' two handlers (`tests/common/redis_streams.rs`), eight entries in
//! flight, until it is killed. The first HOLD entries are acknowledged;
//! every later one blocks after its commit, holding its entry pending
//! (committed, unacknowledged) until the kill.
//!
//! Usage: redis_streams_consumer REDIS_URL STREAM GROUP DATABASE_URL OWNER HOLD `[plain]`
//!
//! `plain`: the control's handler, without idem.

#[path = "../../tests/common/redis_streams.rs"]
mod common_rs;

use common_rs::*;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (url, stream, group, db, owner, hold) = match &args[..] {
        [_, url, stream, group, db, owner, hold, ..] => (url, stream, group, db, owner, hold),
        _ => {
            eprintln!(
                "usage: redis_streams_consumer REDIS_URL STREAM GROUP DATABASE_URL OWNER HOLD [plain]"
            );
            std::process::exit(2);
        }
    };
    let plain = args.get(7).is_some_and(|p| p == "plain");
    let hold = Hold::new(hold.parse().expect("HOLD: a number"));
    let pool = idem_testkit::any(db, 8).await.expect("the database");
    let d = <Any as Backend>::pool_dialect(&pool);
    let client = redis_streams::client(url).expect("redis url");
    let running =
        kill_scenario_consumer(&client, stream, group, &pool, d, owner, plain, Some(hold))
            .spawn()
            .await
            .expect("consumer");
    // Until killed.
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        let _ = counts(&running);
    }
}

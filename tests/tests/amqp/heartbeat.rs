//! A consumer among the processes alive: a RabbitMQ consumer given a
//! heartbeat (`ConsumerHandle::heartbeat`) has its `idem_process` row
//! (kind `consumer`) while it runs, refreshed, and the row goes when the
//! consumer is shut down, as the console's and `idem processes`' list show.

use crate::common::amqp::*;
use crate::common::hooks;
use idem_runtime::process::Heartbeat;

async fn beat_of(pool: &PgPool, id: &str) -> Option<(String, String, String)> {
    sqlx::query_as(
        "SELECT kind, name, to_char(heartbeat_at, 'YYYY-MM-DD HH24:MI:SS.US') \
         FROM idem_process WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
    .expect("process row")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumers_heartbeat_row_lives_while_it_runs() {
    let _hooks = hooks::shared().await;
    let Some((pool, conn)) = servers().await else {
        return;
    };
    let (t, _, _) = topology(&conn, "heartbeat").await;
    let id = unique("consumer");
    let consumer = Consumer::new(conn.clone(), &t.queue, deducting(&pool))
        .spawn()
        .await
        .expect("consumer")
        .heartbeat(
            Heartbeat::builder(id.clone(), "consumer", format!("queue {}", t.queue))
                .interval(Duration::from_millis(20))
                .start(pool.clone()),
        );
    // Written at once, then refreshed.
    let start = std::time::Instant::now();
    let first = loop {
        if let Some(row) = beat_of(&pool, &id).await {
            break row;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no row");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    while beat_of(&pool, &id).await.map(|r| r.2) == Some(first.2.clone()) {
        assert!(start.elapsed() < Duration::from_secs(10), "never refreshed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (kind, name, _) = first;
    assert_eq!(
        (kind.as_str(), name),
        ("consumer", format!("queue {}", t.queue))
    );
    consumer.shutdown().await.expect("clean shutdown");
    assert_eq!(
        beat_of(&pool, &id).await,
        None,
        "the row goes with the consumer"
    );
}

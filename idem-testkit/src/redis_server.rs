//! The local Redis, for the cache tests (feature `redis`).

use crate::servers::unreachable;
use std::time::Duration;

/// Redis URL: `IDEM_TEST_REDIS_URL`, default (also when set but empty) the
/// local server.
pub fn redis_url() -> String {
    crate::env_setting("IDEM_TEST_REDIS_URL").unwrap_or_else(|| "redis://127.0.0.1:6379/".into())
}

/// Whether the local Redis answers `PING` within 2 s (else the test is
/// skipped, or fails in CI).
pub async fn redis_up() -> bool {
    let probe = async {
        let client = redis::Client::open(redis_url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await
    };
    match tokio::time::timeout(Duration::from_secs(2), probe).await {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            unreachable(&format!("Redis at {}", redis_url()), e);
            false
        }
        Err(_) => {
            unreachable(&format!("Redis at {}", redis_url()), "timed out");
            false
        }
    }
}

/// The value of a Redis key, read directly.
///
/// # Panics
///
/// When Redis cannot be reached or the `GET` fails.
pub async fn redis_get(key: &str) -> Option<String> {
    let client = redis::Client::open(redis_url()).expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .expect("GET")
}

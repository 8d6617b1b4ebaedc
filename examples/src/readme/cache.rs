//! README, "Redis front cache": a call with the cache in front of the
//! database.

use super::state_machine::{DeductCoupon, deduct_coupon_for_order};
use idem_runtime::Outcome;
use idem_runtime::cache::RedisCache;
use sqlx::PgPool;
use std::time::Duration;

/// Deducts `msg`'s coupon with a fresh cache in front; returns the cache
/// (its counters) and what the call answered.
pub async fn deduct_cached(
    pool: PgPool,
    msg: DeductCoupon,
) -> Result<(RedisCache, Outcome<()>), idem_runtime::Error> {
    // README: cache
    use idem_runtime::{cache::RedisCache, Source};

    let cache = RedisCache::new("redis://127.0.0.1:6379/")?   // or RedisCache::cluster(&[...])
        .ttl(Duration::from_secs(24 * 3600))                  // longest marker lifetime
        .timeout(Duration::from_millis(50));                  // bound on every Redis call
    cache.ready(Duration::from_secs(5)).await;                // optional: connect before the first calls
    let outcome = deduct_coupon_for_order(Source::from(&pool).cache(&cache), &msg).await?; // a marker: Duplicate
    // README: end
    Ok((cache, outcome))
}

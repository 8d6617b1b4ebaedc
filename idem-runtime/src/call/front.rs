//! The front cache's hook on a call (feature `redis`): asked once before
//! BEGIN, told once after the commit, never in between, and never the
//! source of truth. The call holds a [`MarkerHook`] and a source a
//! [`FrontCache`] whatever the features; without `redis` both are empty
//! and every method does nothing, so that the call's own code carries no
//! feature gate for the cache.

#[cfg(feature = "redis")]
use crate::cache::{Marker, RedisCache};
use std::time::Instant;

/// The cache marker of a call without a stored result.
#[cfg(feature = "redis")]
const PLAIN_MARKER: &str = "1";

/// The front cache a [`Source`](crate::Source) puts before the database,
/// if any.
#[derive(Debug, Clone, Default)]
pub(crate) struct FrontCache {
    #[cfg(feature = "redis")]
    cache: Option<RedisCache>,
}

impl FrontCache {
    /// `cache` in front of the database.
    #[cfg(feature = "redis")]
    pub(crate) fn of(cache: &RedisCache) -> Self {
        FrontCache {
            cache: Some(cache.clone()),
        }
    }

    /// The marker the cache holds for `key` of `scope`, if it answers in
    /// time. Asked before BEGIN; never when an outbox message drives the
    /// call (its status must be updated whatever the cache says).
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(crate) async fn lookup(&self, scope: &str, key: &str) -> Option<String> {
        #[cfg(feature = "redis")]
        if let Some(cache) = &self.cache {
            return cache.get(scope, key).await;
        }
        None
    }
}

/// The markers of a relay batch's calls, kept until the batch commits
/// (a marker of a call the batch then rolls back would skip its action
/// forever).
#[derive(Debug, Clone, Default)]
pub(crate) struct BatchMarkers {
    #[cfg(feature = "redis")]
    list: std::sync::Arc<std::sync::Mutex<Vec<Deferred>>>,
}

/// One call's marker in a relay batch. Its bound (`marker.not_after`, the
/// record's expiry) is an instant: the time the batch takes to commit
/// counts against it.
#[cfg(feature = "redis")]
#[derive(Debug)]
struct Deferred {
    cache: RedisCache,
    scope: &'static str,
    key: String,
    marker: Marker,
}

impl BatchMarkers {
    /// Writes the markers, after the batch's commit.
    pub(crate) async fn write(&self) {
        #[cfg(feature = "redis")]
        {
            let markers = match self.list.lock() {
                Ok(mut list) => std::mem::take(&mut *list),
                Err(_) => return,
            };
            for m in markers {
                m.cache.put(m.scope, &m.key, &m.marker).await;
            }
        }
    }
}

/// The cache's part in one call: the marker it will write after the
/// commit, and how long that marker may live.
#[derive(Debug, Default)]
pub(crate) struct MarkerHook {
    #[cfg(feature = "redis")]
    cache: Option<RedisCache>,
    #[cfg(feature = "redis")]
    scope: &'static str,
    /// In a relay batch: where the marker goes instead.
    #[cfg(feature = "redis")]
    batch: Option<BatchMarkers>,
    /// When the marker must be gone by: its record's expiry (see
    /// [`MarkerHook::bound`]); `None`: the cache's TTL.
    #[cfg(feature = "redis")]
    not_after: Option<Instant>,
}

impl MarkerHook {
    /// The hook of a call of `scope` on a source with `front`; `batch`: the
    /// call runs in a relay batch, which writes its markers after its own
    /// commit.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(crate) fn new(front: FrontCache, scope: &'static str, batch: Option<BatchMarkers>) -> Self {
        MarkerHook {
            #[cfg(feature = "redis")]
            cache: front.cache,
            #[cfg(feature = "redis")]
            scope,
            #[cfg(feature = "redis")]
            batch,
            #[cfg(feature = "redis")]
            not_after: None,
        }
    }

    /// Whether the call writes a marker after its commit: it has a cache,
    /// and runs in its own transaction (`nested` false) or in a relay
    /// batch. A call inside a caller's transaction writes none: its commit
    /// is not the call's to see.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(crate) fn writes(&self, nested: bool) -> bool {
        #[cfg(feature = "redis")]
        {
            self.cache.is_some() && (!nested || self.batch.is_some())
        }
        #[cfg(not(feature = "redis"))]
        false
    }

    /// Bounds the marker by its record's expiry: `left_ms` is what was left
    /// of the record's ttl by the database's clock at a statement sent at
    /// `asked` (`None`: no record seen, so no marker). The database read
    /// its clock after `asked`, so the bound is never past the record's
    /// expiry.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(crate) fn bound(&mut self, asked: Instant, left_ms: Option<i64>) {
        #[cfg(feature = "redis")]
        {
            let left =
                std::time::Duration::from_millis(left_ms.map_or(0, |ms| ms.max(0).unsigned_abs()));
            self.not_after = Some(asked + left);
        }
    }

    /// The call committed: writes its marker (`marker`, or the plain one),
    /// or leaves it to the relay batch the call ran in. True if it wrote
    /// one now.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(crate) async fn committed(self, key: String, marker: Option<String>, nested: bool) -> bool {
        #[cfg(feature = "redis")]
        if let Some(cache) = self.cache {
            let marker = Marker {
                value: marker.unwrap_or_else(|| PLAIN_MARKER.to_owned()),
                not_after: self.not_after,
            };
            if !nested {
                cache.put(self.scope, &key, &marker).await;
                return true;
            }
            if let Some(batch) = self.batch
                && let Ok(mut list) = batch.list.lock()
            {
                list.push(Deferred {
                    cache,
                    scope: self.scope,
                    key,
                    marker,
                });
            }
        }
        false
    }
}

//! The front cache's hook on a call (see [`crate::front`]): asked once
//! before BEGIN, told once after the commit, never in between, and never
//! the source of truth. Without a cache every method does nothing.

use crate::front::{Marker, Shared};
use std::time::Instant;

/// The cache marker of a call without a stored result.
const PLAIN_MARKER: &str = "1";

/// The front cache a [`Source`](crate::Source) puts before the database,
/// if any.
#[derive(Debug, Clone, Default)]
pub(crate) struct FrontCache {
    cache: Option<Shared>,
}

impl FrontCache {
    /// `cache` in front of the database.
    pub(crate) fn of(cache: Shared) -> Self {
        FrontCache { cache: Some(cache) }
    }

    /// The marker the cache holds for `key` of `scope`, if it answers in
    /// time. Asked before BEGIN; never when an outbox message drives the
    /// call (its status must be updated whatever the cache says).
    pub(crate) async fn lookup(&self, scope: &str, key: &str) -> Option<String> {
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
    list: std::sync::Arc<std::sync::Mutex<Vec<Deferred>>>,
}

/// One call's marker in a relay batch. Its bound (`marker.not_after`, the
/// record's expiry) is an instant: the time the batch takes to commit
/// counts against it.
#[derive(Debug)]
struct Deferred {
    cache: Shared,
    scope: &'static str,
    key: String,
    marker: Marker,
}

impl BatchMarkers {
    /// Writes the markers, after the batch's commit.
    pub(crate) async fn write(&self) {
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
    cache: Option<Shared>,
    scope: &'static str,
    /// In a relay batch: where the marker goes instead.
    batch: Option<BatchMarkers>,
    /// When the marker must be gone by: its record's expiry (see
    /// [`MarkerHook::bound`]); `None`: the cache's TTL.
    not_after: Option<Instant>,
}

impl MarkerHook {
    /// The hook of a call of `scope` on a source with `front`; `batch`: the
    /// call runs in a relay batch, which writes its markers after its own
    /// commit.
    pub(crate) fn new(front: FrontCache, scope: &'static str, batch: Option<BatchMarkers>) -> Self {
        MarkerHook {
            cache: front.cache,
            scope,
            batch,
            not_after: None,
        }
    }

    /// Whether the call writes a marker after its commit: it has a cache,
    /// and runs in its own transaction (`nested` false) or in a relay
    /// batch. A call inside a caller's transaction writes none: its commit
    /// is not the call's to see.
    pub(crate) fn writes(&self, nested: bool) -> bool {
        self.cache.is_some() && (!nested || self.batch.is_some())
    }

    /// Bounds the marker by its record's expiry: `left_ms` is what was left
    /// of the record's ttl by the database's clock at a statement sent at
    /// `asked` (`None`: no record seen, so no marker). The database read
    /// its clock after `asked`, so the bound is never past the record's
    /// expiry.
    pub(crate) fn bound(&mut self, asked: Instant, left_ms: Option<i64>) {
        let left =
            std::time::Duration::from_millis(left_ms.map_or(0, |ms| ms.max(0).unsigned_abs()));
        self.not_after = Some(asked + left);
    }

    /// The call committed: writes its marker (`marker`, or the plain one),
    /// or leaves it to the relay batch the call ran in. True if it wrote
    /// one now.
    pub(crate) async fn committed(self, key: String, marker: Option<String>, nested: bool) -> bool {
        if let Some(cache) = self.cache {
            let marker = Marker::new(
                marker.unwrap_or_else(|| PLAIN_MARKER.to_owned()),
                self.not_after,
            );
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

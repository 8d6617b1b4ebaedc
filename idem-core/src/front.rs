//! The seam of a front cache: a fast store asked before a call opens its
//! transaction, told after it commits, and never the source of truth.
//!
//! A call asks [`FrontCache::get`] once before `BEGIN` (never when an
//! outbox message drives it: its status must be updated whatever the cache
//! says) and, after its commit, writes a [`Marker`] with
//! [`FrontCache::put`]. A marker found skips the call as a duplicate; no
//! marker, an error or a time-out falls through to the database, which
//! decides. A marker is bounded by its record's expiry
//! ([`Marker::ttl`]), so a cache never answers `Duplicate` for a record
//! the database has let go.
//!
//! The Redis implementation is `idem_runtime::cache::RedisCache` (feature
//! `redis`, crate `idem-redis`). Another store is a type implementing
//! [`FrontCache`], put in front of a call with
//! [`Source::cache`](crate::Source::cache):
//!
//! ```
//! use idem_runtime::front::{FrontCache, Marker, CacheFuture};
//! use std::collections::HashMap;
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//!
//! /// A front cache in this process's memory (one process only).
//! #[derive(Debug, Clone, Default)]
//! struct InMemory(Arc<Mutex<HashMap<String, String>>>);
//!
//! impl FrontCache for InMemory {
//!     fn get<'a>(&'a self, scope: &'a str, key: &'a str) -> CacheFuture<'a, Option<String>> {
//!         let found = self.0.lock().unwrap().get(&format!("{scope}:{key}")).cloned();
//!         Box::pin(async move { found })
//!     }
//!     fn put<'a>(&'a self, scope: &'a str, key: &'a str, marker: &'a Marker) -> CacheFuture<'a, ()> {
//!         // A marker whose record expires within the write's time is not written.
//!         if marker.ttl(Duration::from_secs(3600), Duration::ZERO).is_some() {
//!             self.0.lock().unwrap().insert(format!("{scope}:{key}"), marker.value().to_owned());
//!         }
//!         Box::pin(async {})
//!     }
//! }
//! # let _ = InMemory::default();
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A boxed future of a cache operation, borrowing the cache and its
/// arguments.
pub type CacheFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A store put in front of the database for a call's duplicate check (see
/// the [module documentation](self)).
///
/// Neither method reports an error: a cache that fails, or does not answer
/// in time, answers `None` (the call falls through to the database) and
/// writes nothing; counting and logging its failures is the
/// implementation's.
pub trait FrontCache: fmt::Debug + Send + Sync + 'static {
    /// The marker stored for `key` in `scope` (the handler's
    /// deduplication scope), if the store answers in time and holds one.
    fn get<'a>(&'a self, scope: &'a str, key: &'a str) -> CacheFuture<'a, Option<String>>;

    /// Stores `marker` for `key` in `scope`, for at most
    /// [`marker.ttl(..)`](Marker::ttl): never past its record's expiry.
    fn put<'a>(&'a self, scope: &'a str, key: &'a str, marker: &'a Marker) -> CacheFuture<'a, ()>;
}

/// What a committed call leaves in the front cache: its value, and the
/// instant it must be gone by (its record's expiry), if it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    value: String,
    not_after: Option<Instant>,
}

impl Marker {
    /// A marker of `value` that must be gone by `not_after` (`None`: no
    /// record bounds it; the cache's own TTL does).
    pub fn new(value: impl Into<String>, not_after: Option<Instant>) -> Self {
        Marker {
            value: value.into(),
            not_after,
        }
    }

    /// The value to store: the payload fingerprint and the stored result
    /// for the record strategy, `1` otherwise.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The record's expiry, measured on this machine's clock from below.
    pub fn not_after(&self) -> Option<Instant> {
        self.not_after
    }

    /// How long to keep this marker when written now under a cache TTL of
    /// `ttl` by a write the store applies within `flight` (its timeout: a
    /// write answered in time was applied in time): what is left of the
    /// record, less `flight`, so that the marker never outlives the record
    /// by the write's own time on the way. `None` when the record has
    /// expired or expires within `flight`: write no marker at all.
    pub fn ttl(&self, ttl: Duration, flight: Duration) -> Option<Duration> {
        let ttl = match self.not_after {
            Some(end) => ttl.min(
                end.saturating_duration_since(Instant::now())
                    .saturating_sub(flight),
            ),
            None => ttl,
        };
        // Stores count whole milliseconds (Redis PSETEX refuses 0).
        (ttl >= Duration::from_millis(1)).then_some(ttl)
    }
}

/// A front cache as a call holds it.
pub(crate) type Shared = Arc<dyn FrontCache>;

#[cfg(test)]
mod tests {
    use super::Marker;
    use std::time::{Duration, Instant};

    fn marker(not_after: Option<Instant>) -> Marker {
        Marker::new("1", not_after)
    }

    #[test]
    fn a_marker_lives_the_least_of_the_cache_ttl_and_its_record() {
        let hour = Duration::from_secs(3600);
        let zero = Duration::ZERO;
        assert_eq!(marker(None).ttl(hour, zero), Some(hour));
        let soon = marker(Some(Instant::now() + Duration::from_secs(2)));
        let ttl = soon.ttl(hour, zero).expect("a live record");
        assert!(ttl <= Duration::from_secs(2) && ttl > Duration::from_secs(1));
        let later = marker(Some(Instant::now() + 2 * hour));
        assert_eq!(later.ttl(hour, zero), Some(hour));
        // An expired record, or one expiring within the millisecond: none.
        assert_eq!(marker(Some(Instant::now())).ttl(hour, zero), None);
        if let Some(past) = Instant::now().checked_sub(Duration::from_secs(1)) {
            assert_eq!(marker(Some(past)).ttl(hour, zero), None);
        }
    }

    #[test]
    fn a_marker_ends_its_write_s_time_on_the_way_before_its_record() {
        let hour = Duration::from_secs(3600);
        let flight = Duration::from_millis(500);
        let soon = marker(Some(Instant::now() + Duration::from_secs(2)));
        let ttl = soon.ttl(hour, flight).expect("a live record");
        assert!(ttl <= Duration::from_millis(1500), "{ttl:?}");
        // Expiring within the write's flight: no marker.
        let now = marker(Some(Instant::now() + Duration::from_millis(400)));
        assert_eq!(now.ttl(hour, flight), None);
        // No record: the cache's TTL.
        assert_eq!(marker(None).ttl(hour, flight), Some(hour));
    }
}

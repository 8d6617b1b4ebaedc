//! The push wake-up: on PostgreSQL a relay listens on
//! [`NOTIFY_CHANNEL`](crate::outbox::NOTIFY_CHANNEL), which
//! [`enqueue`](crate::outbox::enqueue) notifies on commit, and a
//! notification for one of its topics wakes its run loop at once instead
//! of at the end of its poll interval.
//!
//! The listener runs on a task of its own, on a connection of its own (a
//! pool of one, opened with the relay pool's connect options and the
//! application name `idem-listener:<relay owner>`): `LISTEN` is session state, so it
//! holds that connection for the relay's lifetime and never borrows one
//! of the relay's pool. Polling stays the fallback: a notification is
//! only a hint, the claim finds the messages. A lost listener connection
//! is reconnected with back-off (logged), and each (re)connection wakes
//! the relay once, for the messages enqueued while nobody listened.
//! Wake-ups go through a [`Notify`], whose single stored permit keeps a
//! notification that arrives while the relay is busy (it claims once more
//! when it next runs out of work) without letting a burst of them spin
//! it.

use super::handle::StatsView;
use crate::backend::Backend;
use sqlx::Pool;
use std::sync::Arc;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// The start of the `application_name` of a relay's listener connection:
/// `idem-listener:` and the relay's [owner](super::Relay::owner) (at most
/// 61 bytes, within PostgreSQL's 63), so `pg_stat_activity` tells each
/// relay's listener apart.
pub const LISTENER_APP: &str = "idem-listener";

/// How a relay listens: its owner (in the application name), and whether
/// it wakes up once after each (re)connection of its listener, for the
/// messages enqueued while nobody listened.
#[derive(Debug, Clone, Copy)]
// Read by the PostgreSQL listener only.
#[cfg_attr(not(any(feature = "postgres", feature = "any")), allow(dead_code))]
pub(super) struct Listen<'a> {
    pub(super) owner: &'a str,
    pub(super) catch_up: bool,
}

/// Spawns the listener of a relay on `pool` for `topics`, if the pool is
/// a PostgreSQL one (native, or `sqlx::Any` on a `postgres://` URL);
/// `None` elsewhere (the relay only polls). The task ends when `stop`
/// turns `true` or its sender is dropped.
pub(super) fn spawn_listener<DB: Backend>(
    pool: &Pool<DB>,
    how: Listen<'_>,
    topics: &[String],
    wake: Arc<Notify>,
    stop: watch::Receiver<bool>,
    stats: Arc<dyn StatsView>,
) -> Option<JoinHandle<()>> {
    #[cfg(feature = "postgres")]
    {
        let options = pg_options(pool)?.application_name(&format!("{LISTENER_APP}:{}", how.owner));
        let topics = topics.to_vec();
        let catch_up = how.catch_up;
        // The enqueues of this process notify through it, after their
        // commit (see `outbox::notifier`); unregistered when the listener
        // task ends.
        let notifier = crate::outbox::notifier::start(options.clone(), how.owner, &topics);
        Some(tokio::spawn(async move {
            let _notifier = notifier;
            pg::listen(options, catch_up, topics, wake, stop, stats).await
        }))
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = (pool, how, topics, wake, stop, stats);
        None
    }
}

/// The connect options of a PostgreSQL `pool`, if it is one.
#[cfg(feature = "postgres")]
fn pg_options<DB: Backend>(pool: &Pool<DB>) -> Option<sqlx::postgres::PgConnectOptions> {
    let any: &dyn std::any::Any = pool;
    if let Some(pg) = any.downcast_ref::<Pool<sqlx::Postgres>>() {
        return Some((*pg.connect_options()).clone());
    }
    #[cfg(feature = "any")]
    if let Some(anypool) = any.downcast_ref::<Pool<sqlx::Any>>() {
        let url = &anypool.connect_options().database_url;
        if matches!(url.scheme(), "postgres" | "postgresql") {
            use sqlx::ConnectOptions;
            return sqlx::postgres::PgConnectOptions::from_url(url).ok();
        }
    }
    None
}

#[cfg(feature = "postgres")]
mod pg {
    use super::StatsView;
    use crate::backoff::Backoff;
    use crate::outbox::NOTIFY_CHANNEL;
    use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    use tokio::sync::{Notify, watch};

    /// The waits between reconnection attempts: from 100 ms doubling to
    /// 5 s.
    const RECONNECT: Backoff = Backoff {
        base: Duration::from_millis(100),
        max: Duration::from_secs(5),
    };

    pub(super) async fn listen(
        options: PgConnectOptions,
        catch_up: bool,
        topics: Vec<String>,
        wake: Arc<Notify>,
        mut stop: watch::Receiver<bool>,
        stats: Arc<dyn StatsView>,
    ) {
        let topics: HashSet<String> = topics.into_iter().collect();
        // A pool of one: PgListener reconnects through it. No lifetime or
        // idle limits: the connection is held, waiting.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(options);
        let mut failures = 0u32;
        while !*stop.borrow() {
            let mut connected = false;
            let error = tokio::select! {
                e = session(&pool, catch_up, &topics, &wake, &stats, &mut connected) => e,
                _ = stop.changed() => break,
            };
            if connected {
                failures = 0;
            }
            failures += 1;
            stats
                .stats()
                .listener_failures
                .fetch_add(1, Ordering::Relaxed);
            let wait = RECONNECT.delay(failures);
            tracing::warn!(%error, retry_in = ?wait, "outbox relay's listener lost its connection or could not listen; polling meanwhile");
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => break,
            }
        }
        pool.close().await;
    }

    /// One listening session: connects, listens, and wakes the relay on
    /// each notification for its topics until an error, which it returns.
    async fn session(
        pool: &sqlx::PgPool,
        catch_up: bool,
        topics: &HashSet<String>,
        wake: &Notify,
        stats: &Arc<dyn StatsView>,
        connected: &mut bool,
    ) -> sqlx::Error {
        let mut listener = match PgListener::connect_with(pool).await {
            Ok(l) => l,
            Err(e) => return e,
        };
        if let Err(e) = listener.listen(NOTIFY_CHANNEL).await {
            return e;
        }
        *connected = true;
        tracing::debug!(
            channel = NOTIFY_CHANNEL,
            "outbox relay listening for enqueued messages"
        );
        // What was enqueued while nobody listened.
        if catch_up {
            wake.notify_one();
        }
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) => {
                    if topics.contains(n.payload()) {
                        stats.stats().push_wakeups.fetch_add(1, Ordering::Relaxed);
                        wake.notify_one();
                    }
                }
                // The connection was lost and is back (PgListener
                // reconnects and listens again before it answers `None`):
                // notifications in between are lost, so claim once.
                Ok(None) => {
                    stats
                        .stats()
                        .listener_failures
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        "outbox relay's listener reconnected; claiming once for what it missed"
                    );
                    if catch_up {
                        wake.notify_one();
                    }
                }
                Err(e) => return e,
            }
        }
    }
}

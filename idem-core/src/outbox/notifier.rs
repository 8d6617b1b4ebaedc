//! Push wake-ups sent after the producer's commit, coalesced, from a
//! connection of their own.
//!
//! A PostgreSQL transaction that issued `NOTIFY` takes a database-wide lock
//! at commit (so that the notification queue holds entries in commit
//! order), so producers whose enqueue notifies commit one at a time. A
//! relay with [push wake-up](super::Relay::push_wakeup) therefore starts a
//! *notifier* for its topics: while one is registered in the process,
//! [`enqueue`](super::enqueue) of such a topic inserts without `NOTIFY` and
//! hands the new message's id to the notifier instead. The notifier's task
//! waits for the ids to become visible (their transaction committed), then
//! notifies [`NOTIFY_CHANNEL`](super::NOTIFY_CHANNEL) for their topics in
//! one statement of its own, and keeps the ids that are not visible yet for
//! its next rounds (2 ms, doubling to 64 ms, for at most
//! [`GIVE_UP`]): a rolled-back enqueue never becomes visible and notifies
//! nobody. Every id handed over while a round runs waits for the next one,
//! so one notifying statement at a time covers any number of producers.
//! A round that notified a dense stream (4 messages or more) is followed by
//! the next one no sooner than 16 ms later ([`MIN_GAP`]): under a heavy
//! stream each round wakes the relays for one claim of what gathered,
//! rather than a claim per handful of messages; a sparse stream is notified
//! 2 ms after each hand-over, as before.
//!
//! A topic pushed by relays of several databases in one process (shards)
//! keeps notifying in the producers' statements: an enqueue cannot tell
//! which database its transaction writes to. Nor can it where the process
//! runs a pushing relay for a topic on one database and enqueues that
//! topic into another that no relay of the process serves: those messages
//! wait for the other database's relays' poll (`notify_on_enqueue` and
//! one relay per database avoid it).
//!
//! Polling stays the safety net: an id whose transaction takes longer than
//! [`GIVE_UP`], or a notifier whose connection is lost, delays a message to
//! the relay's next poll, never loses it. A producer in a process with no
//! such relay notifies in its own statement, as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::sync::mpsc;

/// The start of the `application_name` of a notifier's connection:
/// `idem-notifier:` and the relay's owner.
pub const NOTIFIER_APP: &str = "idem-notifier";

/// How long a notifier waits for an enqueued message's transaction to
/// commit before leaving the message to the relays' polling.
pub const GIVE_UP: Duration = Duration::from_secs(2);

/// The least time between a notifier's round that notified a dense stream
/// (at least [`DENSE`] messages) and its next round: under such a stream
/// every round wakes each pushed relay for one claim, so rounds as fast as
/// the statement allows (one every 2 to 3 ms) cost the relays a claim per
/// handful of messages, on the CPU the producers share. A sparser stream
/// is not paced: its messages are notified 2 ms after their hand-over.
pub const MIN_GAP: Duration = Duration::from_millis(16);

/// How many messages a round must have notified for [`MIN_GAP`] to pace
/// the next one.
pub const DENSE: usize = 4;

/// A running notifier: where its ids go.
// Built by the PostgreSQL notifier only.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
struct Notifier {
    ids: mpsc::UnboundedSender<i64>,
    /// The database (and schema options) it notifies in.
    target: String,
}

type Registry = Mutex<HashMap<String, Vec<Weak<Notifier>>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Whether a notifier covers `topic` in this process: [`enqueue`](super::enqueue)
/// then inserts without `NOTIFY` and [`hand_over`]s the id.
///
/// Only where every live notifier of the topic notifies in one database:
/// with the topic pushed by relays of several databases in the process
/// (shards), an enqueue cannot tell which one its transaction writes to,
/// so it notifies in its own statement, as before.
pub(crate) fn covers(topic: &str) -> bool {
    let map = registry().lock().unwrap_or_else(|p| p.into_inner());
    let mut live = map
        .get(topic)
        .into_iter()
        .flatten()
        .filter_map(Weak::upgrade);
    match live.next() {
        Some(first) => live.all(|n| n.target == first.target),
        None => false,
    }
}

/// Hands a newly enqueued (uncommitted) message's id to every notifier of
/// `topic`. Returns whether one took it; `false` (none left, the relay
/// stopped since [`covers`]) leaves the message to polling.
pub(crate) fn hand_over(topic: &str, id: i64) -> bool {
    let map = registry().lock().unwrap_or_else(|p| p.into_inner());
    let mut taken = false;
    for n in map
        .get(topic)
        .into_iter()
        .flatten()
        .filter_map(Weak::upgrade)
    {
        taken |= n.ids.send(id).is_ok();
    }
    taken
}

/// A registered notifier; dropping it unregisters it and ends its task.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) struct Registration {
    notifier: Option<Arc<Notifier>>,
    topics: Vec<String>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let Some(mine) = self.notifier.take() else {
            return;
        };
        let mut map = registry().lock().unwrap_or_else(|p| p.into_inner());
        for t in &self.topics {
            if let Some(v) = map.get_mut(t) {
                v.retain(|w| w.upgrade().is_some_and(|n| !Arc::ptr_eq(&n, &mine)));
                if v.is_empty() {
                    map.remove(t);
                }
            }
        }
        // The sender goes with `mine`: the task sees its channel closed.
    }
}

#[cfg(feature = "postgres")]
pub(crate) use pg::start;

#[cfg(feature = "postgres")]
mod pg {
    use super::{DENSE, GIVE_UP, MIN_GAP, NOTIFIER_APP, Notifier, Registration, registry};
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::mpsc;
    use tokio::time::Instant;

    /// The first wait for ids not visible yet; doubled each round to
    /// [`MAX_WAIT`].
    const FIRST_WAIT: Duration = Duration::from_millis(2);
    const MAX_WAIT: Duration = Duration::from_millis(64);

    /// The notifying statement: the visible ones of the ids (committed),
    /// each notifying its topic (PostgreSQL folds equal notifications of
    /// one transaction into one).
    const NOTIFY_VISIBLE: &str = "SELECT o.id FROM idem_outbox o, \
        LATERAL pg_notify('idem_outbox', o.topic::text) AS n \
        WHERE o.id = ANY($1)";

    /// Starts a notifier for `topics` on a connection of its own, opened
    /// with `options` (the relay pool's, so the same database and schema).
    pub(crate) fn start(options: PgConnectOptions, owner: &str, topics: &[String]) -> Registration {
        let (ids, rx) = mpsc::unbounded_channel();
        let target = format!(
            "{}:{}:{:?}/{:?}?{:?}",
            options.get_host(),
            options.get_port(),
            options.get_socket(),
            options.get_database(),
            options.get_options()
        );
        let notifier = Arc::new(Notifier { ids, target });
        {
            let mut map = registry().lock().unwrap_or_else(|p| p.into_inner());
            for t in topics {
                map.entry(t.clone())
                    .or_default()
                    .push(Arc::downgrade(&notifier));
            }
        }
        // A notifying transaction takes a transaction id, so its commit
        // would wait for a WAL flush of its own, competing with the
        // producers' (whose commits are what the bench of push wake-up
        // measures): a notification is a hint, it need not survive a
        // crash.
        let options = options
            .application_name(&format!("{NOTIFIER_APP}:{owner}"))
            .options([("synchronous_commit", "off")]);
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(Duration::from_secs(5))
            // No ping before each round: a lost connection fails the
            // round's statement, and the next round reconnects.
            .test_before_acquire(false)
            .connect_lazy_with(options);
        tokio::spawn(run(pool, rx));
        Registration {
            notifier: Some(notifier),
            topics: topics.to_vec(),
        }
    }

    /// The notifier's loop: ends when its registration is dropped (and
    /// what it holds was notified or given up).
    async fn run(pool: sqlx::PgPool, mut rx: mpsc::UnboundedReceiver<i64>) {
        // Ids waiting to be visible, with when they were handed over.
        let mut waiting: Vec<(i64, Instant)> = Vec::new();
        let mut wait = FIRST_WAIT;
        let mut open = true;
        let mut last_notified: Option<Instant> = None;
        while open || !waiting.is_empty() {
            if waiting.is_empty() {
                match rx.recv().await {
                    Some(id) => waiting.push((id, Instant::now())),
                    None => break,
                }
                wait = FIRST_WAIT;
            }
            // Give the producers' transactions time to commit; ids handed
            // over meanwhile join this round (which waits out the rest of
            // the gap after the last round that notified).
            let gap =
                last_notified.map_or(Duration::ZERO, |at| MIN_GAP.saturating_sub(at.elapsed()));
            tokio::time::sleep(wait.max(gap)).await;
            drain(&mut rx, &mut waiting, &mut open);
            let ids: Vec<i64> = waiting.iter().map(|(id, _)| *id).collect();
            match sqlx::query_scalar::<_, i64>(NOTIFY_VISIBLE)
                .bind(&ids)
                .fetch_all(&pool)
                .await
            {
                Ok(visible) => {
                    let visible: HashSet<i64> = visible.into_iter().collect();
                    waiting.retain(|(id, _)| !visible.contains(id));
                    if visible.len() >= DENSE {
                        last_notified = Some(Instant::now());
                    } else if !visible.is_empty() {
                        last_notified = None;
                    }
                    wait = if visible.is_empty() {
                        (wait * 2).min(MAX_WAIT)
                    } else {
                        FIRST_WAIT
                    };
                }
                Err(error) => {
                    // The ids stay for the next round, on a new connection.
                    tracing::debug!(%error, "outbox notifier could not notify; retrying (the relays' polling finds the messages anyway)");
                    wait = MAX_WAIT;
                }
            }
            let now = Instant::now();
            waiting.retain(|(_, since)| now.duration_since(*since) < GIVE_UP);
        }
        pool.close().await;
    }

    /// Takes the ids already queued without waiting.
    fn drain(
        rx: &mut mpsc::UnboundedReceiver<i64>,
        waiting: &mut Vec<(i64, Instant)>,
        open: &mut bool,
    ) {
        loop {
            match rx.try_recv() {
                Ok(id) => waiting.push((id, Instant::now())),
                Err(mpsc::error::TryRecvError::Empty) => return,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    *open = false;
                    return;
                }
            }
        }
    }
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use super::{covers, hand_over, start};
    use sqlx::postgres::PgConnectOptions;

    fn options(database: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(1)
            .database(database)
    }

    #[tokio::test]
    async fn a_topic_is_covered_while_its_notifiers_share_one_database() {
        let t = ["notifier-unit.a".to_string()];
        assert!(!covers(&t[0]));
        let one = start(options("a"), "u1", &t);
        assert!(covers(&t[0]));
        let same = start(options("a"), "u2", &t);
        assert!(covers(&t[0]), "two relays of one database");
        let other = start(options("b"), "u3", &t);
        assert!(
            !covers(&t[0]),
            "two databases (shards): the producer notifies itself"
        );
        drop(other);
        assert!(covers(&t[0]));
        drop((one, same));
        assert!(!covers(&t[0]));
        assert!(!hand_over(&t[0], 1), "nobody left to take the id");
    }
}

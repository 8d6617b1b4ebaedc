//! What the [`Relay`](super::Relay)'s builder methods set up: its state with the
//! default settings, its routes and subscriptions, and what its settings
//! come to.

use super::{
    Batching, Claiming, Delivery, Inner, Policy, RelayStats, Route, Routing, Waking, batch,
};
use crate::backend::Backend;
use crate::backoff::Backoff;
use crate::consume;
use sqlx::Pool;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

/// The default [`Relay::claim_spread`](super::Relay::claim_spread).
const DEFAULT_SPREAD: u32 = 8;

/// A relay's settings (see [`Relay::settings`](super::Relay::settings)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelaySettings {
    /// The most messages claimed per round (see [`Relay::batch_size`](super::Relay::batch_size)).
    pub batch_size: u32,
    /// Handlers running at once.
    pub concurrency: usize,
    /// Messages a round may claim beyond the free handler slots while
    /// there is a backlog (see [`Relay::claim_ahead`](super::Relay::claim_ahead)).
    pub claim_ahead: usize,
    /// How long a claim holds a message.
    pub lease: Duration,
    /// How long to wait when nothing is due.
    pub poll_interval: Duration,
    /// Attempts before a message is dead-lettered.
    pub max_attempts: u32,
    /// Back-off after the first failed attempt.
    pub backoff_base: Duration,
    /// The longest back-off.
    pub backoff_max: Duration,
    /// Slices of the due set a claim may start at (1: always the oldest).
    pub claim_spread: u32,
    /// Messages whose handlers share one commit (1: one commit each; see
    /// [`Relay::commit_batch`](super::Relay::commit_batch)).
    pub commit_batch: usize,
    /// How long a batch waits for a row lock on PostgreSQL (see
    /// [`Relay::batch_lock_wait`](super::Relay::batch_lock_wait)).
    pub batch_lock_wait: Duration,
    /// Whether a spawned relay listens for enqueues (see
    /// [`Relay::pushes`](super::Relay::pushes)).
    pub push_wakeup: bool,
    /// How often a spawned relay refreshes its row in `idem_process` (see
    /// [`Relay::heartbeat_interval`](super::Relay::heartbeat_interval)).
    pub heartbeat_interval: Duration,
}

impl<DB: Backend> Inner<DB> {
    /// A relay's state on `pool`: no routes, the default settings (see
    /// [`Relay::new`](super::Relay::new)).
    pub(super) fn new(pool: Pool<DB>) -> Self {
        let seed = std::collections::hash_map::RandomState::new()
            .hash_one((std::process::id(), std::time::SystemTime::now()));
        let owner = format!("relay-{}-{:08x}", std::process::id(), seed as u32);
        Inner {
            claiming: Claiming {
                claim: DB::pool_dialect(&pool).claim_sql(0, false),
                owner,
                // Random: a restarted relay of the same name never
                // writes a lease owner its previous run wrote.
                claims: AtomicU64::new(seed.rotate_left(32)),
                recover_claims: true,
                claim_spread: DEFAULT_SPREAD,
                hold_after_dead: false,
                backlog: AtomicBool::new(true),
                emptied: AtomicBool::new(false),
                batch_size: 64,
                ahead: None,
            },
            pool,
            routing: Routing {
                routes: HashMap::new(),
                subscribers: HashMap::new(),
                topics: Vec::new(),
            },
            policy: Policy {
                concurrency: 16,
                lease: Duration::from_secs(30),
                poll_interval: Duration::from_millis(100),
                max_attempts: 10,
                backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(60)),
                outage_retry: super::DEFAULT_OUTAGE_RETRY,
                heartbeat: crate::process::DEFAULT_INTERVAL,
            },
            batching: Batching {
                commit_batch: 1,
                adaptive: batch::Adaptive::default(),
                lock_wait: batch::DEFAULT_LOCK_WAIT,
                open: Default::default(),
            },
            waking: Waking {
                push_wakeup: None,
                listener_catch_up: true,
                kick: Default::default(),
            },
            on_settled: None,
            stats: RelayStats::default(),
            unreleased: Default::default(),
            gates: Default::default(),
            limits: Default::default(),
            in_flight: Default::default(),
            schema_ok: AtomicBool::new(false),
        }
    }

    /// Routes `topic` to `route` (see [`Relay::route`](super::Relay::route)).
    pub(super) fn add_route(&mut self, topic: String, route: Route<DB>) {
        assert!(
            !self.routing.routes.contains_key(&topic),
            "outbox topic `{topic}` is routed twice on one relay: the second route would \
             replace the first. To run several handlers for one message, give each its own \
             subscription with Relay::subscribe(topic, name, handler)"
        );
        self.routing.routes.insert(topic, route);
        self.routed();
    }

    /// Subscribes `route`, named `name`, to `topic` (see
    /// [`Relay::subscribe`](super::Relay::subscribe)).
    pub(super) fn add_subscriber(&mut self, topic: String, name: String, route: Route<DB>) {
        let subs = self.routing.subscribers.entry(topic.clone()).or_default();
        assert!(
            !subs.is_empty() || !self.routing.routes.contains_key(&topic),
            "outbox topic `{topic}` has a route already: subscribe every handler of a \
             fanned-out topic with Relay::subscribe, none with Relay::route"
        );
        consume::add(subs, &format!("outbox topic `{topic}`"), name, route);
        let fanned = consume::fan_out(subs.clone(), hand);
        self.routing.routes.insert(topic, fanned);
        self.routed();
    }

    /// See [`Relay::pushes`](super::Relay::pushes).
    pub(super) fn pushes(&self) -> bool {
        crate::backend::Dialect::Postgres == DB::pool_dialect(&self.pool)
            && self
                .waking
                .push_wakeup
                .unwrap_or_else(|| !crate::pooler::transaction_mode_enabled())
    }

    /// See [`Relay::settings`](super::Relay::settings).
    pub(super) fn settings(&self) -> RelaySettings {
        RelaySettings {
            batch_size: u32::try_from(self.claiming.batch_size).unwrap_or(u32::MAX),
            concurrency: self.policy.concurrency,
            claim_ahead: self.claim_ahead(),
            lease: self.policy.lease,
            poll_interval: self.policy.poll_interval,
            max_attempts: u32::try_from(self.policy.max_attempts).unwrap_or(1),
            backoff_base: self.policy.backoff.base,
            backoff_max: self.policy.backoff.max,
            claim_spread: self.claiming.claim_spread,
            commit_batch: self.batching.commit_batch,
            batch_lock_wait: self.batching.lock_wait,
            push_wakeup: self.pushes(),
            heartbeat_interval: self.policy.heartbeat,
        }
    }

    /// After a route was added: the topics claimed, and the claim for them.
    fn routed(&mut self) {
        self.routing.topics = self.routing.routes.keys().cloned().collect();
        self.routing.topics.sort();
        self.render_claim();
    }

    /// The claim statement for the routed topics and the dead-head mode.
    pub(super) fn render_claim(&mut self) {
        let mut claim = DB::pool_dialect(&self.pool)
            .claim_sql(self.routing.topics.len(), self.claiming.hold_after_dead);
        if crate::probe::broken(crate::probe::Break::Unordered) {
            claim.claim =
                DB::pool_dialect(&self.pool).unordered_claim_sql(self.routing.topics.len());
        }
        self.claiming.claim = claim;
    }
}

/// The delivery a subscriber of a fanned-out topic gets: the relay's own
/// (its count of sources taken, its mark) for the last one when no one
/// before it failed, so that the message is marked in its transaction;
/// one that does not mark for the others (see [`Relay::subscribe`](super::Relay::subscribe)).
fn hand<DB: Backend>(d: &Delivery<DB>, settles: bool) -> Delivery<DB> {
    match settles {
        true => d.clone(),
        false => d.unmarking(),
    }
}

/// `owner`, shortened to [`Relay::MAX_OWNER_LEN`](super::Relay::MAX_OWNER_LEN) bytes if longer (see
/// [`Relay::owner`](super::Relay::owner)).
pub(super) fn fit_owner(owner: String) -> String {
    use sha2::{Digest, Sha256};
    const MAX: usize = 47;
    if owner.len() <= MAX {
        return owner;
    }
    let mut cut = MAX - 9;
    while !owner.is_char_boundary(cut) {
        cut -= 1;
    }
    let digest = Sha256::digest(owner.as_bytes());
    let tag: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}~{tag}", &owner[..cut])
}

#[cfg(test)]
mod owner_tests {
    use super::fit_owner;

    #[test]
    fn long_owners_are_shortened_to_distinct_names_that_fit() {
        assert_eq!(fit_owner("relay-a".into()), "relay-a");
        let long = |tail: &str| format!("{}{tail}", "é".repeat(30));
        let (a, b) = (fit_owner(long("-1")), fit_owner(long("-2")));
        assert!(a.len() <= 47 && b.len() <= 47, "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(a, fit_owner(long("-1")), "stable");
    }
}

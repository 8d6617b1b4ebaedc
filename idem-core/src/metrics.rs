//! idem's metrics, through the [`metrics`](https://docs.rs/metrics) facade:
//! install any recorder (Prometheus, StatsD, OpenTelemetry…) to export
//! them; without one they cost next to nothing. Call [`describe`] once
//! after installing it, so that each series gets its HELP text and unit
//! (the console's `/metrics` and `idem serve` call it for you).
//!
//! # Counters
//!
//! | counter | labels | what |
//! |---|---|---|
//! | `idem_calls_total` | `outcome` = executed / duplicate | committed calls |
//! | `idem_duplicates_total` | `layer` = cache / domain_state / record / unique_insert | duplicates stopped, by layer |
//! | `idem_errors_total` | `kind` = invalid_key / illegal_state / key_conflict / lease_lost / outbox_message / invalid_message / message_conflict / database / commit_unknown / handler / serialization / config | failed calls and enqueues |
//! | `idem_outbox_already_enqueued_total` | | `enqueue` calls answered `Already` (producer retries) |
//! | `idem_cache_hits_total` | | cache lookups that found a marker |
//! | `idem_cache_misses_total` | | cache lookups Redis answered without a marker |
//! | `idem_cache_errors_total` | | cache calls (lookups, which fell through to the database, and marker writes) that failed: Redis error, time-out, or no connection; per call |
//! | `idem_cache_connect_errors_total` | | background Redis connection attempts that failed |
//! | `idem_cache_mismatches_total` | | record markers of another payload (fell through to the database) |
//! | `idem_outbox_lease_renewals_total` | | in-flight outbox leases extended by a relay's heartbeat |
//! | `idem_outbox_retries_total` | `topic` | failed outbox attempts put back for a retry (outages included) |
//! | `idem_outbox_dead_letters_total` | `topic` | outbox messages dead-lettered |
//! | `idem_mq_retries_total` | | AMQP deliveries scheduled for a delayed retry, JetStream deliveries nak'd with a delay |
//! | `idem_mq_dead_letters_total` | | AMQP deliveries rejected to the dead-letter exchange, JetStream deliveries terminated |
//! | `idem_archived_total` | `table` = record / outbox | rows the archiver moved out |
//! | `idem_console_refused_hosts_total` | | console requests refused for their `Host` |
//! | `idem_console_throttled_total` | | console sign-ins throttled |
//! | `idem_console_refused_writes_total` | | console writes refused (no or a wrong token, a bad CSRF token or origin) |
//! | `idem_console_requeued_total` | | dead letters requeued from the console |
//!
//! The relay's counters, one per [`RelayStats`](crate::outbox::RelayStats)
//! counter, summed over the process's relays (no labels):
//! `idem_relay_claims_total`, `idem_relay_claimed_total`,
//! `idem_relay_reclaimed_total`, `idem_relay_lost_claims_total`,
//! `idem_relay_claim_conflicts_total`, `idem_relay_recovered_total`,
//! `idem_relay_executed_total`, `idem_relay_duplicates_total`,
//! `idem_relay_retried_total`, `idem_relay_outages_total`,
//! `idem_relay_dead_lettered_total`, `idem_relay_stale_total`,
//! `idem_relay_landed_total`, `idem_relay_batches_total`,
//! `idem_relay_lost_batches_total`, `idem_relay_conflict_reruns_total`,
//! `idem_relay_push_wakeups_total`, `idem_relay_listener_failures_total`.
//!
//! The broker consumers' counters, one per
//! [`ConsumerStats`](crate::consume::ConsumerStats) counter, summed over
//! the process's consumers (no labels): `idem_consumer_received_total`,
//! `idem_consumer_redelivered_total`, `idem_consumer_executed_total`,
//! `idem_consumer_duplicates_total`, `idem_consumer_retried_total`,
//! `idem_consumer_dead_lettered_total`, `idem_consumer_progress_acks_total`,
//! `idem_consumer_settle_failed_total`, `idem_consumer_pull_failures_total`,
//! `idem_consumer_outage_waits_total`, `idem_consumer_reconnects_total`.
//!
//! # Histograms
//!
//! | histogram | unit | labels | what |
//! |---|---|---|---|
//! | `idem_outbox_handler_duration_seconds` | seconds | `topic`, `outcome` | one attempt's handler run (its reruns after a lost deadlock included), per settled attempt of the relay |
//! | `idem_outbox_attempts` | count | `topic`, `outcome` | attempts a message took, once per message, at its final settlement |
//! | `idem_outbox_enqueue_to_settle_seconds` | seconds | `topic`, `outcome` | from its enqueue (its `created_at`, by the database's clock) to its final settlement, once per message |
//! | `idem_subscriber_duration_seconds` | seconds | `handler`, `outcome` = executed / duplicate / failed | one subscriber of a fanned-out message (the relay's `subscribe`, a consumer's `fan_out`), `handler` its name |
//!
//! `outcome` is what the attempt's bookkeeping came to: `success` (the
//! handler executed the action, or its commit whose acknowledgement was
//! lost had landed), `duplicate`, `retry`, `outage` (failed in an outage,
//! given back uncounted), `dead` (dead-lettered), `stale` (the message was
//! no longer held by the attempt) or `unrecorded` (the bookkeeping could
//! not be written). `idem_outbox_attempts` has only the final ones:
//! `success`, `duplicate`, `dead`; its `_count` counts messages done with.
//!
//! # Bounded label values
//!
//! A `topic` label takes the first [`topic_label_limit`] distinct topics
//! the process reports (100 by default, [`set_topic_label_limit`] changes
//! it); any later topic is reported as `other`. A relay's topics are its
//! routes, a finite set, but a consumer may see whatever topics its broker
//! carries: the cap keeps each series family at most that many series per
//! other label value. The `handler` label (subscriber names) is capped
//! the same way, at [`DEFAULT_TOPIC_LABEL_LIMIT`] names.

use crate::Error;
use crate::outbox::Settlement;
use metrics::{SharedString, Unit, describe_counter, describe_histogram};
use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, PoisonError, RwLock};
use std::time::Duration;

/// How many distinct topics get a `topic` label of their own by default
/// (see [`set_topic_label_limit`]).
pub const DEFAULT_TOPIC_LABEL_LIMIT: usize = 100;

/// The `topic` label of the topics past the limit.
pub const OTHER_TOPIC: &str = "other";

/// One handler run of the relay, per settled attempt.
const HANDLER_DURATION: &str = "idem_outbox_handler_duration_seconds";
/// The attempts of a message, at its final settlement.
const ATTEMPTS: &str = "idem_outbox_attempts";
/// From a message's enqueue to its final settlement.
const ENQUEUE_TO_SETTLE: &str = "idem_outbox_enqueue_to_settle_seconds";
/// One subscriber of a fanned-out message.
const SUBSCRIBER_DURATION: &str = "idem_subscriber_duration_seconds";

/// Declares counter names as constants and lists them with their HELP
/// text, so that [`describe`] covers each one.
macro_rules! counters {
    ($list:ident: $($id:ident = $name:literal, $help:literal;)*) => {
        $(pub(crate) const $id: &str = $name;)*
        const $list: &[(&str, &str)] = &[$(($id, $help)),*];
    };
}

counters! { COUNTERS:
    CALLS = "idem_calls_total", "Committed #[idempotent] calls, by outcome (executed, duplicate).";
    DUPLICATES = "idem_duplicates_total", "Duplicates stopped, by the layer that stopped them.";
    ERRORS = "idem_errors_total", "Failed calls and enqueues, by error kind.";
    ALREADY_ENQUEUED = "idem_outbox_already_enqueued_total", "Enqueues answered Already: a producer's retry of a message in the outbox.";
    CACHE_HITS = "idem_cache_hits_total", "Front cache lookups that found a marker.";
    CACHE_MISSES = "idem_cache_misses_total", "Front cache lookups Redis answered without a marker.";
    CACHE_ERRORS = "idem_cache_errors_total", "Front cache calls that failed (Redis error, time-out, no connection).";
    CACHE_CONNECT_ERRORS = "idem_cache_connect_errors_total", "Background Redis connection attempts that failed.";
    CACHE_MISMATCHES = "idem_cache_mismatches_total", "Record markers of another payload (fell through to the database).";
    LEASE_RENEWALS = "idem_outbox_lease_renewals_total", "In-flight outbox leases extended by a relay's heartbeat.";
    OUTBOX_RETRIES = "idem_outbox_retries_total", "Failed outbox attempts put back for a retry (outages included), per topic.";
    OUTBOX_DEAD_LETTERS = "idem_outbox_dead_letters_total", "Outbox messages dead-lettered, per topic.";
    MQ_RETRIES = "idem_mq_retries_total", "Broker deliveries scheduled for a delayed retry (AMQP retry queue, JetStream nak with a delay).";
    MQ_DEAD_LETTERS = "idem_mq_dead_letters_total", "Broker deliveries dead-lettered (AMQP reject, JetStream +TERM).";
    ARCHIVED = "idem_archived_total", "Rows the archiver moved out, per table (record, outbox).";
    CONSOLE_REFUSED_HOSTS = "idem_console_refused_hosts_total", "Console requests refused for their Host.";
    CONSOLE_THROTTLED = "idem_console_throttled_total", "Console sign-ins throttled.";
    CONSOLE_REFUSED_WRITES = "idem_console_refused_writes_total", "Console writes refused (token, CSRF token or origin).";
    CONSOLE_REQUEUED = "idem_console_requeued_total", "Dead letters requeued from the console.";
}

counters! { RELAY_COUNTERS:
    RELAY_CLAIMS = "idem_relay_claims_total", "Claim transactions the relays ran, empty ones included.";
    RELAY_CLAIMED = "idem_relay_claimed_total", "Messages the relays claimed (one attempt each), recovered ones included.";
    RELAY_RECLAIMED = "idem_relay_reclaimed_total", "Claimed messages whose previous lease had expired unsettled (a crashed relay).";
    RELAY_LOST_CLAIMS = "idem_relay_lost_claims_total", "Claims whose commit outcome was unknown (a lost acknowledgement).";
    RELAY_CLAIM_CONFLICTS = "idem_relay_claim_conflicts_total", "Claims rolled back by a conflict with a concurrent transaction, claimed again.";
    RELAY_RECOVERED = "idem_relay_recovered_total", "Messages read back after a lost claim whose commit had landed.";
    RELAY_EXECUTED = "idem_relay_executed_total", "Relay attempts whose handler executed the action.";
    RELAY_DUPLICATES = "idem_relay_duplicates_total", "Relay attempts answered Duplicate.";
    RELAY_RETRIED = "idem_relay_retried_total", "Failed relay attempts put back to pending for a retry.";
    RELAY_OUTAGES = "idem_relay_outages_total", "Of the retried relay attempts, those given back uncounted after an outage.";
    RELAY_DEAD_LETTERED = "idem_relay_dead_lettered_total", "Messages the relays dead-lettered.";
    RELAY_STALE = "idem_relay_stale_total", "Relay bookkeeping that found its message no longer held by the attempt.";
    RELAY_LANDED = "idem_relay_landed_total", "Of the stale attempts, those whose unknown commit had landed: a success.";
    RELAY_BATCHES = "idem_relay_batches_total", "Relay batches committed.";
    RELAY_LOST_BATCHES = "idem_relay_lost_batches_total", "Relay batches whose commit failed (read back, or delivered again one by one).";
    RELAY_CONFLICT_RERUNS = "idem_relay_conflict_reruns_total", "Handlers run again at once after losing a conflict (a deadlock, a lock wait).";
    RELAY_PUSH_WAKEUPS = "idem_relay_push_wakeups_total", "Notifications for a relay's topics its listener received.";
    RELAY_LISTENER_FAILURES = "idem_relay_listener_failures_total", "Times a relay's listener lost its connection or failed to connect.";
}

counters! { CONSUMER_COUNTERS:
    CONSUMER_RECEIVED = "idem_consumer_received_total", "Deliveries the broker consumers received.";
    CONSUMER_REDELIVERED = "idem_consumer_redelivered_total", "Redeliveries received (NATS), records read back from the retry topic (Kafka).";
    CONSUMER_EXECUTED = "idem_consumer_executed_total", "Deliveries acknowledged after the handler executed the action.";
    CONSUMER_DUPLICATES = "idem_consumer_duplicates_total", "Deliveries acknowledged after the handler answered Duplicate.";
    CONSUMER_RETRIED = "idem_consumer_retried_total", "Failed deliveries handed back for a retry.";
    CONSUMER_DEAD_LETTERED = "idem_consumer_dead_lettered_total", "Deliveries dead-lettered by the broker consumers.";
    CONSUMER_PROGRESS_ACKS = "idem_consumer_progress_acks_total", "In-progress acks sent while a handler ran (NATS).";
    CONSUMER_SETTLE_FAILED = "idem_consumer_settle_failed_total", "Settlements that could not be sent or were not confirmed: delivered again.";
    CONSUMER_PULL_FAILURES = "idem_consumer_pull_failures_total", "Pull requests (NATS) or reads (Kafka) that failed.";
    CONSUMER_OUTAGE_WAITS = "idem_consumer_outage_waits_total", "Handler tries that failed in an outage and were run again in place, uncounted.";
    CONSUMER_RECONNECTS = "idem_consumer_reconnects_total", "Consumer connections dialled again after the previous one died (AMQP).";
}

/// Describes every metric idem reports (HELP text and unit) to the
/// installed recorder. Call it once after installing the recorder: a
/// recorder keeps the descriptions of names it has not seen yet (the
/// Prometheus exporter does).
///
/// ```
/// let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
/// let handle = recorder.handle();
/// metrics::with_local_recorder(&recorder, || {
///     idem_runtime::metrics::describe();
///     metrics::counter!("idem_relay_claimed_total").increment(3);
/// });
/// let text = handle.render();
/// assert!(text.contains("# HELP idem_relay_claimed_total Messages the relays claimed"), "{text}");
/// ```
pub fn describe() {
    for (name, help) in COUNTERS
        .iter()
        .chain(RELAY_COUNTERS)
        .chain(CONSUMER_COUNTERS)
    {
        describe_counter!(*name, Unit::Count, *help);
    }
    describe_histogram!(
        HANDLER_DURATION,
        Unit::Seconds,
        "Duration of one relay attempt's handler, per topic and outcome of the attempt."
    );
    describe_histogram!(
        SUBSCRIBER_DURATION,
        Unit::Seconds,
        "Duration of one subscriber of a fanned-out message (relay or broker consumer), per handler and outcome."
    );
    describe_histogram!(
        ENQUEUE_TO_SETTLE,
        Unit::Seconds,
        "From an outbox message's enqueue (its created_at, by the database's clock) to its final settlement (success, duplicate, dead), per topic and outcome."
    );
    describe_histogram!(
        ATTEMPTS,
        Unit::Count,
        "Attempts an outbox message took, observed once per message at its final settlement (success, duplicate, dead)."
    );
}

/// The distinct values of one label given so far, and how many may be.
struct Capped {
    limit: AtomicUsize,
    seen: LazyLock<RwLock<HashSet<Arc<str>>>>,
}

impl Capped {
    const fn new(limit: usize) -> Self {
        Capped {
            limit: AtomicUsize::new(limit),
            seen: LazyLock::new(Default::default),
        }
    }

    /// `value` while the limit allows (a value given before stays),
    /// [`OTHER_TOPIC`] past it.
    fn label(&self, value: &str) -> SharedString {
        let seen = &*self.seen;
        if let Some(v) = seen
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(value)
        {
            return SharedString::from(v.clone());
        }
        let mut seen = seen.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(v) = seen.get(value) {
            return SharedString::from(v.clone());
        }
        if seen.len() >= self.limit.load(Ordering::Relaxed) {
            return SharedString::const_str(OTHER_TOPIC);
        }
        let v: Arc<str> = value.into();
        seen.insert(v.clone());
        SharedString::from(v)
    }
}

static TOPICS: Capped = Capped::new(DEFAULT_TOPIC_LABEL_LIMIT);

/// Subscriber names (the `handler` label): as many as topics by default.
static HANDLERS: Capped = Capped::new(DEFAULT_TOPIC_LABEL_LIMIT);

/// Sets how many distinct topics get a `topic` label of their own (the
/// first ones reported keep theirs); any other is labelled
/// [`OTHER_TOPIC`]. Lowering it keeps the topics labelled already.
pub fn set_topic_label_limit(limit: usize) {
    TOPICS.limit.store(limit, Ordering::Relaxed);
}

/// How many distinct topics get a `topic` label of their own (see
/// [`set_topic_label_limit`]).
pub fn topic_label_limit() -> usize {
    TOPICS.limit.load(Ordering::Relaxed)
}

/// The `topic` label of `topic`: itself while the limit allows,
/// [`OTHER_TOPIC`] past it.
pub(crate) fn topic(topic: &str) -> SharedString {
    TOPICS.label(topic)
}

/// One subscriber `handler` of a fanned-out message, which ran for `ran`
/// and came to `result` (executed, or a duplicate).
pub(crate) fn subscriber(handler: &str, result: &Result<bool, Error>, ran: Duration) {
    let outcome = match result {
        Ok(true) => "executed",
        Ok(false) => "duplicate",
        Err(_) => "failed",
    };
    let handler = HANDLERS.label(handler);
    metrics::histogram!(SUBSCRIBER_DURATION, "handler" => handler, "outcome" => outcome)
        .record(ran.as_secs_f64());
}

/// An in-process counter (a [`RelayStats`](crate::outbox::RelayStats)
/// one) that also counts in the facade's counter `name`: the two move
/// together, at the one call site.
pub(crate) struct Metered {
    value: AtomicU64,
    name: &'static str,
}

impl Metered {
    pub(crate) const fn new(name: &'static str) -> Self {
        Metered {
            value: AtomicU64::new(0),
            name,
        }
    }

    /// Adds `n` here and in the facade's counter; the previous value.
    pub(crate) fn fetch_add(&self, n: u64, order: Ordering) -> u64 {
        metrics::counter!(self.name).increment(n);
        self.value.fetch_add(n, order)
    }

    pub(crate) fn load(&self, order: Ordering) -> u64 {
        self.value.load(order)
    }
}

impl fmt::Debug for Metered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.value, f)
    }
}

/// The `outcome` label of a settled attempt (`outage`: it failed in an
/// outage, and was given back uncounted).
fn outcome(settlement: Settlement, outage: bool) -> &'static str {
    match settlement {
        Settlement::Executed | Settlement::Landed => "success",
        Settlement::Duplicate => "duplicate",
        Settlement::Retried if outage => "outage",
        Settlement::Retried => "retry",
        Settlement::DeadLettered => "dead",
        Settlement::Stale => "stale",
        Settlement::Unrecorded => "unrecorded",
    }
}

/// One settled attempt of the relay under `lease`, whose handler ran for
/// `ran`: its duration, and when its message is done with, the attempts
/// it took and how long after its enqueue.
pub(crate) fn outbox_settled(
    lease: &crate::lease::OutboxLease,
    settlement: Settlement,
    outage: bool,
    ran: Duration,
) {
    let (topic, outcome) = (self::topic(lease.topic()), outcome(settlement, outage));
    metrics::histogram!(HANDLER_DURATION, "topic" => topic.clone(), "outcome" => outcome)
        .record(ran.as_secs_f64());
    if settlement.is_final() {
        metrics::histogram!(ATTEMPTS, "topic" => topic.clone(), "outcome" => outcome)
            .record(f64::from(lease.attempt()));
        if let Some(at) = lease.enqueued {
            metrics::histogram!(ENQUEUE_TO_SETTLE, "topic" => topic, "outcome" => outcome)
                .record(at.elapsed().as_secs_f64());
        }
    }
}

/// Counts one on the consumer counter `name` (one of the
/// `CONSUMER_…` names, see `consume::Counter::metric`).
pub(crate) fn consumer(name: &'static str) {
    metrics::counter!(name).increment(1);
}

/// Counts a consumer's acknowledged delivery: executed, or a duplicate.
pub(crate) fn consumer_acked(executed: bool) {
    let name = match executed {
        true => CONSUMER_EXECUTED,
        false => CONSUMER_DUPLICATES,
    };
    metrics::counter!(name).increment(1);
}

pub(crate) fn call(outcome: &'static str) {
    metrics::counter!(CALLS, "outcome" => outcome).increment(1);
}

pub(crate) fn duplicate(layer: &'static str) {
    metrics::counter!(DUPLICATES, "layer" => layer).increment(1);
}

pub(crate) fn error(err: &Error) {
    metrics::counter!(ERRORS, "kind" => err.kind().as_str()).increment(1);
}

pub(crate) fn cache_mismatch() {
    metrics::counter!(CACHE_MISMATCHES).increment(1);
}

pub(crate) fn already_enqueued() {
    metrics::counter!(ALREADY_ENQUEUED).increment(1);
}

pub(crate) fn lease_renewals(n: u64) {
    metrics::counter!(LEASE_RENEWALS).increment(n);
}

pub(crate) fn outbox_retry(topic: &str) {
    metrics::counter!(OUTBOX_RETRIES, "topic" => self::topic(topic)).increment(1);
}

pub(crate) fn outbox_dead_letter(topic: &str) {
    metrics::counter!(OUTBOX_DEAD_LETTERS, "topic" => self::topic(topic)).increment(1);
}

pub(crate) fn mq_retry() {
    metrics::counter!(MQ_RETRIES).increment(1);
}

pub(crate) fn mq_dead_letter() {
    metrics::counter!(MQ_DEAD_LETTERS).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_listed_once() {
        let mut names = HashSet::new();
        for (name, help) in COUNTERS
            .iter()
            .chain(RELAY_COUNTERS)
            .chain(CONSUMER_COUNTERS)
        {
            assert!(
                name.starts_with("idem_") && name.ends_with("_total"),
                "{name}"
            );
            assert!(!help.is_empty(), "{name}");
            assert!(names.insert(*name), "{name} listed twice");
        }
    }

    #[test]
    fn outcomes_are_the_documented_ones() {
        assert_eq!(outcome(Settlement::Landed, false), "success");
        assert_eq!(outcome(Settlement::Retried, true), "outage");
        assert_eq!(outcome(Settlement::Retried, false), "retry");
        assert_eq!(outcome(Settlement::DeadLettered, false), "dead");
    }
}

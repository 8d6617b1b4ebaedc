//! Counters through the `metrics` facade (install any recorder to export
//! them; without one they cost next to nothing):
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
//! | `idem_outbox_retries_total` | | failed outbox attempts put back for a retry |
//! | `idem_outbox_dead_letters_total` | | outbox messages dead-lettered |
//! | `idem_mq_retries_total` | | AMQP deliveries scheduled for a delayed retry, JetStream deliveries nak'd with a delay |
//! | `idem_mq_dead_letters_total` | | AMQP deliveries rejected to the dead-letter exchange, JetStream deliveries terminated |

use crate::Error;

pub(crate) fn call(outcome: &'static str) {
    metrics::counter!("idem_calls_total", "outcome" => outcome).increment(1);
}

pub(crate) fn duplicate(layer: &'static str) {
    metrics::counter!("idem_duplicates_total", "layer" => layer).increment(1);
}

pub(crate) fn error(err: &Error) {
    metrics::counter!("idem_errors_total", "kind" => err.kind().as_str()).increment(1);
}

pub(crate) fn cache_mismatch() {
    metrics::counter!("idem_cache_mismatches_total").increment(1);
}

pub(crate) fn already_enqueued() {
    metrics::counter!("idem_outbox_already_enqueued_total").increment(1);
}

pub(crate) fn lease_renewals(n: u64) {
    metrics::counter!("idem_outbox_lease_renewals_total").increment(n);
}

pub(crate) fn outbox_retry() {
    metrics::counter!("idem_outbox_retries_total").increment(1);
}

pub(crate) fn outbox_dead_letter() {
    metrics::counter!("idem_outbox_dead_letters_total").increment(1);
}

pub(crate) fn mq_retry() {
    metrics::counter!("idem_mq_retries_total").increment(1);
}

pub(crate) fn mq_dead_letter() {
    metrics::counter!("idem_mq_dead_letters_total").increment(1);
}

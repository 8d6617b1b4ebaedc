//! The `record` strategy's marker (issue 23, points 5 and 6).

use idem_model::check::{prove_model, refute_model};
use idem_model::record::{CACHE_AGREES, MARKER_WITHIN_RECORD, RecordConfig, RecordMutation};

#[test]
fn the_marker_never_outlives_its_record() {
    prove_model(
        "record, 3 callers, 1 lost acknowledgement",
        RecordConfig::new(3),
    );
}

#[test]
fn a_cache_ttl_alone_answers_an_expired_key_from_the_cache() {
    refute_model(
        "record, the marker's TTL the cache's alone",
        RecordConfig {
            mutation: Some(RecordMutation::CacheTtlOnly),
            ..RecordConfig::new(2)
        },
        CACHE_AGREES,
    );
}

#[test]
fn a_remaining_ttl_not_reduced_by_the_time_since_its_read_outlives_the_record() {
    refute_model(
        "record, the remaining TTL as read",
        RecordConfig {
            mutation: Some(RecordMutation::TtlAsRead),
            ..RecordConfig::new(2)
        },
        MARKER_WITHIN_RECORD,
    );
}

/// Finding 4 (bounded by the `PSETEX`'s flight time): the TTL is relative
/// to Redis's receipt, so the time between computing it and Redis applying
/// it is added to the marker's life: a marker may outlive its record by
/// that (milliseconds). The runtime now takes the cache's timeout off the
/// TTL (`cache.rs`, `Marker::ttl`): a write Redis answers within the
/// timeout was applied within it. A write applied later than that (its
/// answer timed out) is what this model's unbounded flight still shows.
#[test]
fn finding_4_a_marker_in_flight_outlives_its_record_by_the_flight() {
    refute_model(
        "record, time passing while the PSETEX is in flight",
        RecordConfig {
            flight: true,
            ..RecordConfig::new(1)
        },
        MARKER_WITHIN_RECORD,
    );
}

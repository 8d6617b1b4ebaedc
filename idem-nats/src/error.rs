//! async-nats errors as idem's [`Error`]: retryable or permanent.

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{CreateStreamErrorKind, PublishErrorKind};
use async_nats::jetstream::stream::ConsumerErrorKind;
use idem_core::Error;
use std::fmt;

/// A failed NATS operation, as the source of an [`Error`].
#[derive(Debug)]
struct NatsError {
    op: &'static str,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl fmt::Display for NatsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NATS {} failed: {}", self.op, self.source)
    }
}

impl std::error::Error for NatsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// Wraps `e` as a retryable [`Error`]: a connection that dropped, a
/// time-out, a stream leader being elected, a stream a deployment may
/// still create.
pub(super) fn retryable(
    op: &'static str,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> Error {
    Error::broker(
        "nats",
        NatsError {
            op,
            source: e.into(),
        },
        true,
    )
}

/// Wraps `e` as a permanent [`Error`]: retrying cannot help.
pub(super) fn permanent(
    op: &'static str,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> Error {
    Error::broker(
        "nats",
        NatsError {
            op,
            source: e.into(),
        },
        false,
    )
}

/// A failed JetStream publish: permanent when the message can never be
/// stored as sent (larger than the server's `max_payload`, an
/// expectation header that failed), retryable otherwise (no stream yet
/// for the subject, a time-out waiting for the stream's ack — the
/// message may or may not be stored —, a broken connection, too many
/// acks pending).
pub(super) fn from_publish(e: async_nats::jetstream::context::PublishError) -> Error {
    match e.kind() {
        PublishErrorKind::MaxPayloadExceeded
        | PublishErrorKind::WrongLastMessageId
        | PublishErrorKind::WrongLastSequence => permanent("publish", e),
        _ => retryable("publish", e),
    }
}

/// A failed stream creation or update: permanent when the server refused
/// the configuration (invalid, or changing what cannot change),
/// retryable when it could not be asked.
pub(super) fn from_create_stream(e: async_nats::jetstream::context::CreateStreamError) -> Error {
    match e.kind() {
        CreateStreamErrorKind::JetStream(j) if transient(j.error_code()) => {
            retryable("stream create", e)
        }
        CreateStreamErrorKind::EmptyStreamName
        | CreateStreamErrorKind::InvalidStreamName
        | CreateStreamErrorKind::DomainAndExternalSet
        | CreateStreamErrorKind::JetStream(_) => permanent("stream create", e),
        _ => retryable("stream create", e),
    }
}

/// A failed consumer creation or lookup: permanent for an invalid name or
/// type and for a configuration the server refused, retryable when the
/// server could not answer, or answered that the stream or consumer does
/// not exist (yet) or that its cluster is electing a leader.
pub(super) fn from_consumer(
    op: &'static str,
    e: async_nats::jetstream::stream::ConsumerError,
) -> Error {
    match e.kind() {
        ConsumerErrorKind::JetStream(j)
            if transient(j.error_code())
                || j.error_code() == ErrorCode::CONSUMER_NOT_FOUND
                || j.error_code() == ErrorCode::STREAM_NOT_FOUND =>
        {
            retryable(op, e)
        }
        ConsumerErrorKind::InvalidConsumerType
        | ConsumerErrorKind::InvalidName
        | ConsumerErrorKind::JetStream(_) => permanent(op, e),
        _ => retryable(op, e),
    }
}

/// JetStream API errors of a cluster in transition (no leader yet, a peer
/// gone): the same request may succeed in a moment.
fn transient(code: ErrorCode) -> bool {
    [
        ErrorCode::CLUSTER_NOT_AVAILABLE,
        ErrorCode::CLUSTER_NOT_LEADER,
        ErrorCode::CLUSTER_NOT_ACTIVE,
        ErrorCode::CLUSTER_NOT_ASSIGNED,
        ErrorCode::CLUSTER_INCOMPLETE,
        ErrorCode::CLUSTER_NO_PEERS,
        ErrorCode::STREAM_OFFLINE,
    ]
    .contains(&code)
}

//! librdkafka errors as idem's [`Error`]: an outage, retryable or
//! permanent.

use idem_core::Error;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use std::fmt;

/// A failed Kafka operation, as the source of an [`Error`].
#[derive(Debug)]
struct Failed {
    op: &'static str,
    source: KafkaError,
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Kafka {} failed: {}", self.op, self.source)
    }
}

impl std::error::Error for Failed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// What a failed operation says about the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// No broker answered: not the message's fault, and not an attempt.
    Outage,
    /// A later try may succeed (a leader moving, a topic not created yet).
    Retryable,
    /// The same request can never succeed (too large, not authorized).
    Permanent,
}

/// How `code` reads.
pub(crate) fn kind(code: RDKafkaErrorCode) -> Kind {
    use RDKafkaErrorCode as C;
    match code {
        // librdkafka gave up waiting for any broker: the record was not
        // acknowledged within `message.timeout.ms`, or no broker is up.
        C::MessageTimedOut
        | C::AllBrokersDown
        | C::BrokerTransportFailure
        | C::Resolve
        | C::NetworkException => Kind::Outage,
        C::MessageSizeTooLarge
        | C::InvalidMessage
        | C::InvalidMessageSize
        | C::InvalidTopic
        | C::TopicAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::InvalidRecord => Kind::Permanent,
        _ => Kind::Retryable,
    }
}

/// `e`, from operation `op`, as an [`Error`].
pub(crate) fn from_kafka(op: &'static str, e: KafkaError) -> Error {
    let k = e.rdkafka_error_code().map_or(Kind::Retryable, kind);
    let source = Failed { op, source: e };
    match k {
        Kind::Outage => Error::broker_unavailable("kafka", source),
        Kind::Retryable => Error::broker("kafka", source, true),
        Kind::Permanent => Error::broker("kafka", source, false),
    }
}

/// A topic the broker did not create.
pub(crate) fn create_topic(topic: &str, code: RDKafkaErrorCode) -> Error {
    let reason = format!("Kafka refused to create topic `{topic}`: {code}");
    match kind(code) {
        Kind::Outage => Error::broker_unavailable("kafka", reason),
        Kind::Retryable => Error::broker("kafka", reason, true),
        Kind::Permanent => Error::broker("kafka", reason, false),
    }
}

/// A client that could not be made from its configuration: permanent.
pub(crate) fn config(e: KafkaError) -> Error {
    Error::broker(
        "kafka",
        Failed {
            op: "client configuration",
            source: e,
        },
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_down_is_an_outage_and_a_large_record_permanent() {
        let down = from_kafka(
            "publish",
            KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut),
        );
        assert!(down.is_retryable() && down.is_outage(), "{down:?}");
        let large = from_kafka(
            "publish",
            KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge),
        );
        assert!(!large.is_retryable() && !large.is_outage(), "{large:?}");
        let leader = from_kafka(
            "publish",
            KafkaError::MessageProduction(RDKafkaErrorCode::NotLeaderForPartition),
        );
        assert!(leader.is_retryable() && !leader.is_outage(), "{leader:?}");
    }
}

//! The RocketMQ client's errors as idem's [`Error`]: an outage, retryable
//! or permanent.

use idem_core::Error;
use rocketmq_client_rust::ClientError;
use std::fmt;

/// A client error with the operation that failed.
#[derive(Debug)]
struct Failed {
    op: &'static str,
    source: ClientError,
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RocketMQ {} failed: {}", self.op, self.source)
    }
}

impl std::error::Error for Failed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Broker response codes that no retry changes: the message is refused
/// for what it is (`MESSAGE_ILLEGAL` 13, `NO_PERMISSION` 16,
/// `TOPIC_NOT_EXIST` is 17 but a topic can be created, so retryable).
const PERMANENT: [i32; 2] = [13, 16];

/// An error the broker answered is retryable (or permanent for the codes
/// above); one it did not answer (no connection, no route from the name
/// server, a time-out) is an outage, which the outbox relay and the
/// consumer do not count as an attempt.
pub(crate) fn from_client(op: &'static str, e: ClientError) -> Error {
    let code = e.broker_response_code();
    let source = Failed { op, source: e };
    match code {
        Some(c) if PERMANENT.contains(&c) => Error::broker("rocketmq", source, false),
        Some(_) => Error::broker("rocketmq", source, true),
        None => Error::broker_unavailable("rocketmq", source),
    }
}

/// A send the broker answered without storing the message (`SendStatus`
/// other than `SendOk`): retryable.
pub(crate) fn not_stored(status: impl fmt::Debug) -> Error {
    Error::broker(
        "rocketmq",
        format!("the broker did not store the message: {status:?}"),
        true,
    )
}

/// The client refused its configuration or could not start.
pub(crate) fn config(op: &'static str, e: ClientError) -> Error {
    Error::Config {
        reason: Failed { op, source: e }.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_answer_is_an_outage_an_answer_is_counted() {
        let down = from_client("send", ClientError::timeout("send", 3000));
        assert!(down.is_retryable() && down.is_outage(), "{down:?}");
        let refused = from_client(
            "send",
            ClientError::broker_operation_failed("SEND", 13, "illegal"),
        );
        assert!(
            !refused.is_retryable() && !refused.is_outage(),
            "{refused:?}"
        );
        let busy = from_client(
            "send",
            ClientError::broker_operation_failed("SEND", 2, "busy"),
        );
        assert!(busy.is_retryable() && !busy.is_outage(), "{busy:?}");
    }
}

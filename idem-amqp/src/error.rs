//! lapin's errors as idem's [`Error`]: retryable or permanent.

use idem_core::Error;
use lapin::ErrorKind;
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use std::fmt;

/// A failed AMQP operation, as the source of an [`Error`].
#[derive(Debug)]
struct AmqpError {
    op: &'static str,
    source: lapin::Error,
}

impl fmt::Display for AmqpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AMQP {} failed: {}", self.op, self.source)
    }
}

impl std::error::Error for AmqpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Maps a lapin error to idem's [`Error`]: retryable when the connection
/// or channel failed (I/O, missed heartbeats, closed channel, broker
/// shutdown, a missing queue or exchange that a deployment may still
/// create), permanent when retrying cannot help (access refused,
/// `PRECONDITION_FAILED` — a declaration with other arguments —, message
/// too large, protocol or authentication errors).
///
/// The connection-level failures are an outage
/// ([`Error::broker_unavailable`]: the outbox relay does not count the
/// attempt): an I/O error (refused, reset, broken pipe), missed
/// heartbeats, an operation on a connection or channel that is no longer
/// open, the broker's `CONNECTION_FORCED` (it is shutting down). A
/// channel-level refusal (a missing queue or exchange, a nack) is not.
pub(crate) fn from_lapin(op: &'static str, e: lapin::Error) -> Error {
    let permanent = match e.kind() {
        ErrorKind::ProtocolError(p) => match p.kind() {
            AMQPErrorKind::Soft(s) => matches!(
                s,
                AMQPSoftError::ACCESSREFUSED
                    | AMQPSoftError::PRECONDITIONFAILED
                    | AMQPSoftError::CONTENTTOOLARGE
            ),
            AMQPErrorKind::Hard(h) => matches!(
                h,
                AMQPHardError::INVALIDPATH
                    | AMQPHardError::SYNTAXERROR
                    | AMQPHardError::COMMANDINVALID
                    | AMQPHardError::NOTALLOWED
                    | AMQPHardError::NOTIMPLEMENTED
            ),
        },
        ErrorKind::InvalidProtocolVersion(_)
        | ErrorKind::ParsingError(_)
        | ErrorKind::SerialisationError(_)
        | ErrorKind::AuthProviderError(_)
        | ErrorKind::NoDefaultRuntime
        | ErrorKind::FutureCompleted => true,
        _ => false,
    };
    let down = match e.kind() {
        ErrorKind::IOError(_)
        | ErrorKind::RuntimeShutdownError(_)
        | ErrorKind::InvalidConnectionState(_)
        | ErrorKind::InvalidChannelState(..)
        | ErrorKind::InvalidChannel(_)
        | ErrorKind::MissingHeartbeatError => true,
        ErrorKind::ProtocolError(p) => matches!(
            p.kind(),
            AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED)
        ),
        _ => false,
    };
    let err = AmqpError { op, source: e };
    match down {
        true => Error::broker_unavailable("amqp", err),
        false => Error::broker("amqp", err, !permanent),
    }
}

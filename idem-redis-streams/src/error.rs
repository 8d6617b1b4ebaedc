//! Redis errors as idem's [`Error`]: an outage, retryable or permanent.

use idem_core::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};
use std::fmt;

/// A failed Redis operation, as the source of an [`Error`].
#[derive(Debug)]
struct RedisOpError {
    op: &'static str,
    source: RedisError,
}

impl fmt::Display for RedisOpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redis {} failed: {}", self.op, self.source)
    }
}

impl std::error::Error for RedisOpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Whether `e` says that Redis could not be reached or did not answer:
/// a refused or dropped connection, a time-out, an I/O error, or a server
/// still loading its data after a restart (`LOADING`), a replica that
/// lost its primary (`MASTERDOWN`), a cluster reconfiguring.
pub(super) fn is_down(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
            )
        )
}

/// Whether `e` is Redis's `NOGROUP` (the stream or its consumer group
/// does not exist: never created, deleted, or lost with a Redis that
/// kept nothing on disk).
pub(super) fn is_no_group(e: &RedisError) -> bool {
    e.code() == Some("NOGROUP")
}

/// `e` as an [`Error`]: an [outage](Error::is_outage) when Redis is down
/// ([`Error::broker_unavailable`], which the outbox relay does not count
/// against `max_attempts`), retryable for a read-only replica, permanent
/// for what retrying cannot change (a key of another type, a command
/// refused).
pub(super) fn from_redis(op: &'static str, e: RedisError) -> Error {
    let retryable = matches!(e.kind(), ErrorKind::Server(ServerErrorKind::ReadOnly));
    let down = is_down(&e);
    let wrapped = RedisOpError { op, source: e };
    if down {
        Error::broker_unavailable("redis", wrapped)
    } else {
        Error::broker("redis", wrapped, retryable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_outages_and_refusals() {
        let io = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        let e = from_redis("XADD", io);
        assert!(e.is_retryable() && e.is_outage(), "{e}");
        let wrong: RedisError = (ErrorKind::UnexpectedReturnType, "not a stream").into();
        let e = from_redis("XADD", wrong);
        assert!(!e.is_retryable() && !e.is_outage(), "{e}");
        assert!(format!("{e:#}").contains("XADD"), "{e:#}");
    }
}

//! The haproxy in front of the pair.

/// haproxy in TCP mode: the primary, then the standby as the backup.
///
/// `retries 0`: a connection the dead primary refuses fails at once, and
/// the client retries on its own; haproxy's own retries wait a turn-around
/// of `min(timeout connect, 1 s)` each and stay on the dead server (its
/// backup takes only new connections once it is marked down), so with
/// them every client stalls a second or two in its connect.
pub(super) fn haproxy_config(port: u16, primary: u16, standby: u16) -> String {
    format!(
        "global\n\
         \x20   maxconn 512\n\
         defaults\n\
         \x20   mode tcp\n\
         \x20   timeout connect 1s\n\
         \x20   timeout client 1h\n\
         \x20   timeout server 1h\n\
         \x20   retries 0\n\
         listen postgres\n\
         \x20   bind 127.0.0.1:{port}\n\
         \x20   default-server inter 200ms fall 2 rise 1 on-marked-down shutdown-sessions\n\
         \x20   server primary 127.0.0.1:{primary} check\n\
         \x20   server standby 127.0.0.1:{standby} check backup\n"
    )
}

//! The haproxy in front of the members.

/// haproxy in TCP mode over every member, each checked by asking its
/// Patroni for the role: `GET /primary` answers 200 only on the member
/// that holds the leader lock and runs as the primary, so exactly one
/// server is up, and none while the cluster has no leader. A frozen
/// member's API does not answer (`timeout check`): marked down after
/// `fall 2`, its sessions shut (`on-marked-down shutdown-sessions`) so
/// that no client waits on it.
///
/// `retries 0`: a connection the dead server refuses fails at once and
/// the client retries on its own (as in `pg_standby`'s haproxy).
pub(super) fn haproxy_config(port: u16, members: &[(String, u16, u16)]) -> String {
    let mut cfg = format!(
        "global\n\
         \x20   maxconn 512\n\
         defaults\n\
         \x20   mode tcp\n\
         \x20   timeout connect 1s\n\
         \x20   timeout client 1h\n\
         \x20   timeout server 1h\n\
         \x20   timeout check 1s\n\
         \x20   retries 0\n\
         listen postgres\n\
         \x20   bind 127.0.0.1:{port}\n\
         \x20   option httpchk GET /primary\n\
         \x20   http-check expect status 200\n\
         \x20   default-server inter 200ms fall 2 rise 1 on-marked-down shutdown-sessions\n"
    );
    for (name, pg, rest) in members {
        cfg.push_str(&format!(
            "\x20   server {name} 127.0.0.1:{pg} check port {rest}\n"
        ));
    }
    cfg
}

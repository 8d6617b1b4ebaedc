//! A member's `patroni.yml`.

use super::{BIN, LOOP_WAIT, Mode, RETRY_TIMEOUT, TTL};
use std::path::Path;

/// What one member's configuration needs.
#[derive(Debug)]
pub(super) struct Member<'a> {
    pub(super) scope: &'a str,
    pub(super) name: &'a str,
    pub(super) pg_port: u16,
    pub(super) rest_port: u16,
    pub(super) etcd_port: u16,
    pub(super) data: &'a Path,
    /// The scratch directory: sockets and `pgpass` files.
    pub(super) dir: &'a Path,
    /// The mode the cluster is bootstrapped in (the first member to
    /// bootstrap writes `bootstrap.dcs` to etcd; later changes go through
    /// `PATCH /config`).
    pub(super) mode: Mode,
}

/// The YAML of `m` (Patroni 3.0): etcd's v2 API (`etcd:`, see the
/// [module](super) for why not `etcd3:`), `bootstrap.dcs`
/// with the short timings and the replication mode, `pg_rewind` to
/// rejoin a demoted or crashed primary, trust authentication on
/// 127.0.0.1. PostgreSQL's own settings: `fsync=off` (a SIGKILL loses
/// nothing the kernel has; the standbys' copies are what counts),
/// `wal_log_hints` (for `pg_rewind`), small buffers, and
/// `wal_retrieve_retry_interval=200ms` so that a standby re-points to a
/// new leader in a fraction of a second instead of 5 s (until then the
/// new leader has no synchronous standby).
pub(super) fn patroni_yml(m: &Member<'_>) -> String {
    let (sync, strict) = match m.mode {
        Mode::Asynchronous => (false, false),
        Mode::Synchronous => (true, false),
        Mode::SynchronousStrict => (true, true),
    };
    let Member {
        scope,
        name,
        pg_port,
        rest_port,
        etcd_port,
        ..
    } = *m;
    let data = m.data.display();
    let dir = m.dir.display();
    format!(
        "scope: {scope}
name: {name}
log:
  level: INFO
restapi:
  listen: 127.0.0.1:{rest_port}
  connect_address: 127.0.0.1:{rest_port}
etcd:
  hosts: 127.0.0.1:{etcd_port}
bootstrap:
  dcs:
    ttl: {TTL}
    loop_wait: {LOOP_WAIT}
    retry_timeout: {RETRY_TIMEOUT}
    maximum_lag_on_failover: 1048576
    synchronous_mode: {sync}
    synchronous_mode_strict: {strict}
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: 'on'
        wal_log_hints: 'on'
        max_wal_senders: 10
        max_replication_slots: 10
        max_connections: 100
        fsync: 'off'
        shared_buffers: 16MB
        wal_keep_size: 64MB
        wal_retrieve_retry_interval: 200ms
  initdb:
    - encoding: UTF8
    - no-sync
postgresql:
  listen: 127.0.0.1:{pg_port}
  connect_address: 127.0.0.1:{pg_port}
  data_dir: {data}
  bin_dir: {BIN}
  pgpass: {dir}/{name}.pgpass
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: {dir}
    log_min_messages: warning
    log_line_prefix: '%m [%p] %a '
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
  basebackup:
    - checkpoint: fast
"
    )
}

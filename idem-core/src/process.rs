//! The processes alive: each spawned relay (and whatever else starts a
//! [`Heartbeat`]) keeps a row of `idem_process` (schema version 4) fresh,
//! so that an operator sees which relays and consumers run, where, and
//! since when, and tells a stuck or dead one by its old `heartbeat_at`.
//!
//! A heartbeat writes its row when it starts (`started_at` and
//! `heartbeat_at` the database's now), refreshes `heartbeat_at` every
//! interval, and deletes the row when it is stopped. It never stops what
//! it serves: a failing write is logged once when the writes start failing
//! and once when they succeed again ([`FailureLog`]), and tried again at
//! the next interval; a row deleted meanwhile (an operator's clean-up) is
//! written again. A process that dies leaves its row behind, with a
//! `heartbeat_at` that stops moving.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
//! # idem_runtime::migrate(&pool).await?;
//! use idem_runtime::process::Heartbeat;
//! use std::time::Duration;
//! let beat = Heartbeat::builder("worker-7", "consumer", "orders")
//!     .interval(Duration::from_millis(50))
//!     .start(pool.clone());
//! // … the consumer runs; its row is written at once …
//! let row = "SELECT COUNT(*) FROM idem_process WHERE id = 'worker-7' AND kind = 'consumer'";
//! while sqlx::query_scalar::<_, i64>(row).fetch_one(&pool).await? == 0 {
//!     tokio::time::sleep(Duration::from_millis(5)).await;
//! }
//! assert!(beat.stop().await?, "its row is deleted");
//! assert_eq!(sqlx::query_scalar::<_, i64>(row).fetch_one(&pool).await?, 0);
//! # Ok(()) }
//! ```

use crate::backend::{Backend, ProcessRow};
use crate::backoff::{Backoff, FailureLog};
use sqlx::Pool;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often a heartbeat refreshes its row by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

/// The shortest interval a heartbeat writes at (a shorter one is raised
/// to it).
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// The longest process id kept (`idem_process.id`); a longer one is cut.
pub const MAX_ID_LEN: usize = 64;

/// The longest kind kept (`idem_process.kind`); a longer one is cut.
pub const MAX_KIND_LEN: usize = 16;

/// The longest name kept (`idem_process.name`); a longer one is cut.
pub const MAX_NAME_LEN: usize = 256;

/// The longest hostname kept (`idem_process.host`); a longer one is cut.
pub const MAX_HOST_LEN: usize = 128;

/// How long a heartbeat stopped by a drop tries to delete its row.
const DROP_DELETE_WITHIN: Duration = Duration::from_secs(5);

/// What a heartbeat writes: its row's description.
#[derive(Debug, Clone)]
struct Row {
    id: String,
    kind: String,
    name: String,
    host: Option<String>,
    pid: i64,
}

impl Row {
    fn as_row(&self) -> ProcessRow<'_> {
        ProcessRow {
            id: &self.id,
            kind: &self.kind,
            name: &self.name,
            host: self.host.as_deref(),
            pid: self.pid,
        }
    }
}

/// A [`Heartbeat`] to start: its row's description and its interval.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until started"]
pub struct HeartbeatBuilder {
    row: Row,
    interval: Duration,
}

impl HeartbeatBuilder {
    /// How often the row's `heartbeat_at` is refreshed (default
    /// [`DEFAULT_INTERVAL`], at least [`MIN_INTERVAL`]).
    pub fn interval(mut self, every: Duration) -> Self {
        self.interval = every.max(MIN_INTERVAL);
        self
    }

    /// The hostname written (default: the machine's, see [`hostname`]).
    pub fn host(mut self, host: Option<&str>) -> Self {
        self.row.host = host.map(|h| cut(h, MAX_HOST_LEN));
        self
    }

    /// Starts the heartbeat on `pool` as a tokio task: its row is written
    /// at once, then refreshed every interval until [`Heartbeat::stop`].
    pub fn start<DB: Backend>(self, pool: Pool<DB>) -> Heartbeat {
        let (stop, stopped) = watch::channel(false);
        let id = self.row.id.clone();
        let task = tokio::spawn(beat(pool, self.row, self.interval, stopped));
        Heartbeat {
            id,
            stop,
            task: Some(task),
        }
    }
}

/// A process's row in `idem_process`, kept fresh by a task of its own
/// (see the [module documentation](self)). Stop it with
/// [`stop`](Heartbeat::stop), which deletes the row; dropped, it stops
/// too, deleting its row in the background (best effort).
#[derive(Debug)]
pub struct Heartbeat {
    id: String,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<Result<bool, sqlx::Error>>>,
}

impl Heartbeat {
    /// A heartbeat for the process `id` (a relay's owner, a consumer's
    /// id) of `kind` (`relay`, `consumer`) serving `name` (its topics
    /// joined with `,`, its queue). Each is cut to its column's length
    /// ([`MAX_ID_LEN`], [`MAX_KIND_LEN`], [`MAX_NAME_LEN`] characters);
    /// the host is the machine's ([`hostname`]) and the pid this
    /// process's.
    pub fn builder(
        id: impl Into<String>,
        kind: impl Into<String>,
        name: impl Into<String>,
    ) -> HeartbeatBuilder {
        HeartbeatBuilder {
            row: Row {
                id: cut(&id.into(), MAX_ID_LEN),
                kind: cut(&kind.into(), MAX_KIND_LEN),
                name: cut(&name.into(), MAX_NAME_LEN),
                host: hostname().map(|h| cut(h, MAX_HOST_LEN)),
                pid: i64::from(std::process::id()),
            },
            interval: DEFAULT_INTERVAL,
        }
    }

    /// The row's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Stops the heartbeat and deletes its row; `Ok(true)` if a row was
    /// deleted, the database's error if the delete failed (the row is
    /// then left, its `heartbeat_at` no longer moving).
    pub async fn stop(mut self) -> Result<bool, sqlx::Error> {
        let _ = self.stop.send(true);
        let Some(task) = self.task.take() else {
            return Ok(false);
        };
        match task.await {
            Ok(deleted) => deleted,
            Err(e) => Err(sqlx::Error::Protocol(format!(
                "the heartbeat task of process `{}` ended abnormally: {e}",
                self.id
            ))),
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        // The task sees the stop and deletes the row on its own, within
        // `DROP_DELETE_WITHIN`.
        let _ = self.stop.send(true);
    }
}

/// The heartbeat's task: writes the row, then every `every` until `stop`;
/// then deletes it.
async fn beat<DB: Backend>(
    pool: Pool<DB>,
    row: Row,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) -> Result<bool, sqlx::Error> {
    let mut health = FailureLog::new("process heartbeats", Backoff::new(every, every));
    let written = row.as_row();
    loop {
        if *stop.borrow() {
            break;
        }
        // A write stopped half-way is finished first (for at most
        // `DROP_DELETE_WITHIN`), never dropped: dropped, its statement
        // could still land after the delete below and leave a row no
        // process refreshes.
        let beat = DB::process_beat(&pool, &written);
        tokio::pin!(beat);
        let done = tokio::select! {
            done = &mut beat => done,
            _ = stop.changed() => {
                let _ = tokio::time::timeout(DROP_DELETE_WITHIN, beat).await;
                break;
            }
        };
        match done {
            Ok(()) => health.succeeded(),
            Err(e) => health.failed(&format_args!("{e:#} (process `{}`)", row.id)),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => break,
        }
    }
    let deleted = tokio::time::timeout(DROP_DELETE_WITHIN, DB::process_end(&pool, &row.id)).await;
    let deleted = deleted.unwrap_or_else(|_| {
        Err(sqlx::Error::Protocol(format!(
            "deleting the row of process `{}` took over {DROP_DELETE_WITHIN:?}",
            row.id
        )))
    });
    if let Err(e) = &deleted {
        tracing::warn!(process = %row.id, error = %format_args!("{e:#}"), "could not delete the process's row in idem_process; it stays, its heartbeat_at no longer moving");
    }
    deleted
}

/// The machine's hostname, read once (Linux: `/proc/sys/kernel/hostname`,
/// else `/etc/hostname`; the `HOSTNAME` or `COMPUTERNAME` variable
/// elsewhere); `None` when none of them tells.
pub fn hostname() -> Option<&'static str> {
    static HOST: OnceLock<Option<String>> = OnceLock::new();
    HOST.get_or_init(|| {
        let files = ["/proc/sys/kernel/hostname", "/etc/hostname"];
        let from_file = files
            .iter()
            .filter_map(|f| std::fs::read_to_string(f).ok())
            .map(|s| s.trim().to_string())
            .find(|s| !s.is_empty());
        from_file.or_else(|| {
            ["HOSTNAME", "COMPUTERNAME"]
                .iter()
                .filter_map(|v| std::env::var(v).ok())
                .map(|s| s.trim().to_string())
                .find(|s| !s.is_empty())
        })
    })
    .as_deref()
}

/// `s`, cut to its first `max` characters.
fn cut(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_are_cut_to_their_columns() {
        let b = Heartbeat::builder("i".repeat(70), "relay", "é".repeat(300));
        assert_eq!(b.row.id.chars().count(), MAX_ID_LEN);
        assert_eq!(b.row.name.chars().count(), MAX_NAME_LEN);
        assert_eq!(b.row.kind, "relay");
        assert_eq!(b.row.pid, i64::from(std::process::id()));
        let b = b.host(Some(&"h".repeat(200))).interval(Duration::ZERO);
        assert_eq!(b.row.host.as_deref().map(str::len), Some(MAX_HOST_LEN));
        assert_eq!(b.interval, MIN_INTERVAL);
    }
}

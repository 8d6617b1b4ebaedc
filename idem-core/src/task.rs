//! What the runtime's background tasks share: one handle design (a stop
//! signal and the task, stopped by [`TaskHandle::shutdown`], by a
//! deadline ([`TaskHandle::shutdown_within`]), by a future of the caller's
//! ([`TaskHandle::stop_on`]) or by dropping the handle), how a task ended
//! ([`TaskStatus`]), and one boxed future type.
//!
//! [`RelayHandle`](crate::outbox::RelayHandle),
//! `idem_runtime::archive::ArchiverHandle` and the brokers'
//! [`ConsumerHandle`](crate::consume::ConsumerHandle) each wrap a
//! [`TaskHandle`] and add their counters.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::{JoinError, JoinHandle};

/// A boxed, sendable future: what routes and handlers are stored as.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Where a background task stands (see [`TaskHandle::status`], and the
/// relay's, consumers' and archiver's `status()`): for a readiness probe,
/// [`is_running`](Self::is_running).
///
/// ```
/// use idem_runtime::task::TaskStatus;
/// assert!(TaskStatus::Running.is_running());
/// let dead = TaskStatus::Panicked("boom".into());
/// assert!(dead.is_finished() && !dead.is_running());
/// assert_eq!(dead.to_string(), "panicked: boom");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TaskStatus {
    /// Running, and not asked to stop.
    Running,
    /// Asked to stop (a shutdown, its stop future, a dropped handle), and
    /// finishing what it has in flight.
    Stopping,
    /// Ended after it was asked to stop.
    Stopped,
    /// Ended on its own, without an error and without being asked to stop
    /// (for example a consumer whose subscription the broker ended).
    Exited,
    /// Ended on its own with an error: its message (for example a relay
    /// started on a database without idem's tables).
    Failed(String),
    /// Its task panicked: the panic's message.
    Panicked(String),
    /// Cancelled before it ended: at a shutdown's deadline, or its tokio
    /// runtime shut down.
    Aborted,
}

impl TaskStatus {
    /// Running and not asked to stop: what a readiness probe wants.
    pub fn is_running(&self) -> bool {
        matches!(self, TaskStatus::Running)
    }

    /// Whether the task has ended (whatever the reason).
    pub fn is_finished(&self) -> bool {
        !matches!(self, TaskStatus::Running | TaskStatus::Stopping)
    }

    /// Whether the task ended by a failure or a panic.
    pub fn is_failure(&self) -> bool {
        matches!(self, TaskStatus::Failed(_) | TaskStatus::Panicked(_))
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskStatus::Running => f.write_str("running"),
            TaskStatus::Stopping => f.write_str("stopping"),
            TaskStatus::Stopped => f.write_str("stopped"),
            TaskStatus::Exited => f.write_str("exited"),
            TaskStatus::Failed(e) => write!(f, "failed: {e}"),
            TaskStatus::Panicked(p) => write!(f, "panicked: {p}"),
            TaskStatus::Aborted => f.write_str("aborted"),
        }
    }
}

/// Why a background task did not stop cleanly: what a handle's
/// `shutdown_within` returns when the task had died before (or while)
/// stopping.
#[derive(Debug)]
#[non_exhaustive]
pub enum TaskError {
    /// The task ended with this error (see [`TaskStatus::Failed`]).
    Failed(crate::Error),
    /// The task panicked: the panic's message.
    Panicked(String),
}

impl TaskError {
    /// The error of a task that did not return: its panic's message.
    pub fn from_join(e: JoinError) -> Self {
        match e.try_into_panic() {
            Ok(panic) => TaskError::Panicked(panic_message(&*panic).to_owned()),
            Err(e) => TaskError::Panicked(e.to_string()),
        }
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskError::Failed(e) => write!(f, "the task failed: {e}"),
            TaskError::Panicked(p) => write!(f, "the task panicked: {p}"),
        }
    }
}

impl std::error::Error for TaskError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TaskError::Failed(e) => Some(e),
            TaskError::Panicked(_) => None,
        }
    }
}

/// What a task returns, read for its [`TaskStatus`]: `()`, or a `Result`
/// whose error is a failure ([`TaskStatus::Failed`]).
pub trait TaskOutput: Send + 'static {
    /// The error the task ended with, as text; `None` when it did not fail.
    fn failure(&self) -> Option<String>;
}

impl TaskOutput for () {
    fn failure(&self) -> Option<String> {
        None
    }
}

impl<T: Send + 'static, E: fmt::Display + Send + 'static> TaskOutput for Result<T, E> {
    fn failure(&self) -> Option<String> {
        self.as_ref().err().map(|e| e.to_string())
    }
}

/// A background task with its stop signal. Dropping the handle stops the
/// task as [`shutdown`](Self::shutdown) does, without waiting.
#[must_use = "dropping the handle stops the task"]
pub struct TaskHandle<T> {
    /// `true` once asked to stop; dropped with the handle (which the task
    /// sees as a stop too). Shared weakly with [`stop_on`](Self::stop_on)'s
    /// watcher, which must not keep the task alive.
    stop: Arc<watch::Sender<bool>>,
    task: JoinHandle<T>,
    /// How the task ended, once it has.
    ended: watch::Receiver<Option<TaskStatus>>,
}

impl<T: TaskOutput> TaskHandle<T> {
    /// Spawns `run(stop)` on the current tokio runtime. The task watches
    /// `stop`: it turns `true` on shutdown, and its sender is gone once the
    /// handle is dropped; either way the task winds down. How it ended
    /// (returned, failed, panicked) is kept for [`status`](Self::status);
    /// a panic still reaches [`shutdown`](Self::shutdown) as a
    /// [`JoinError`].
    pub fn spawn<F, Fut>(run: F) -> Self
    where
        F: FnOnce(watch::Receiver<bool>) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
    {
        let (stop, stopped) = watch::channel(false);
        let (ended_tx, ended) = watch::channel(None);
        let asked = stopped.clone();
        let fut = run(stopped);
        let task = tokio::spawn(async move {
            let mut fut = std::pin::pin!(fut);
            let caught = std::future::poll_fn(|cx| {
                match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
                    Ok(Poll::Pending) => Poll::Pending,
                    Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
                    Err(panic) => Poll::Ready(Err(panic)),
                }
            })
            .await;
            match caught {
                Ok(out) => {
                    let status = match out.failure() {
                        Some(e) => TaskStatus::Failed(e),
                        // A dropped handle asked it to stop too.
                        None if *asked.borrow() || asked.has_changed().is_err() => {
                            TaskStatus::Stopped
                        }
                        None => TaskStatus::Exited,
                    };
                    let _ = ended_tx.send(Some(status));
                    out
                }
                Err(panic) => {
                    let message = panic_message(&*panic).to_owned();
                    let _ = ended_tx.send(Some(TaskStatus::Panicked(message)));
                    std::panic::resume_unwind(panic)
                }
            }
        });
        TaskHandle {
            stop: Arc::new(stop),
            task,
            ended,
        }
    }
}

impl<T> TaskHandle<T> {
    /// Signals the task to stop and waits for it: its result, or the
    /// reason it did not finish (it panicked).
    pub async fn shutdown(self) -> Result<T, JoinError> {
        self.stop();
        self.task.await
    }

    /// Signals the task to stop and waits for it at most `within`; then
    /// aborts it (dropping what it has in flight). `Ok(Some(_))`: its
    /// result; `Ok(None)`: aborted at the deadline; `Err`: it panicked.
    pub async fn shutdown_within(mut self, within: Duration) -> Result<Option<T>, TaskError> {
        self.stop();
        let joined = match tokio::time::timeout(within, &mut self.task).await {
            Ok(joined) => joined,
            Err(_) => {
                self.task.abort();
                match (&mut self.task).await {
                    Err(e) if e.is_cancelled() => return Ok(None),
                    joined => joined,
                }
            }
        };
        joined.map(Some).map_err(TaskError::from_join)
    }

    /// Asks the task to stop, without waiting for it (see
    /// [`shutdown`](Self::shutdown), which waits).
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Asks the task to stop once `signal` completes (its output is
    /// ignored): a `CancellationToken`'s `cancelled_owned()`,
    /// `tokio::signal::ctrl_c()`, a `oneshot::Receiver`… The signal is
    /// awaited in a small task of its own, which ends with the task, or
    /// when the handle is dropped or shut down.
    pub fn stop_on<S>(&self, signal: S)
    where
        S: Future + Send + 'static,
    {
        let stop = Arc::downgrade(&self.stop);
        let mut asked = self.stop.subscribe();
        let mut ended = self.ended.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = signal => {
                    if let Some(stop) = stop.upgrade() {
                        stop.send_replace(true);
                    }
                }
                // Asked already, or the handle is gone (`Err`).
                _ = asked.wait_for(|asked| *asked) => {}
                _ = ended.wait_for(Option::is_some) => {}
            }
        });
    }

    /// Whether the task has stopped.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Where the task stands: running, stopping, or how it ended. Does not
    /// consume the handle: a readiness probe calls it as often as it likes.
    pub fn status(&self) -> TaskStatus {
        if let Some(ended) = self.ended.borrow().clone() {
            return ended;
        }
        match (self.task.is_finished(), *self.stop.borrow()) {
            // Ended without a word: cancelled (its runtime shut down).
            (true, _) => TaskStatus::Aborted,
            (false, true) => TaskStatus::Stopping,
            (false, false) => TaskStatus::Running,
        }
    }

    /// Waits until the task has ended, without asking it to stop (with
    /// [`stop_on`](Self::stop_on), until its signal stopped it).
    pub async fn finished(&self) {
        let mut ended = self.ended.clone();
        // `Err`: the task is gone without a word (aborted).
        let _ = ended.wait_for(Option::is_some).await;
    }
}

/// The message of a panic's payload (`panic!` gives a `&str` or a
/// `String`).
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic payload that is not a string")
}

impl<T> fmt::Debug for TaskHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskHandle")
            .field("stopping", &*self.stop.borrow())
            .field("finished", &self.task.is_finished())
            .field("status", &self.status())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::{TaskError, TaskHandle, TaskStatus};
    use std::convert::Infallible;
    use std::time::Duration;

    async fn until_stopped(
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<u32, Infallible> {
        while !*stop.borrow() {
            if stop.changed().await.is_err() {
                return Ok(0);
            }
        }
        Ok(7)
    }

    #[tokio::test]
    async fn shutdown_stops_and_returns_the_result() {
        let h = TaskHandle::spawn(until_stopped);
        assert!(!h.is_finished());
        assert_eq!(h.status(), TaskStatus::Running);
        assert!(format!("{h:?}").contains("finished: false"));
        assert_eq!(h.shutdown().await.unwrap(), Ok(7));
    }

    #[tokio::test]
    async fn dropping_the_handle_stops_the_task() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let h = TaskHandle::spawn(|stop| async move {
            let n = until_stopped(stop).await;
            let _ = tx.send(n);
        });
        drop(h);
        let n = tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .unwrap();
        assert_eq!(n.unwrap(), Ok(0));
    }

    #[tokio::test]
    async fn a_panic_is_a_join_error_and_a_status() {
        let h = TaskHandle::spawn(|_stop| async {
            if true {
                panic!("boom");
            }
        });
        h.finished().await;
        assert_eq!(h.status(), TaskStatus::Panicked("boom".into()));
        assert!(h.is_finished());
        assert!(h.shutdown().await.unwrap_err().is_panic());
    }

    #[tokio::test]
    async fn a_failure_is_a_status() {
        let h = TaskHandle::spawn(|_stop| async { Err::<(), _>("no tables") });
        h.finished().await;
        assert_eq!(h.status(), TaskStatus::Failed("no tables".into()));
        assert!(h.status().is_failure());
        assert_eq!(h.shutdown().await.unwrap(), Err("no tables"));
    }

    #[tokio::test]
    async fn a_task_that_returns_unasked_exited() {
        let h = TaskHandle::spawn(|_stop| async {});
        h.finished().await;
        assert_eq!(h.status(), TaskStatus::Exited);
    }

    #[tokio::test]
    async fn stop_on_a_signal_stops_the_task() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let h = TaskHandle::spawn(until_stopped);
        h.stop_on(rx);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(h.status(), TaskStatus::Running);
        tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), h.finished())
            .await
            .unwrap();
        assert_eq!(h.status(), TaskStatus::Stopped);
        assert_eq!(h.shutdown().await.unwrap(), Ok(7));
    }

    #[tokio::test]
    async fn shutdown_within_aborts_a_task_past_its_deadline() {
        let h = TaskHandle::spawn(|_stop| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        let started = std::time::Instant::now();
        let ended = h.shutdown_within(Duration::from_millis(50)).await;
        assert!(matches!(ended, Ok(None)), "{ended:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let h = TaskHandle::spawn(until_stopped);
        let ended = h.shutdown_within(Duration::from_secs(5)).await;
        assert!(matches!(ended, Ok(Some(Ok(7)))), "{ended:?}");
        let h = TaskHandle::spawn(|_stop| async {
            if true {
                panic!("late");
            }
        });
        h.finished().await;
        let ended = h.shutdown_within(Duration::from_secs(5)).await;
        assert!(
            matches!(ended, Err(TaskError::Panicked(ref m)) if m == "late"),
            "{ended:?}"
        );
    }
}

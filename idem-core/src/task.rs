//! What the runtime's background tasks share: one handle design (a stop
//! signal and the task, stopped by [`TaskHandle::shutdown`] or by dropping
//! the handle) and one boxed future type.
//!
//! [`RelayHandle`](crate::outbox::RelayHandle),
//! `idem_runtime::archive::ArchiverHandle` and the brokers'
//! `ConsumerHandle` (`consume::ConsumerHandle`, features `amqp` and
//! `nats`) each wrap a [`TaskHandle`] and add their counters.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use tokio::sync::watch;
use tokio::task::{JoinError, JoinHandle};

/// A boxed, sendable future: what routes and handlers are stored as.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A background task with its stop signal. Dropping the handle stops the
/// task as [`shutdown`](Self::shutdown) does, without waiting for it.
#[must_use = "dropping the handle stops the task"]
pub struct TaskHandle<T> {
    stop: watch::Sender<bool>,
    task: JoinHandle<T>,
}

impl<T: Send + 'static> TaskHandle<T> {
    /// Spawns `run(stop)` on the current tokio runtime. The task watches
    /// `stop`: it turns `true` on shutdown, and its sender is gone once the
    /// handle is dropped; either way the task winds down.
    pub fn spawn<F, Fut>(run: F) -> Self
    where
        F: FnOnce(watch::Receiver<bool>) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
    {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(stopped));
        TaskHandle { stop, task }
    }
}

impl<T> TaskHandle<T> {
    /// Signals the task to stop and waits for it: its result, or the
    /// reason it did not finish (it panicked).
    pub async fn shutdown(self) -> Result<T, JoinError> {
        let _ = self.stop.send(true);
        self.task.await
    }

    /// Whether the task has stopped.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl<T> fmt::Debug for TaskHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskHandle")
            .field("stopping", &*self.stop.borrow())
            .field("finished", &self.task.is_finished())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::TaskHandle;
    use std::time::Duration;

    async fn until_stopped(mut stop: tokio::sync::watch::Receiver<bool>) -> u32 {
        while !*stop.borrow() {
            if stop.changed().await.is_err() {
                return 0;
            }
        }
        7
    }

    #[tokio::test]
    async fn shutdown_stops_and_returns_the_result() {
        let h = TaskHandle::spawn(until_stopped);
        assert!(!h.is_finished());
        assert!(format!("{h:?}").contains("finished: false"));
        assert_eq!(h.shutdown().await.unwrap(), 7);
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
        assert_eq!(n.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_panic_is_a_join_error() {
        let h = TaskHandle::spawn(|_stop| async {
            if true {
                panic!("boom");
            }
        });
        assert!(h.shutdown().await.unwrap_err().is_panic());
    }
}

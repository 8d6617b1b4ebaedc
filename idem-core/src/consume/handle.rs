//! The handle of a running broker consumer (AMQP, NATS), one for both.

use super::ConsumerStats;
use crate::Error;
use crate::process::Heartbeat;
use crate::task::{TaskError, TaskHandle, TaskStatus};
use std::any::Any;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A running consumer of `M`s: `amqp::ConsumerHandle` is the handle of an
/// AMQP consumer (of `amqp::Message`s), `nats::ConsumerHandle` of a NATS
/// one. Dropping it stops the consumer as
/// [`shutdown`](ConsumerHandle::shutdown) does, without waiting.
#[must_use = "dropping the handle stops the consumer"]
pub struct ConsumerHandle<M> {
    task: TaskHandle<Result<(), Error>>,
    running: Arc<dyn Running>,
    heartbeat: Option<Heartbeat>,
    message: PhantomData<fn() -> M>,
}

/// What a running consumer shares with its handle: its counters, what it
/// consumes, and (for the entry point's own accessors, see
/// [`ConsumerHandle::running`]) itself.
pub trait Running: Any + Send + Sync {
    /// Its counters.
    fn stats(&self) -> &Arc<ConsumerStats>;

    /// What it consumes, as fields of the handle's `Debug`.
    fn describe(&self, f: &mut fmt::DebugStruct<'_, '_>);
}

impl<M> ConsumerHandle<M> {
    /// The handle of `task`, the consumer that shares `running`.
    pub fn new(task: TaskHandle<Result<(), Error>>, running: Arc<dyn Running>) -> Self {
        ConsumerHandle {
            task,
            running,
            heartbeat: None,
            message: PhantomData,
        }
    }

    /// Shows the consumer among the processes alive (`idem_process`, the
    /// console's and `idem processes`' list) with `beat`'s row, which
    /// goes when the consumer is shut down (a dropped handle deletes it in
    /// the background). A consumer has no pool of its own: the heartbeat
    /// writes on the one it was started on.
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool, handle: idem_runtime::consume::ConsumerHandle<()>) {
    /// use idem_runtime::process::Heartbeat;
    /// let handle = handle.heartbeat(
    ///     Heartbeat::builder("orders-consumer-1", "consumer", "queue orders").start(pool),
    /// );
    /// # }
    /// ```
    pub fn heartbeat(mut self, beat: Heartbeat) -> Self {
        self.heartbeat = Some(beat);
        self
    }

    /// What the consumer shares, as the entry point that spawned it knows
    /// it (`S`: its own type, which the handle of its `M`s always holds).
    pub fn running<S: Running>(&self) -> &S {
        let running: &dyn Any = &*self.running;
        running
            .downcast_ref()
            .expect("a consumer's handle holds what its entry point spawned it with")
    }

    /// The consumer's counters (still readable after
    /// [`shutdown`](ConsumerHandle::shutdown), where they are final).
    pub fn stats(&self) -> Arc<ConsumerStats> {
        self.running.stats().clone()
    }

    /// Whether the consumer stopped (shut down, or its channel or
    /// connection failed).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Graceful shutdown: the consumer takes no new deliveries (AMQP: it
    /// cancels its subscription; NATS: it stops pulling), waits for the
    /// handlers in flight and their acknowledgements, and gives back what
    /// it took but did not start (AMQP: closing its channels, the broker
    /// requeues what was prefetched; NATS: nak'd, so the server hands them
    /// out again at once). The connection stays open. An error if the
    /// consumer had stopped because its channel or connection failed
    /// (AMQP), or its task panicked.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        let beat = self.heartbeat.take();
        let ended = self.task.shutdown().await;
        if let Some(beat) = beat {
            stop_beat(beat).await;
        }
        match ended {
            Ok(r) => r,
            Err(e) => Err(Error::retryable(format!("consumer task failed: {e}"))),
        }
    }

    /// [`shutdown`](Self::shutdown), waiting at most `deadline`; then the
    /// consumer's task is aborted. Nothing is lost by the abort: the
    /// messages it had taken and not acknowledged go back to the broker
    /// (AMQP: requeued when its channel closes; NATS: after their ack wait;
    /// Kafka, RocketMQ, Redis Streams: their offsets or entries are not
    /// committed), which delivers them again, and the `#[idempotent]`
    /// handler acts once whatever the deliveries. (A handler already
    /// running goes on in its own task to its end; its message is
    /// delivered again all the same.)
    ///
    /// An `Err` if the consumer had stopped by itself: its channel or
    /// connection failed ([`TaskError::Failed`]), or its task panicked.
    pub async fn shutdown_within(
        mut self,
        deadline: Duration,
    ) -> Result<ConsumerStopReport, TaskError> {
        let started = Instant::now();
        let stats = self.stats();
        let beat = self.heartbeat.take();
        let ended = self.task.shutdown_within(deadline).await;
        if let Some(beat) = beat {
            stop_beat(beat).await;
        }
        let ended = ended?;
        let abandoned = match ended {
            Some(Ok(())) => false,
            Some(Err(e)) => return Err(TaskError::Failed(e)),
            None => true,
        };
        Ok(ConsumerStopReport {
            elapsed: started.elapsed(),
            abandoned,
            stats,
        })
    }

    /// Stops the consumer gracefully (as [`shutdown`](Self::shutdown),
    /// without waiting) once `signal` completes: a `CancellationToken`'s
    /// `cancelled_owned()`, `tokio::signal::ctrl_c()`, a
    /// `oneshot::Receiver`… (its output is ignored).
    pub fn stop_on<S>(self, signal: S) -> Self
    where
        S: Future + Send + 'static,
    {
        self.task.stop_on(signal);
        self
    }

    /// Asks the consumer to stop, without waiting.
    pub fn stop(&self) {
        self.task.stop();
    }

    /// Where the consumer stands: running, stopping, stopped, or how it
    /// ended by itself (its channel or connection failed: failed, with the
    /// error; panicked, with the message). For a readiness probe:
    /// [`TaskStatus::is_running`].
    pub fn status(&self) -> TaskStatus {
        self.task.status()
    }

    /// Waits until the consumer's task has ended, without asking it to
    /// stop.
    pub async fn finished(&self) {
        self.task.finished().await;
    }
}

/// What a consumer's [`shutdown_within`](ConsumerHandle::shutdown_within)
/// did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConsumerStopReport {
    /// From the stop request to the consumer's end.
    pub elapsed: Duration,
    /// Whether the deadline passed and the consumer's task was aborted
    /// (what it had not acknowledged is delivered again by the broker).
    pub abandoned: bool,
    /// Its counters, final.
    pub stats: Arc<ConsumerStats>,
}

/// Deletes a consumer's heartbeat row: the consumer ended.
async fn stop_beat(beat: Heartbeat) {
    if let Err(e) = beat.stop().await {
        tracing::warn!(error = %e, "the consumer's heartbeat row could not be deleted");
    }
}

impl<M> fmt::Debug for ConsumerHandle<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ConsumerHandle");
        self.running.describe(&mut d);
        d.field("task", &self.task)
            .field("stats", self.running.stats())
            .finish()
    }
}

/// The methods an entry point's `ConsumerHandle` (a newtype over
/// [`ConsumerHandle`], field `.0`) forwards unchanged, written once: its
/// counters, `is_finished`, `shutdown_within`, `stop_on`, `stop`,
/// `status`, `finished` and `heartbeat`. Invoked inside the newtype's
/// `impl`, beside its own `shutdown` (whose documentation says what a
/// graceful stop does on its broker).
#[doc(hidden)]
#[macro_export]
macro_rules! __consumer_handle_methods {
    () => {
        /// The consumer's counters (final once it stopped).
        pub fn stats(&self) -> ::std::sync::Arc<$crate::consume::ConsumerStats> {
            self.0.stats()
        }

        /// Whether the consumer stopped.
        pub fn is_finished(&self) -> bool {
            self.0.is_finished()
        }

        /// Graceful shutdown waiting at most `deadline`, then the consumer's
        /// task aborted (what it had not acknowledged is delivered again): see
        /// [`consume::ConsumerHandle::shutdown_within`](idem_core::consume::ConsumerHandle::shutdown_within).
        pub async fn shutdown_within(
            self,
            deadline: ::std::time::Duration,
        ) -> ::std::result::Result<$crate::consume::ConsumerStopReport, $crate::task::TaskError> {
            self.0.shutdown_within(deadline).await
        }

        /// Stops the consumer gracefully once `signal` completes (a
        /// `CancellationToken`'s `cancelled_owned()`, `tokio::signal::ctrl_c()`…):
        /// see [`consume::ConsumerHandle::stop_on`](idem_core::consume::ConsumerHandle::stop_on).
        pub fn stop_on<S>(self, signal: S) -> Self
        where
            S: ::std::future::Future + Send + 'static,
        {
            Self(self.0.stop_on(signal))
        }

        /// Asks the consumer to stop, without waiting.
        pub fn stop(&self) {
            self.0.stop();
        }

        /// Where the consumer stands: running, stopping, stopped, or how it
        /// ended by itself (see [`idem_core::task::TaskStatus`]); for a
        /// readiness probe, `status().is_running()`.
        pub fn status(&self) -> $crate::task::TaskStatus {
            self.0.status()
        }

        /// Waits until the consumer's task has ended, without asking it to
        /// stop.
        pub async fn finished(&self) {
            self.0.finished().await;
        }

        /// Shows the consumer among the processes alive with `beat`'s row,
        /// deleted when the consumer is shut down: see
        /// [`consume::ConsumerHandle::heartbeat`](idem_core::consume::ConsumerHandle::heartbeat).
        pub fn heartbeat(self, beat: $crate::process::Heartbeat) -> Self {
            Self(self.0.heartbeat(beat))
        }
    };
}

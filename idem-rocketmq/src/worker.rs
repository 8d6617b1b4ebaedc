//! The running consumer: one task polling the consumer group's messages
//! and handing each to its queue's worker, one worker per queue running
//! its messages in offset order, each settled by the rules of the
//! [crate documentation](crate#settlement).

use super::message::Record;
use super::settle::Settling;
use super::shared::{Shared, sleep_unless_ending};
use idem_core::Error;
use idem_core::consume::{self, Counter, Failure};
use rocketmq_model::message::MessageQueue;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

/// One queue's worker, as the polling task knows it.
struct Worker {
    tx: mpsc::UnboundedSender<Record>,
    flow: Arc<Flow>,
    task: JoinHandle<()>,
}

/// A queue's buffer: how many messages wait, and whether pulling it is
/// paused.
#[derive(Default)]
struct Flow {
    queued: AtomicUsize,
    paused: Mutex<bool>,
}

/// The consumer's task: polls until stopped, then lets each worker finish
/// the message in hand, commits what is settled and leaves the group.
///
/// A poll is never cancelled: the client hands over messages it took from
/// its buffer only when the poll returns, so a stop waits for the poll in
/// progress (at most its 200 ms).
pub(super) async fn run(shared: Arc<Shared>, stop: watch::Receiver<bool>) -> Result<(), Error> {
    let (ending, ending_rx) = watch::channel(false);
    let mut workers: HashMap<MessageQueue, Worker> = HashMap::new();
    let mut last_commit = Instant::now();
    // A stop, or the handle dropped (the sender gone).
    while !*stop.borrow() && stop.has_changed().is_ok() {
        let polled = shared.consumer.poll_with_timeout(200).await;
        for m in &polled {
            shared.route(&mut workers, Record::of(m), &ending_rx);
        }
        if last_commit.elapsed() >= shared.commit_interval {
            shared.commit().await;
            workers.retain(|_, w| !w.task.is_finished());
            last_commit = Instant::now();
        }
    }
    ending.send_replace(true);
    for w in workers.into_values() {
        drop(w.tx);
        let _ = w.task.await;
    }
    shared.commit().await;
    shared.consumer.shutdown().await;
    // A clone shares the producer's client: shutting it down stops the
    // dead-letter producer's background tasks.
    let mut producer = shared.producer.clone();
    crate::boxed(async move { producer.shutdown().await }).await;
    Ok(())
}

impl Shared {
    /// Hands `record` to its queue's worker (started if there is none),
    /// pausing the queue when its worker holds its buffer.
    fn route(
        self: &Arc<Self>,
        workers: &mut HashMap<MessageQueue, Worker>,
        record: Record,
        ending: &watch::Receiver<bool>,
    ) {
        let queue = record.queue.clone();
        if idem_core::probe::is_broken(idem_core::probe::Break::SettleFirst) {
            // The control's at-most-once consumer: the offset committed as
            // the message arrives (an auto-committing consumer).
            self.settle(&queue, record.offset);
        }
        let mut record = record;
        loop {
            if workers.get(&queue).is_none_or(|w| w.task.is_finished()) {
                workers.insert(queue.clone(), self.start_worker(&queue, ending));
            }
            let w = &workers[&queue];
            w.flow.queued.fetch_add(1, Ordering::AcqRel);
            match w.tx.send(record) {
                Ok(()) => break,
                Err(mpsc::error::SendError(back)) => {
                    w.flow.queued.fetch_sub(1, Ordering::AcqRel);
                    record = back;
                    workers.remove(&queue);
                }
            }
        }
        let w = &workers[&queue];
        if w.flow.queued.load(Ordering::Acquire) >= self.buffer {
            let mut paused = w.flow.paused.lock().unwrap_or_else(|p| p.into_inner());
            if !*paused {
                *paused = true;
                let (s, q) = (self.clone(), queue.clone());
                tokio::spawn(async move { s.consumer.pause(vec![q]).await });
            }
        }
    }

    fn start_worker(
        self: &Arc<Self>,
        queue: &MessageQueue,
        ending: &watch::Receiver<bool>,
    ) -> Worker {
        let (tx, rx) = mpsc::unbounded_channel();
        let flow = Arc::new(Flow::default());
        let (s, q, f, e) = (self.clone(), queue.clone(), flow.clone(), ending.clone());
        let task = tokio::spawn(async move { s.work(q, rx, f, e).await });
        Worker { tx, flow, task }
    }

    /// A queue's worker: its messages one at a time, in offset order,
    /// until the consumer ends (what it holds then is not committed: read
    /// again by the queue's next owner).
    async fn work(
        &self,
        queue: MessageQueue,
        mut rx: mpsc::UnboundedReceiver<Record>,
        flow: Arc<Flow>,
        mut ending: watch::Receiver<bool>,
    ) {
        while let Some(record) = rx.recv().await {
            let left = flow.queued.fetch_sub(1, Ordering::AcqRel).saturating_sub(1);
            if left <= self.buffer / 4 {
                let resume =
                    std::mem::take(&mut *flow.paused.lock().unwrap_or_else(|p| p.into_inner()));
                if resume {
                    self.consumer.resume(vec![queue.clone()]).await;
                }
            }
            if *ending.borrow() {
                break;
            }
            self.stats.count(Counter::Received);
            let slot = tokio::select! {
                _ = ending.changed() => break,
                slot = self.slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            };
            self.process(&record, &mut ending).await;
            drop(slot);
        }
    }

    /// One message: runs the handler (again in place while its database
    /// is down, and after its back-off while it fails) and settles it.
    async fn process(&self, record: &Record, ending: &mut watch::Receiver<bool>) {
        let msg_id = self
            .key_from
            .id_of(&record.properties, &record.keys, &record.body);
        let span = tracing::info_span!(
            "rocketmq_message",
            topic = %self.topic,
            group = %self.group,
            msg_id = msg_id.as_deref().unwrap_or(""),
            broker = %record.queue.broker_name(),
            queue = record.queue.queue_id(),
            offset = record.offset,
            "otel.name" = tracing::field::Empty,
            "otel.kind" = "consumer",
        );
        #[cfg(feature = "opentelemetry")]
        continue_trace(&span, record, &self.topic, msg_id.as_deref());
        async move {
            let mut attempt = 1u32;
            loop {
                let settling = Settling {
                    shared: self,
                    record,
                    msg_id: msg_id.as_deref(),
                    attempt,
                    again: AtomicBool::new(false),
                    ending: ending.clone(),
                };
                let verdict = match &msg_id {
                    None => Err(Failure::unkeyed(&self.key_from.describe())),
                    Some(id) => {
                        let message = record.message(id, attempt);
                        let run = || consume::run(&self.handler, message.clone());
                        consume::through_outages(run, ending, self.outage_retry, &self.stats).await
                    }
                };
                consume::settle(&settling, verdict, attempt, self.max_attempts, "attempts").await;
                if !settling.again.load(Ordering::Acquire)
                    || !sleep_unless_ending(ending, self.backoff.delay(attempt)).await
                {
                    break;
                }
                attempt = attempt.saturating_add(1);
                self.stats.count(Counter::Redelivered);
            }
        }
        .instrument(span)
        .await
    }
}

/// The message's span continues the trace of its `traceparent` property.
#[cfg(feature = "opentelemetry")]
fn continue_trace(span: &tracing::Span, record: &Record, topic: &str, message_id: Option<&str>) {
    let headers = record
        .properties
        .iter()
        .filter(|(name, _)| name == "traceparent" || name == "tracestate")
        .cloned()
        .collect();
    consume::continue_trace(span, &headers, "rocketmq", topic, message_id);
}

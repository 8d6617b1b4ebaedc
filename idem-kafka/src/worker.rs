//! The running consumer: one task reading the consumer group's records
//! and handing each to its partition's worker, one worker per assigned
//! partition running its records in order, each settled by the rules of
//! the [module documentation](super#settlement).

use super::message::header_text;
use super::settle::{Origin, Record, Settling};
use super::shared::{Shared, Tp, now_ms, sleep_unless_ending};
use super::{
    ATTEMPT_HEADER, MSG_ID_HEADER, NOT_BEFORE_HEADER, ORIGIN_OFFSET_HEADER,
    ORIGIN_PARTITION_HEADER, ORIGIN_TOPIC_HEADER,
};
use idem_core::Error;
use idem_core::backoff::{Backoff, FailureLog};
use idem_core::consume::{self, Counter, Failure};
use rdkafka::TopicPartitionList;
use rdkafka::consumer::Consumer as _;
use rdkafka::message::{Headers as _, Message as _, OwnedMessage};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

/// What a record weighs in its worker's buffer: its value, key and
/// headers, and what holding it costs besides.
fn weight(m: &OwnedMessage) -> usize {
    let headers = m.headers().map_or(0, |h| {
        h.iter()
            .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len))
            .sum()
    });
    m.payload().map_or(0, <[u8]>::len) + m.key().map_or(0, <[u8]>::len) + headers + 256
}

/// One partition's worker, as the reading task knows it.
struct Worker {
    epoch: u64,
    tx: mpsc::UnboundedSender<OwnedMessage>,
    flow: Arc<Flow>,
    task: JoinHandle<()>,
}

/// A partition's buffer: what its waiting records weigh, and whether
/// fetching it is paused.
#[derive(Default)]
struct Flow {
    queued: AtomicUsize,
    paused: Mutex<bool>,
}

/// The consumer's task: reads records until stopped, then lets each
/// worker finish the record in hand, and closes the consumer (which
/// commits the offsets stored).
pub(super) async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) -> Result<(), Error> {
    // Tells the workers (and handlers waiting out an outage) to stop.
    let (ending, ending_rx) = watch::channel(false);
    let mut workers: HashMap<Tp, Worker> = HashMap::new();
    let mut tidy = tokio::time::interval(Duration::from_secs(5));
    // A broker down fails every read: warned once, then at debug level
    // until a read succeeds again.
    let mut reads = FailureLog::new("Kafka consumer reads", read_backoff());
    let consumer =
        tracing::info_span!("kafka_consumer", topic = %shared.topic, group = %shared.group);
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => break,
            read = shared.consumer.recv() => match read {
                Ok(m) => {
                    consumer.in_scope(|| reads.succeeded());
                    let m = m.detach();
                    shared.route(&mut workers, m, &ending_rx);
                }
                Err(e) => {
                    shared.stats.count(Counter::PullFailure);
                    consumer.in_scope(|| reads.failed(&e));
                    let wait = reads.backoff().unwrap_or_else(|| read_backoff().delay(0));
                    if pause(&mut stop, wait).await {
                        break;
                    }
                }
            },
            _ = tidy.tick() => workers.retain(|_, w| !w.task.is_finished()),
        }
    }
    ending.send_replace(true);
    for w in workers.into_values() {
        drop(w.tx);
        let _ = w.task.await;
    }
    // Closing leaves the group and commits the offsets stored; it blocks
    // (librdkafka polls until it is closed).
    let _ = tokio::task::spawn_blocking(move || drop(shared)).await;
    Ok(())
}

/// The waits between reads while they fail: 100 ms, doubling up to 2 s.
fn read_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(100), Duration::from_secs(2))
}

/// Sleeps `d`; `true` when a stop came first.
async fn pause(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        _ = stop.changed() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

fn one_partition(tp: &Tp) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&tp.topic, tp.partition);
    tpl
}

impl Shared {
    /// Hands `m` to its partition's worker (started for the current
    /// assignment if there is none), pausing the partition when its
    /// worker holds its buffer ([`Consumer::buffer`](crate::Consumer::buffer)).
    fn route(
        self: &Arc<Self>,
        workers: &mut HashMap<Tp, Worker>,
        m: OwnedMessage,
        ending: &watch::Receiver<bool>,
    ) {
        let tp = Tp {
            topic: m.topic().to_owned(),
            partition: m.partition(),
        };
        if idem_core::probe::is_broken(idem_core::probe::Break::SettleFirst) {
            // The control's at-most-once consumer: the offset stored as
            // the record arrives (`enable.auto.offset.store`).
            let _ = self
                .consumer
                .store_offset(&tp.topic, tp.partition, m.offset());
        }
        let epoch = self.ctx().epoch(&tp.topic, tp.partition);
        let weight = weight(&m);
        let mut m = m;
        loop {
            let current = workers
                .get(&tp)
                .is_some_and(|w| w.epoch == epoch && !w.task.is_finished());
            if !current {
                workers.insert(tp.clone(), self.start_worker(&tp, epoch, ending));
            }
            let w = workers.get(&tp).expect("inserted above");
            w.flow.queued.fetch_add(weight, Ordering::AcqRel);
            match w.tx.send(m) {
                Ok(()) => break,
                // The worker ended (it never does while it is current):
                // a new one takes the record, which is never skipped.
                Err(mpsc::error::SendError(back)) => {
                    w.flow.queued.fetch_sub(weight, Ordering::AcqRel);
                    m = back;
                    workers.remove(&tp);
                }
            }
        }
        let w = &workers[&tp];
        if w.flow.queued.load(Ordering::Acquire) >= self.buffer {
            let mut paused = w.flow.paused.lock().unwrap_or_else(|p| p.into_inner());
            if !*paused && self.consumer.pause(&one_partition(&tp)).is_ok() {
                *paused = true;
            }
        }
    }

    fn start_worker(
        self: &Arc<Self>,
        tp: &Tp,
        epoch: u64,
        ending: &watch::Receiver<bool>,
    ) -> Worker {
        let (tx, rx) = mpsc::unbounded_channel();
        let flow = Arc::new(Flow::default());
        let (s, t, f, e) = (self.clone(), tp.clone(), flow.clone(), ending.clone());
        let task = tokio::spawn(async move { s.work(t, epoch, rx, f, e).await });
        Worker {
            epoch,
            tx,
            flow,
            task,
        }
    }

    /// A partition's worker: its records one at a time, in offset order,
    /// until the consumer ends or the assignment does (what it holds then
    /// is not stored: the partition's next owner reads it again).
    async fn work(
        &self,
        tp: Tp,
        epoch: u64,
        mut rx: mpsc::UnboundedReceiver<OwnedMessage>,
        flow: Arc<Flow>,
        mut ending: watch::Receiver<bool>,
    ) {
        while let Some(m) = rx.recv().await {
            let weight = weight(&m);
            let left = flow
                .queued
                .fetch_sub(weight, Ordering::AcqRel)
                .saturating_sub(weight);
            if left <= self.buffer / 4 {
                let mut paused = flow.paused.lock().unwrap_or_else(|p| p.into_inner());
                if *paused {
                    let _ = self.consumer.resume(&one_partition(&tp));
                    *paused = false;
                }
            }
            if *ending.borrow() || self.stale(&tp, epoch) {
                break;
            }
            self.stats.count(Counter::Received);
            let record = Record::of(&m);
            let origin = self.origin_of(&record);
            // A retry copy waits until it is due without a handler slot.
            if let Some(due) = origin.not_before
                && !self.wait_until(due, &tp, epoch, &mut ending).await
            {
                break;
            }
            let slot = tokio::select! {
                _ = ending.changed() => break,
                slot = self.slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            };
            self.process(&record, &origin, &tp, epoch, &mut ending)
                .await;
            drop(slot);
        }
    }

    /// One record: runs the handler (again in place while its database
    /// is down) and settles it.
    async fn process(
        &self,
        record: &Record,
        copy: &Origin,
        tp: &Tp,
        epoch: u64,
        ending: &mut watch::Receiver<bool>,
    ) {
        if copy.attempt > 1 {
            self.stats.count(Counter::Redelivered);
        }
        let span = tracing::info_span!(
            "kafka_record",
            topic = %copy.origin,
            group = %self.group,
            msg_id = copy.msg_id.as_deref().unwrap_or(""),
            partition = record.partition,
            offset = record.offset,
            attempt = copy.attempt,
            "otel.name" = tracing::field::Empty,
            "otel.kind" = "consumer",
        );
        #[cfg(feature = "opentelemetry")]
        continue_trace(&span, record, &copy.origin, copy.msg_id.as_deref());
        async move {
            let mut attempt = copy.attempt;
            loop {
                let settling = Settling {
                    shared: self,
                    record,
                    origin: copy,
                    tp,
                    epoch,
                    attempt,
                    again: AtomicBool::new(false),
                    ending: ending.clone(),
                };
                let verdict = match &copy.msg_id {
                    None => Err(Failure::unkeyed(&self.key_from.describe())),
                    Some(id) => {
                        let message = record.message(&copy.origin, id, attempt);
                        let run = || consume::run(&self.handler, message.clone());
                        consume::through_outages(run, ending, self.outage_retry, &self.stats).await
                    }
                };
                consume::settle(&settling, verdict, attempt, self.max_attempts, "attempts").await;
                // Retried in place (no retry topic): after the back-off.
                if !settling.again.load(Ordering::Acquire)
                    || !sleep_unless_ending(ending, self.backoff.delay(attempt)).await
                    || self.stale(tp, epoch)
                {
                    break;
                }
                attempt = attempt.saturating_add(1);
            }
        }
        .instrument(span)
        .await
    }

    /// Waits until `due` (ms since the epoch); `false` when the consumer
    /// ends or the partition is revoked first.
    async fn wait_until(
        &self,
        due: i64,
        tp: &Tp,
        epoch: u64,
        ending: &mut watch::Receiver<bool>,
    ) -> bool {
        loop {
            let left = due.saturating_sub(now_ms());
            if left <= 0 {
                return true;
            }
            let step =
                Duration::from_millis(u64::try_from(left).unwrap_or(0)).min(Duration::from_secs(1));
            if !sleep_unless_ending(ending, step).await || self.stale(tp, epoch) {
                return false;
            }
        }
    }

    /// What `record` is a copy of: a first copy, or a retry copy read back
    /// from the retry topic (its origin, id and attempt in its headers).
    fn origin_of(&self, record: &Record) -> Origin {
        let is_retry = self.retry_topic.as_deref() == Some(record.topic.as_str());
        let h = &record.headers;
        if is_retry && let Some(origin) = header_text(h, ORIGIN_TOPIC_HEADER) {
            let number = |name| header_text(h, name).and_then(|v| v.parse::<i64>().ok());
            return Origin {
                origin,
                msg_id: header_text(h, MSG_ID_HEADER).filter(|s| !s.is_empty()),
                attempt: number(ATTEMPT_HEADER)
                    .and_then(|a| u32::try_from(a).ok())
                    .unwrap_or(2)
                    .max(1),
                // Never later than the longest back-off from now: a copy
                // written with a far-off time (by hand, or a clock that
                // jumped) does not hold its retry partition for longer.
                not_before: number(NOT_BEFORE_HEADER).map(|due| {
                    let longest =
                        i64::try_from(self.backoff.delay(u32::MAX).as_millis()).unwrap_or(i64::MAX);
                    due.min(now_ms().saturating_add(longest))
                }),
                partition: number(ORIGIN_PARTITION_HEADER).unwrap_or(-1),
                offset: number(ORIGIN_OFFSET_HEADER).unwrap_or(-1),
            };
        }
        Origin {
            origin: record.topic.clone(),
            msg_id: self
                .key_from
                .id_of(h, &record.body, record.partition, record.offset),
            attempt: 1,
            not_before: None,
            partition: i64::from(record.partition),
            offset: record.offset,
        }
    }
}

/// The record's span continues the trace of its `traceparent` header (a
/// header that is not UTF-8 is no trace context).
#[cfg(feature = "opentelemetry")]
fn continue_trace(span: &tracing::Span, record: &Record, topic: &str, message_id: Option<&str>) {
    let headers = record
        .headers
        .iter()
        .filter(|(name, _)| name == "traceparent" || name == "tracestate")
        .filter_map(|(name, value)| Some((name.clone(), String::from_utf8(value.clone()).ok()?)))
        .collect();
    consume::continue_trace(span, &headers, "kafka", topic, message_id);
}

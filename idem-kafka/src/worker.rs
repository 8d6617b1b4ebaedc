//! The running consumer: one task reading the consumer group's records
//! and handing each to its partition's worker, one worker per assigned
//! partition running its records in order, each settled by the rules of
//! the [module documentation](super#settlement).

use super::context::Ctx;
use super::message::{KeyFrom, Message, header_text};
use super::{
    ATTEMPT_HEADER, DEAD_GROUP_HEADER, DEAD_REASON_HEADER, MSG_ID_HEADER, NOT_BEFORE_HEADER,
    ORIGIN_OFFSET_HEADER, ORIGIN_PARTITION_HEADER, ORIGIN_TOPIC_HEADER, RETRY_REASON_HEADER,
};
use idem_core::Error;
use idem_core::backoff::Backoff;
use idem_core::consume::{self, ConsumerStats, Counter, Failure, Settle};
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::message::{Header, Headers, Message as _, OwnedHeaders, OwnedMessage};
use rdkafka::producer::FutureProducer;
use rdkafka::producer::future_producer::FutureRecord;
use rdkafka::util::Timeout;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

/// The handler as stored (see [`consume`]).
pub(super) type Handler = consume::Handler<Message>;

/// Records a partition's worker may hold before the partition is paused
/// (fetching resumes when a quarter are left): a slow partition holds
/// back only itself.
const BUFFER: usize = 512;

/// What the consumer's tasks share.
pub(super) struct Shared {
    pub(super) consumer: StreamConsumer<Ctx>,
    /// The producer of retry copies and dead letters.
    pub(super) producer: FutureProducer,
    pub(super) topic: String,
    pub(super) group: String,
    pub(super) retry_topic: Option<String>,
    pub(super) dead_letter_topic: String,
    pub(super) key_from: KeyFrom,
    pub(super) handler: Handler,
    pub(super) max_attempts: u32,
    pub(super) backoff: Backoff,
    pub(super) outage_retry: Duration,
    pub(super) send_timeout: Duration,
    pub(super) slots: Arc<Semaphore>,
    pub(super) stats: Arc<ConsumerStats>,
}

/// The partition a worker runs, and the assignment it runs it for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Tp {
    topic: String,
    partition: i32,
}

/// One partition's worker, as the reading task knows it.
struct Worker {
    epoch: u64,
    tx: mpsc::UnboundedSender<OwnedMessage>,
    flow: Arc<Flow>,
    task: JoinHandle<()>,
}

/// A partition's buffer: how many records wait, and whether fetching it
/// is paused.
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
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => break,
            read = shared.consumer.recv() => match read {
                Ok(m) => {
                    let m = m.detach();
                    shared.route(&mut workers, m, &ending_rx);
                }
                Err(e) => {
                    shared.stats.count(Counter::PullFailure);
                    tracing::warn!(topic = %shared.topic, group = %shared.group, error = %e, "Kafka consumer error; reading on");
                    if pause(&mut stop, Duration::from_millis(100)).await {
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

/// Sleeps `d`; `true` when a stop came first.
async fn pause(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        _ = stop.changed() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

/// Sleeps `d`; `false` when the consumer is ending.
async fn sleep_unless_ending(ending: &mut watch::Receiver<bool>, d: Duration) -> bool {
    if *ending.borrow() {
        return false;
    }
    tokio::select! {
        _ = ending.changed() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

fn now_ms() -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(now.as_millis()).unwrap_or(i64::MAX)
}

fn one_partition(tp: &Tp) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&tp.topic, tp.partition);
    tpl
}

impl Shared {
    fn ctx(&self) -> &Ctx {
        self.consumer.context()
    }

    /// Whether the assignment `epoch` of `tp` ended (the partition was
    /// revoked since).
    fn stale(&self, tp: &Tp, epoch: u64) -> bool {
        self.ctx().epoch(&tp.topic, tp.partition) != epoch
    }

    /// Hands `m` to its partition's worker (started for the current
    /// assignment if there is none), pausing the partition when its
    /// worker holds [`BUFFER`] records.
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
        let mut m = m;
        loop {
            let current = workers
                .get(&tp)
                .is_some_and(|w| w.epoch == epoch && !w.task.is_finished());
            if !current {
                workers.insert(tp.clone(), self.start_worker(&tp, epoch, ending));
            }
            let w = workers.get(&tp).expect("inserted above");
            w.flow.queued.fetch_add(1, Ordering::AcqRel);
            match w.tx.send(m) {
                Ok(()) => break,
                // The worker ended (it never does while it is current):
                // a new one takes the record, which is never skipped.
                Err(mpsc::error::SendError(back)) => {
                    m = back;
                    workers.remove(&tp);
                }
            }
        }
        let w = &workers[&tp];
        if w.flow.queued.load(Ordering::Acquire) >= BUFFER {
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
            let left = flow.queued.fetch_sub(1, Ordering::AcqRel).saturating_sub(1);
            if left <= BUFFER / 4 {
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
        );
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
                not_before: number(NOT_BEFORE_HEADER),
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

    /// Stores the offset after `record` (committed with the next commit),
    /// unless the assignment ended.
    fn store(&self, record: &Record, tp: &Tp, epoch: u64) -> bool {
        if idem_core::probe::is_broken(idem_core::probe::Break::SettleFirst) {
            // The control stored it on arrival (see `route`).
            return true;
        }
        if self.stale(tp, epoch) {
            self.stats.count(Counter::SettleFailed);
            tracing::debug!(
                "partition revoked before its record was settled; its next owner reads it again"
            );
            return false;
        }
        match self
            .consumer
            .store_offset(&record.topic, record.partition, record.offset)
        {
            Ok(()) => true,
            Err(e) => {
                self.stats.count(Counter::SettleFailed);
                tracing::debug!(error = %e, "offset not stored; the record is read again");
                false
            }
        }
    }

    /// Writes a copy of `record` to `topic` with `headers`, confirmed by
    /// the broker, trying again (100 ms doubling to 5 s) until it is,
    /// or until the consumer ends or the partition is revoked (`false`:
    /// the record is not settled, and is read again).
    async fn produce(
        &self,
        topic: &str,
        record: &Record,
        headers: OwnedHeaders,
        tp: &Tp,
        epoch: u64,
        ending: &mut watch::Receiver<bool>,
    ) -> bool {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut tries = 0u32;
        loop {
            let mut copy = FutureRecord::to(topic)
                .payload(&record.body)
                .headers(headers.clone());
            if let Some(k) = &record.key {
                copy = copy.key(k);
            }
            let sent = self
                .producer
                .send(copy, Timeout::After(self.send_timeout))
                .await;
            let Err((e, _)) = sent else {
                return true;
            };
            tries = tries.saturating_add(1);
            if tries == 1 || tries.is_power_of_two() {
                tracing::warn!(%topic, tries, error = %e, "could not write to the retry or dead-letter topic; trying again (the record stays unsettled)");
            }
            if !sleep_unless_ending(ending, backoff.jittered(tries, 0)).await
                || self.stale(tp, epoch)
            {
                self.stats.count(Counter::SettleFailed);
                return false;
            }
        }
    }
}

/// The consumed record, copied out of librdkafka.
struct Record {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    timestamp_ms: Option<i64>,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

impl Record {
    fn of(m: &OwnedMessage) -> Record {
        let headers = m.headers().map_or_else(Vec::new, |h| {
            h.iter()
                .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                .collect()
        });
        Record {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            timestamp_ms: m.timestamp().to_millis(),
            headers,
            body: m.payload().unwrap_or_default().to_vec(),
        }
    }

    fn message(&self, origin: &str, msg_id: &str, attempt: u32) -> Message {
        Message {
            topic: origin.to_owned(),
            msg_id: msg_id.to_owned(),
            record_topic: self.topic.clone(),
            partition: self.partition,
            offset: self.offset,
            attempt,
            record_key: self.key.clone(),
            timestamp_ms: self.timestamp_ms,
            headers: self.headers.clone(),
            body: self.body.clone(),
        }
    }

    /// Its headers without the ones idem sets on retry copies and dead
    /// letters, with `extra` added.
    fn headers_with(&self, extra: &[(&str, String)]) -> OwnedHeaders {
        let ours = [
            MSG_ID_HEADER,
            ATTEMPT_HEADER,
            NOT_BEFORE_HEADER,
            ORIGIN_TOPIC_HEADER,
            ORIGIN_PARTITION_HEADER,
            ORIGIN_OFFSET_HEADER,
            RETRY_REASON_HEADER,
            DEAD_REASON_HEADER,
            DEAD_GROUP_HEADER,
        ];
        let mut out = OwnedHeaders::new_with_capacity(self.headers.len() + extra.len());
        for (k, v) in &self.headers {
            if !ours.contains(&k.as_str()) {
                out = out.insert(Header {
                    key: k,
                    value: Some(v),
                });
            }
        }
        for (k, v) in extra {
            out = out.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        out
    }
}

/// What a record is a copy of.
struct Origin {
    /// The topic the message was published to.
    origin: String,
    /// Its id (`None`: it has none, a dead letter).
    msg_id: Option<String>,
    attempt: u32,
    /// A retry copy: when it is due (ms since the epoch).
    not_before: Option<i64>,
    /// Where the first copy was (`-1`: unknown).
    partition: i64,
    offset: i64,
}

impl Origin {
    fn origin_headers(&self) -> [(&'static str, String); 3] {
        [
            (ORIGIN_TOPIC_HEADER, self.origin.clone()),
            (ORIGIN_PARTITION_HEADER, self.partition.to_string()),
            (ORIGIN_OFFSET_HEADER, self.offset.to_string()),
        ]
    }
}

/// Header values are one line, and short.
fn one_line(reason: &str) -> String {
    reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(2000)
        .collect()
}

/// One record being settled: its offset stored, after its copy to the
/// retry or dead-letter topic when it goes there.
struct Settling<'a> {
    shared: &'a Shared,
    record: &'a Record,
    origin: &'a Origin,
    tp: &'a Tp,
    epoch: u64,
    attempt: u32,
    /// Retried in place: the caller runs the record again.
    again: AtomicBool,
    ending: watch::Receiver<bool>,
}

impl Settling<'_> {
    fn store(&self) -> bool {
        self.shared.store(self.record, self.tp, self.epoch)
    }

    fn msg_id(&self) -> String {
        self.origin.msg_id.clone().unwrap_or_default()
    }
}

impl Settle for Settling<'_> {
    async fn ack(&self, executed: bool) {
        if self.store() {
            self.shared.stats.acked(executed);
        }
    }

    async fn retry(&self, reason: &str) {
        let s = self.shared;
        let Some(topic) = &s.retry_topic else {
            s.stats.count(Counter::Retried);
            consume::count_retry();
            self.again.store(true, Ordering::Release);
            tracing::info!(%reason, retry_in = ?s.backoff.delay(self.attempt), "Kafka record failed; running it again in place");
            return;
        };
        let delay = s.backoff.delay(self.attempt);
        let due = now_ms().saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX));
        let mut extra = vec![
            (MSG_ID_HEADER, self.msg_id()),
            (ATTEMPT_HEADER, (self.attempt.saturating_add(1)).to_string()),
            (NOT_BEFORE_HEADER, due.to_string()),
            (RETRY_REASON_HEADER, one_line(reason)),
        ];
        extra.extend(self.origin.origin_headers());
        let headers = self.record.headers_with(&extra);
        let mut ending = self.ending.clone();
        if s.produce(
            topic,
            self.record,
            headers,
            self.tp,
            self.epoch,
            &mut ending,
        )
        .await
            && self.store()
        {
            s.stats.count(Counter::Retried);
            consume::count_retry();
            tracing::info!(%reason, retry_in = ?delay, retry_topic = %topic, "Kafka record failed; copied to the retry topic");
        }
    }

    async fn dead_letter(&self, reason: &str) {
        let s = self.shared;
        let topic = &s.dead_letter_topic;
        let mut extra = vec![
            (DEAD_REASON_HEADER, one_line(reason)),
            (DEAD_GROUP_HEADER, s.group.clone()),
            (ATTEMPT_HEADER, self.attempt.to_string()),
        ];
        if let Some(id) = &self.origin.msg_id {
            extra.push((MSG_ID_HEADER, id.clone()));
        }
        extra.extend(self.origin.origin_headers());
        let headers = self.record.headers_with(&extra);
        let mut ending = self.ending.clone();
        if s.produce(
            topic,
            self.record,
            headers,
            self.tp,
            self.epoch,
            &mut ending,
        )
        .await
            && self.store()
        {
            s.stats.count(Counter::DeadLettered);
            consume::count_dead_letter();
            tracing::warn!(%reason, dead_letter_topic = %topic, "Kafka record dead-lettered");
        }
    }
}

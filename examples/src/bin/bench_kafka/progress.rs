//! One consumer's run, as its handlers report it: when the first record
//! began and the last settled (with the CPU times then), the outcomes,
//! and the wait for the end.

use crate::BoxError;
use idem_examples::bench::cpu::{self, Cpu};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A moment of the run: the clock and the CPU times.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    at: Instant,
    cpu: Cpu,
    /// The broker's CPU time (zero when not ours, or unreadable).
    broker: Duration,
}

impl Mark {
    fn now(broker_pid: Option<u32>) -> Mark {
        Mark {
            at: Instant::now(),
            cpu: Cpu::now(),
            broker: broker_pid.and_then(cpu::of_process).unwrap_or_default(),
        }
    }
}

/// What one run measured, from the first record's start to the last
/// record's settlement.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Measured {
    pub(crate) records: usize,
    pub(crate) elapsed: Duration,
    /// This process (the consumer, librdkafka's threads included).
    pub(crate) client: Duration,
    /// The broker's process.
    pub(crate) broker: Duration,
    /// The machine's rest: PostgreSQL, and whatever else runs.
    pub(crate) rest: Duration,
}

impl Measured {
    pub(crate) fn rate(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU µs per record: client, broker, the rest.
    pub(crate) fn cpu_us(&self) -> [f64; 3] {
        let n = self.records as i64;
        [self.client, self.broker, self.rest].map(|d| cpu::per_message_us(d, n))
    }
}

/// The handlers' reports of one run.
#[derive(Debug)]
pub(crate) struct Progress {
    expected: usize,
    broker_pid: Option<u32>,
    settled: AtomicUsize,
    executed: AtomicUsize,
    duplicates: AtomicUsize,
    failed: AtomicUsize,
    first_error: Mutex<Option<String>>,
    first: OnceLock<Mark>,
    last: OnceLock<Mark>,
}

impl Progress {
    pub(crate) fn new(expected: usize, broker_pid: Option<u32>) -> Progress {
        Progress {
            expected,
            broker_pid,
            settled: AtomicUsize::new(0),
            executed: AtomicUsize::new(0),
            duplicates: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            first_error: Mutex::new(None),
            first: OnceLock::new(),
            last: OnceLock::new(),
        }
    }

    /// A handler starts a record.
    pub(crate) fn begin(&self) {
        self.first.get_or_init(|| Mark::now(self.broker_pid));
    }

    /// A record's handler committed its effect (`executed`) or found it
    /// done (a duplicate).
    pub(crate) fn settled(&self, executed: bool) {
        let counter = if executed {
            &self.executed
        } else {
            &self.duplicates
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if self.settled.fetch_add(1, Ordering::AcqRel) + 1 == self.expected {
            self.last.get_or_init(|| Mark::now(self.broker_pid));
        }
    }

    /// A record's handler failed: the run is void.
    pub(crate) fn failed(&self, error: String) {
        self.failed.fetch_add(1, Ordering::AcqRel);
        let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert(error);
    }

    /// Records executed and answered as duplicates.
    pub(crate) fn outcomes(&self) -> (usize, usize) {
        (
            self.executed.load(Ordering::Relaxed),
            self.duplicates.load(Ordering::Relaxed),
        )
    }

    /// Waits until every expected record settled; an error at the first
    /// failure, or after `timeout`.
    pub(crate) async fn wait(&self, who: &str, timeout: Duration) -> Result<Measured, BoxError> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.failed.load(Ordering::Acquire) > 0 {
                let first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
                return Err(format!(
                    "{who}: a handler failed: {}",
                    first.as_deref().unwrap_or("?")
                )
                .into());
            }
            if let (Some(first), Some(last)) = (self.first.get(), self.last.get()) {
                return Ok(self.measured(first, last));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{who}: {} of {} records settled after {timeout:?}",
                    self.settled.load(Ordering::Acquire),
                    self.expected
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn measured(&self, first: &Mark, last: &Mark) -> Measured {
        let spent = last.cpu.since(&first.cpu);
        let broker = last.broker.saturating_sub(first.broker);
        Measured {
            records: self.expected,
            elapsed: last.at.duration_since(first.at),
            client: spent.own,
            broker,
            rest: spent.rest().saturating_sub(broker),
        }
    }
}

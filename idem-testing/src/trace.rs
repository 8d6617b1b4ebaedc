//! A trace of the delivery protocol's events, for the conformance check
//! (`idem_model::trace`): every claim and its outcome, lease renewal,
//! fenced outbox update, state check, effect, transition, commit outcome
//! (injected lost acknowledgements included), read-back, failure
//! bookkeeping, relay-side success mark and cache marker, each with the
//! message's row id, topic, attempt and the claim's lease owner.
//!
//! Off by default. [`start`] installs the probe and turns it on
//! process-wide (a process started with `IDEM_TRACE_FILE` set calls
//! [`install`](crate::install) and records from then on); events go to memory, taken with
//! [`take_topic`] (tests sharing a process each take their own topic's),
//! and, when the environment variable `IDEM_TRACE_FILE` names a file,
//! are appended to it as JSON lines, one `write` per event, so that the
//! trace of a process killed with SIGKILL survives it.
//!
//! Each event is a JSON object with `kind`, `msg` (the outbox row id),
//! `topic`, `attempt` (what the claim wrote), `owner` (the claim's lease
//! owner, `relay#seq`), `at`, `seq` (its order in this process), `pid`,
//! and the kind's own fields (the JSON shapes are `idem_model::trace`'s).
//!
//! `at` (nanoseconds of the system clock) orders the events of two claims
//! of one message: a claim can take a message only once its previous
//! holder's last write has committed. So the writes that end an attempt (a
//! commit, the failure bookkeeping, a success mark, a batch's end) take
//! their `at` **before** their statement, and a claim takes its own
//! **after** (on SQLite a claim waits for the write lock inside its
//! statement); every other event, in between, at its emission. Sorting a trace by `at` (then `seq`) gives the order the database
//! saw, across the tasks of one process and across processes, where the
//! order of emission may not (a task may be descheduled between its
//! statement and its event).

use serde_json::{Map, Value};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

static ON: AtomicBool = AtomicBool::new(false);
static SEQ: AtomicU64 = AtomicU64::new(0);
static EVENTS: Mutex<Vec<Value>> = Mutex::new(Vec::new());
static FILE: OnceLock<Option<Mutex<std::fs::File>>> = OnceLock::new();

/// Starts recording (process-wide). With `IDEM_TRACE_FILE` set, events
/// are also appended to that file.
pub fn start() {
    crate::install();
    ON.store(true, Ordering::SeqCst);
}

/// Stops recording; what was recorded stays until taken.
pub fn stop() {
    ON.store(false, Ordering::SeqCst);
}

/// Whether events are recorded: after [`start`], or in a process started
/// with `IDEM_TRACE_FILE` set (a relay process a test kills).
pub fn is_on() -> bool {
    static FROM_ENV: OnceLock<bool> = OnceLock::new();
    ON.load(Ordering::Relaxed)
        || *FROM_ENV.get_or_init(|| std::env::var_os("IDEM_TRACE_FILE").is_some())
}

/// Takes the recorded events of `topic` (in the order recorded), leaving
/// the others'.
pub fn take_topic(topic: &str) -> Vec<Value> {
    let mut events = EVENTS.lock().unwrap_or_else(|e| e.into_inner());
    let (mine, rest): (Vec<Value>, Vec<Value>) = std::mem::take(&mut *events)
        .into_iter()
        .partition(|e| e.get("topic").and_then(Value::as_str) == Some(topic));
    *events = rest;
    mine
}

/// Reads the events of `topic` from a trace file written by
/// `IDEM_TRACE_FILE` (by several processes, each in its own order).
pub fn read_file(path: &std::path::Path, topic: &str) -> std::io::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e.get("topic").and_then(Value::as_str) == Some(topic))
        .collect())
}

/// Now, as an event's `at`: nanoseconds since the Unix epoch.
pub fn now() -> u64 {
    idem_core::probe::clock()
}

/// Sorts `events` into the database's order: by `at`, then by process
/// and `seq`.
pub fn sort(events: &mut [Value]) {
    let key = |e: &Value| {
        let n = |f: &str| e.get(f).and_then(Value::as_u64).unwrap_or(0);
        (n("at"), n("pid"), n("seq"))
    };
    events.sort_by_key(key);
}

/// Records `event` (the probe's [`Probe::event`](idem_core::probe::Probe::event)).
pub(crate) fn record(e: idem_core::probe::Event<'_>) {
    if !is_on() {
        return;
    }
    let mut event = match e.fields {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    if !event.contains_key("at") {
        event.insert("at".into(), now().into());
    }
    event.insert("kind".into(), e.kind.into());
    event.insert("msg".into(), e.msg.into());
    event.insert("topic".into(), e.topic.into());
    event.insert("attempt".into(), e.attempt.into());
    event.insert("owner".into(), e.owner.into());
    event.insert("seq".into(), SEQ.fetch_add(1, Ordering::SeqCst).into());
    event.insert("pid".into(), std::process::id().into());
    let event = Value::Object(event);
    let file = FILE.get_or_init(|| {
        let path = std::env::var_os("IDEM_TRACE_FILE")?;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .ok()
            .map(Mutex::new)
    });
    if let Some(file) = file {
        let mut line = event.to_string();
        line.push('\n');
        let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
        let _ = f.write_all(line.as_bytes());
    }
    EVENTS.lock().unwrap_or_else(|e| e.into_inner()).push(event);
}

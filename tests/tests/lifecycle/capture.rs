//! A `tracing` layer that keeps every event's level, target and message:
//! installed as the thread's default subscriber by a current-thread test,
//! it sees the events of every task of that test's runtime, and of no
//! other test.

use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// The events seen, shared with the test.
#[derive(Clone, Debug, Default)]
pub(crate) struct Capture(Arc<Mutex<Vec<(Level, String, String)>>>);

impl Capture {
    /// Events at `level` whose message starts with `message`.
    pub(crate) fn count(&self, level: Level, message: &str) -> usize {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|(l, _, m)| *l == level && m.starts_with(message))
            .count()
    }

    /// Events at `level` from idem's crates, whatever their message.
    pub(crate) fn idem_events(&self, level: Level) -> Vec<String> {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|(l, t, _)| *l == level && t.starts_with("idem"))
            .map(|(_, t, m)| format!("{t}: {m}"))
            .collect()
    }
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        let meta = event.metadata();
        self.0
            .lock()
            .unwrap()
            .push((*meta.level(), meta.target().to_owned(), message.0));
    }
}

//! The key each call derived, read from the `idempotent` span the
//! attribute opens for every call (its `key` field), through a tracing
//! subscriber of the run's own attached to the calls' futures only.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Dispatch, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// The name of the span the harness runs each call in.
const ACTION_SPAN: &str = "idem_test_action";
/// The name of the span the attribute opens for a call.
const CALL_SPAN: &str = "idempotent";

/// The keys derived, by action (its global number).
#[derive(Debug, Default)]
pub(crate) struct Keys {
    by_action: Mutex<BTreeMap<usize, Vec<String>>>,
}

impl Keys {
    /// A dispatcher that records the keys of the calls run under
    /// [`Keys::span`] into `keys`.
    pub(crate) fn dispatch(keys: &Arc<Keys>) -> Dispatch {
        let layer = KeyLayer { keys: keys.clone() };
        Dispatch::new(tracing_subscriber::registry().with(layer))
    }

    /// The span to run action `action`'s call in, under `dispatch`.
    pub(crate) fn span(dispatch: &Dispatch, action: usize) -> tracing::Span {
        tracing::dispatcher::with_default(
            dispatch,
            || tracing::info_span!(target: "idem_test", "idem_test_action", action = action as u64),
        )
    }

    fn add(&self, action: usize, key: String) {
        let mut map = self
            .by_action
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let keys = map.entry(action).or_default();
        if !keys.contains(&key) {
            keys.push(key);
        }
    }

    /// The keys action `action`'s calls derived (usually one).
    pub(crate) fn of(&self, action: usize) -> Vec<String> {
        let map = self
            .by_action
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.get(&action).cloned().unwrap_or_default()
    }

    /// The other actions that derived one of `action`'s keys, with the key.
    pub(crate) fn sharing(&self, action: usize) -> Vec<(usize, String)> {
        let map = self
            .by_action
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(mine) = map.get(&action) else {
            return Vec::new();
        };
        map.iter()
            .filter(|(other, _)| **other != action)
            .flat_map(|(other, keys)| {
                keys.iter()
                    .filter(|k| mine.contains(k))
                    .map(move |k| (*other, k.clone()))
            })
            .collect()
    }
}

/// The action number a span belongs to, kept in its extensions.
struct ActionOf(usize);

/// Reads `action` (our span) or `key` (the attribute's) from span fields.
#[derive(Default)]
struct Fields {
    action: Option<u64>,
    key: Option<String>,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "action" {
            self.action = Some(value);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "key" {
            self.key = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "key" && self.key.is_none() {
            self.key = Some(format!("{value:?}").trim_matches('"').to_owned());
        }
    }
}

/// The layer that ties each `idempotent` span to its action.
struct KeyLayer {
    keys: Arc<Keys>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for KeyLayer {
    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        metadata.is_span() && matches!(metadata.name(), ACTION_SPAN | CALL_SPAN)
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let action = match attrs.metadata().name() {
            ACTION_SPAN => fields.action.and_then(|a| usize::try_from(a).ok()),
            _ => span
                .scope()
                .skip(1)
                .find_map(|s| s.extensions().get::<ActionOf>().map(|a| a.0)),
        };
        let Some(action) = action else { return };
        span.extensions_mut().insert(ActionOf(action));
        if let Some(key) = fields.key {
            self.keys.add(action, key);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        if span.name() != CALL_SPAN {
            return;
        }
        let Some(action) = span.extensions().get::<ActionOf>().map(|a| a.0) else {
            return;
        };
        let mut fields = Fields::default();
        values.record(&mut fields);
        if let Some(key) = fields.key {
            self.keys.add(action, key);
        }
    }
}

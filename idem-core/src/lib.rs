//! The core of [idem](https://docs.rs/idem-runtime): the call protocol
//! behind `#[idempotent]`, the three strategies, the outbox and its relay,
//! record expiry and archiving, on sqlx and tokio.
//!
//! **Applications depend on `idem-runtime`**, the facade that re-exports
//! this crate with the entry points as features; the examples here are
//! written against it. This crate is what entry-point crates are built
//! on, through public seams only:
//!
//! - [`consume`]: the consumer core every broker entry point shares (a
//!   handler of a message type, its run in a task of its own, the give-up
//!   rule, fan-out to several subscribers, [`consume::Settle`] for how a
//!   broker acknowledges, retries and dead-letters, the handle and the
//!   counters), with a complete example of an entry point written on it;
//! - [`outbox::forward`]: a relay route that publishes each outbox message
//!   to a broker, for a publisher that supplies only how it publishes one;
//! - [`requests`]: the ledger of `Idempotency-Key` requests, for an HTTP
//!   layer;
//! - [`front`]: the front-cache trait, for a cache before the database;
//! - [`task`]: the background task handle the runtime's tasks share.
//!
//! The crates `idem-amqp` (RabbitMQ), `idem-nats` (NATS JetStream),
//! `idem-axum` (HTTP) and `idem-redis` (the Redis front cache) are written
//! on these seams and nothing else.
//!
//! Feature `opentelemetry`: [`outbox::enqueue`] stores the current `tracing`
//! span's OpenTelemetry context (read through `tracing-opentelemetry`) in the
//! message's headers as W3C `traceparent` and `tracestate`, unless the caller
//! set a `traceparent`; the relay's `outbox_delivery` span continues that
//! trace, a forwarding route's publish span writes its own context into the
//! broker's message, and the consumers continue it, with OpenTelemetry's
//! messaging names, kinds and attributes. Without it, no header is added and
//! no OpenTelemetry crate is built.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
pub mod backoff;
mod call;
pub mod consume;
pub mod duration;
mod error;
mod fingerprint;
pub mod front;
mod key;
mod lease;
pub mod metrics;
#[cfg(feature = "opentelemetry")]
mod otel;
pub mod outbox;
pub mod pooler;
pub mod probe;
pub mod process;
pub mod requests;
mod schema_check;
mod state;
mod status;
mod strategy;
pub mod task;
mod tx;
mod unique;

/// The sqlx idem is built on, for code that names its types without a
/// `sqlx` dependency of its own (or checks that its own is the same).
pub use sqlx;

pub use backend::classify::is_transient;
pub use backend::{Backend, Dialect};
pub use call::{CallerTx, Outcome, Source};
pub use error::{BoxError, Error, ErrorKind};
pub use fingerprint::fingerprint;
pub use key::{KeyBuilder, KeyPart, MAX_KEY_LEN, Validator, check_key, escape_part};
pub use schema_check::{SCHEMA_VERSION, check_schema};
pub use state::{EntityId, EntityIdValue, State};
pub use strategy::MAX_TTL_SECS;

/// A `Result` whose error is idem's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What `#[idempotent]`'s expansion names, and nothing else: the call
/// protocol, the strategy specs and the key builder. Not public API: it
/// changes with the macro, in any release.
#[doc(hidden)]
pub mod __private {
    pub use crate::call::{Call, Open, Outcome, Source, Strategy};
    pub use crate::key::KeyBuilder;
    pub use crate::strategy::{Record, StateMachine, UniqueInsert};
    use crate::{EntityId, KeyPart, State};
    pub use crate::{Error, fingerprint};
    pub use ::tracing::Instrument;

    /// The database of a connection type, for handlers whose first
    /// parameter is `tx: &mut PgConnection` (or another connection).
    pub type DatabaseOf<C> = <C as ::sqlx::Connection>::Database;

    /// The span of one call; `key` and `outcome` are recorded as it goes.
    pub fn span(handler: &'static str, strategy: &'static str) -> ::tracing::Span {
        ::tracing::info_span!(
            "idempotent",
            handler,
            strategy,
            key = ::tracing::field::Empty,
            outcome = ::tracing::field::Empty,
        )
    }

    /// Type-checks that `from` and `to` are states of the same enum.
    pub fn states<S: State>(from: S, to: S) -> (&'static str, &'static str) {
        (from.as_str(), to.as_str())
    }

    /// The entity id's bind value.
    pub fn entity_id<T: EntityId + ?Sized>(id: &T) -> crate::EntityIdValue {
        id.entity_id()
    }

    /// Adapts a user validator `fn(&str) -> Result<(), E: Display>`.
    pub fn validate<E: ::std::fmt::Display>(
        f: fn(&str) -> Result<(), E>,
        key: &str,
    ) -> Result<(), String> {
        f(key).map_err(|e| e.to_string())
    }

    /// Records an invalid key on the call's span and passes the result on.
    pub fn reject_invalid(
        span: &::tracing::Span,
        key: Result<String, Error>,
    ) -> Result<String, Error> {
        key.inspect_err(|e| {
            span.record("outcome", e.kind().as_str());
            ::tracing::debug!(parent: span, error = %format_args!("{e:#}"), "idempotent call rejected");
        })
    }

    /// Encodes a key part on its own (for `biz_no`).
    pub fn key_part<T: KeyPart + ?Sized>(v: &T) -> String {
        let mut s = String::new();
        v.write_key_part(&mut s);
        s
    }
}

//! # idem: idempotent async message handlers, by construction
//!
//! Retries are how asynchronous pipelines heal — an outbox poller re-runs a
//! handler after a lost commit acknowledgement, a broker redelivers after a
//! failover, a payment platform repeats its callback — so every handler
//! runs more than once sooner or later. idem makes the correct handler the
//! only one you can write: [`#[idempotent]`](macro@idempotent) generates the
//! key derivation, the state check, your mutation and the outbox status
//! update as **one database transaction**, and misuse does not compile.
//!
//! ```
//! use idem_runtime::{idempotent, Outcome, State};
//! use sqlx::{Sqlite, SqlitePool, Transaction};
//!
//! #[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
//! enum CouponState { Unused, Used }
//!
//! struct DeductCoupon { msg_id: String, coupon_id: i64, order_id: i64 }
//!
//! #[idempotent(
//!     key = "coupon-deduct:{msg.msg_id}",
//!     strategy = state_machine,
//!     table = "coupon", id = msg.coupon_id, state_column = "status",
//!     from = CouponState::Unused, to = CouponState::Used,
//! )]
//! async fn deduct(tx: &mut Transaction<'_, Sqlite>, msg: &DeductCoupon) -> Result<(), sqlx::Error> {
//!     sqlx::query("INSERT INTO deduction (coupon_id, order_id) VALUES (?, ?)")
//!         .bind(msg.coupon_id).bind(msg.order_id)
//!         .execute(&mut **tx).await?;
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = SqlitePool::connect("sqlite::memory:").await?;
//! idem_runtime::migrate(&pool).await?;
//! sqlx::query("CREATE TABLE coupon (id INTEGER PRIMARY KEY, status TEXT NOT NULL)").execute(&pool).await?;
//! sqlx::query("CREATE TABLE deduction (coupon_id INTEGER, order_id INTEGER)").execute(&pool).await?;
//! sqlx::query("INSERT INTO coupon VALUES (7, 'UNUSED')").execute(&pool).await?;
//!
//! let msg = DeductCoupon { msg_id: "m-1".into(), coupon_id: 7, order_id: 42 };
//! assert_eq!(deduct(&pool, &msg).await?, Outcome::Executed(()));
//! // The retry after a lost acknowledgement: no second deduction.
//! assert_eq!(deduct(&pool, &msg).await?, Outcome::Duplicate(None));
//! let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM deduction").fetch_one(&pool).await?;
//! assert_eq!(n, 1);
//! # Ok(()) }
//! ```
//!
//! See the README for every strategy, every attribute option and the same
//! code written by hand.
//!
//! ## Cargo features
//! - `sqlite` (default): the embedded backend, no server needed.
//! - `postgres`, `mysql` (MariaDB and MySQL): the server backends.
//! - `any`: handlers on `sqlx::Any`, the database chosen at run time by URL.
//! - `uuid`: UUIDs as key parts and entity ids.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backend;
mod call;
mod error;
mod key;
pub mod outbox;
mod schema;
mod state;

pub use backend::{Backend, Dialect, NewRecord, StateSql, StoredRecord, is_identifier};
pub use call::{Call, Outcome, Record, Source, StateMachine, fingerprint};
pub use error::{BoxError, Error, is_transient};
pub use key::{KeyBuilder, KeyPart, MAX_KEY_LEN, Validator, check_key};
pub use schema::migrate;
pub use state::{EntityId, EntityIdValue, State};

/// Makes an async handler idempotent. See the crate documentation and the
/// README for the options of each strategy.
pub use idem_macros::idempotent;

/// Derives [`State`] for a field-less enum (`#[state(rename = "...")]` on a
/// variant overrides its stored name).
pub use idem_macros::State;

/// A `Result` whose error is idem's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Used by the generated code. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::call::{Call, Record, Source, StateMachine, fingerprint};
    pub use crate::key::KeyBuilder;
    pub use crate::{EntityId, Error, KeyPart, Outcome, State};
    pub use ::sqlx;
    pub use ::tracing::Instrument;

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
            span.record("outcome", e.kind());
            ::tracing::debug!(parent: span, error = %e, "idempotent call rejected");
        })
    }

    /// Encodes a key part on its own (for `biz_no`).
    pub fn key_part<T: KeyPart + ?Sized>(v: &T) -> String {
        let mut s = String::new();
        v.write_key_part(&mut s);
        s
    }
}

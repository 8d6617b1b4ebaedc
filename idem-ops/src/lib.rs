//! Operating idem: what runs beside the call protocol rather than inside
//! it, written on [`idem_core`]'s public API only.
//!
//! - [`schema`]: idem's tables, created and upgraded in place by
//!   [`migrate`];
//! - [`archive`]: the archiver, which moves expired idempotency records
//!   and finished outbox messages to history tables in small batches
//!   under live traffic, and the look-up of a record online or archived;
//! - [`admin`]: the operator's outbox queries (stats, backlog, dead
//!   letters, guarded requeue, leases, deliveries per minute) that the
//!   `idem` CLI and the web console run.
//!
//! Users reach both through `idem-runtime` (`idem_runtime::archive`,
//! `idem_runtime::outbox::admin`). Their statements are this crate's own,
//! one set per dialect, run through the same pooler rules as the core's
//! ([`idem_core::pooler`]).
//!
//! Metrics (through the `metrics` facade, beside the core's):
//!
//! | counter | labels | what |
//! |---|---|---|
//! | `idem_archived_total` | `table` = record / outbox | rows moved to the history tables |
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod archive;
pub mod schema;
mod sql;
mod store;
pub mod timestamp;

pub use schema::{SCHEMA_VERSION, TABLES, existing_tables, migrate};
pub use store::Operable;
/// The `time` crate, whose [`OffsetDateTime`](time::OffsetDateTime) the
/// timestamps of records and messages are.
pub use time;

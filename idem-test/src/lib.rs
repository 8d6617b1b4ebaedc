//! # idem-test: prove your handlers act once
//!
//! `#[idempotent]` makes the check, your mutation and the commit one
//! transaction, but a handler can still be wrong where the attribute cannot
//! see: an effect written outside the call's transaction (a second pool,
//! an HTTP call), a key template that leaves out the field telling two
//! actions apart, a hand-written check that runs before the transaction.
//! This crate runs **your** handler under the faults that expose those,
//! and checks in the database that every action acted exactly once.
//!
//! Add it as a dev-dependency, describe the run with [`ActsOnce`] — how to
//! make the `n`-th action's input, how to call your handler, how to count
//! one action's effect — and assert on its [`Report`]:
//!
//! ```
//! use idem_runtime::{idempotent, Outcome, State};
//! use idem_test::ActsOnce;
//! use sqlx::SqliteConnection;
//!
//! #[derive(Clone, Copy, State)]
//! enum CouponState { Unused, Used }
//!
//! #[idempotent(
//!     key = "coupon-deduct:{order_id}",
//!     strategy = state_machine,
//!     table = "coupon", id = coupon_id,
//!     from = CouponState::Unused, to = CouponState::Used,
//! )]
//! async fn deduct_coupon(tx: &mut SqliteConnection, coupon_id: i64, order_id: i64) -> Result<(), sqlx::Error> {
//!     sqlx::query("INSERT INTO deduction (coupon_id, order_id) VALUES (?, ?)")
//!         .bind(coupon_id).bind(order_id).execute(&mut *tx).await?;
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Action n: order 100 + n deducts coupon n.
//! let report = ActsOnce::sqlite("deduct_coupon", |n| (n as i64, 100 + n as i64))
//!     .setup(|pool| async move {
//!         sqlx::query("CREATE TABLE coupon (id INTEGER PRIMARY KEY, status TEXT NOT NULL)").execute(&pool).await?;
//!         sqlx::query("CREATE TABLE deduction (coupon_id INTEGER, order_id INTEGER)").execute(&pool).await?;
//!         Ok(())
//!     })
//!     .prepare(|pool, (coupon, _)| async move {
//!         sqlx::query("INSERT INTO coupon VALUES (?, 'UNUSED')").bind(coupon).execute(&pool).await?;
//!         Ok(())
//!     })
//!     .call(|pool, (coupon, order)| async move { deduct_coupon(&pool, coupon, order).await })
//!     .effect(|pool, (_, order)| async move {
//!         sqlx::query_scalar("SELECT COUNT(*) FROM deduction WHERE order_id = ?").bind(order).fetch_one(&pool).await
//!     })
//!     .run()
//!     .await?;
//! report.assert_acts_once();
//! println!("{report}");
//! # Ok(()) }
//! ```
//!
//! # The scenarios
//!
//! Each [`Scenario`] takes actions of its own and counts every action's
//! effect when its calls are done:
//!
//! - **single calls**: one call each, no fault (the baseline; it also
//!   counts how many commits a call makes);
//! - **concurrent duplicates**: 8 calls of each action side by side, the
//!   first commit among them held 200 ms with its locks while the others
//!   run into it;
//! - **lost commit acknowledgements**: each call loses the acknowledgement
//!   of one of its commits (each commit of a call in turn, over the
//!   actions): the commit happens, the caller does not learn it; then the
//!   call is retried;
//! - **cancelled before commit**: each call is cancelled at one of its
//!   commits, after its statements; the commit does not happen; then the
//!   call is retried;
//! - **relay restarted mid-drain** (a route's): a relay claims the
//!   action's message and dies in its handler, after its commit or with
//!   the commit cut, recording nothing; a new relay drains the topic;
//! - **lease expired under a slow handler** (a route's): relay A claims
//!   the message and stalls until its lease is gone, relay B reclaims it,
//!   and both handlers run side by side, the first commit held.
//!
//! # Through a relay
//!
//! For a handler behind the outbox, give [`ActsOnce::enqueue`] (how an
//! action becomes a message) and [`ActsOnce::route`] (the topic and its
//! handler, as for `Relay::route`) instead of `call`: the run delivers
//! each action through real relays.
//!
//! ```
//! # use idem_runtime::{idempotent, outbox, State};
//! # use idem_test::ActsOnce;
//! # use sqlx::SqliteConnection;
//! # #[derive(Clone, Copy, State)]
//! # enum CouponState { Unused, Used }
//! #[derive(Clone, serde::Serialize, serde::Deserialize)]
//! struct Deduct { coupon_id: i64, order_id: i64 }
//!
//! #[idempotent(
//!     key = "coupon-deduct:{order_id}",
//!     strategy = state_machine,
//!     table = "coupon", id = coupon_id,
//!     from = CouponState::Unused, to = CouponState::Used,
//! )]
//! async fn deduct_coupon(tx: &mut SqliteConnection, coupon_id: i64, order_id: i64) -> Result<(), sqlx::Error> {
//!     sqlx::query("INSERT INTO deduction (coupon_id, order_id) VALUES (?, ?)")
//!         .bind(coupon_id).bind(order_id).execute(&mut *tx).await?;
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let report = ActsOnce::sqlite("coupon.deduct route", |n| Deduct { coupon_id: n as i64, order_id: 100 + n as i64 })
//!     .setup(|pool| async move {
//!         sqlx::query("CREATE TABLE coupon (id INTEGER PRIMARY KEY, status TEXT NOT NULL)").execute(&pool).await?;
//!         sqlx::query("CREATE TABLE deduction (coupon_id INTEGER, order_id INTEGER)").execute(&pool).await?;
//!         Ok(())
//!     })
//!     .prepare(|pool, m| async move {
//!         sqlx::query("INSERT INTO coupon VALUES (?, 'UNUSED')").bind(m.coupon_id).execute(&pool).await?;
//!         Ok(())
//!     })
//!     .enqueue(|pool, m| async move {
//!         let mut tx = pool.begin().await?;
//!         let payload = serde_json::json!({ "coupon_id": m.coupon_id, "order_id": m.order_id });
//!         outbox::enqueue(&mut tx, "coupon.deduct", &format!("order-{}", m.order_id), &payload).await?;
//!         tx.commit().await?;
//!         Ok(())
//!     })
//!     // `d.source()`: the call's transaction marks the message, fenced by the delivery's lease.
//!     .route("coupon.deduct", |d, m: Deduct| async move { deduct_coupon(d.source(), m.coupon_id, m.order_id).await })
//!     .effect(|pool, m| async move {
//!         sqlx::query_scalar("SELECT COUNT(*) FROM deduction WHERE order_id = ?").bind(m.order_id).fetch_one(&pool).await
//!     })
//!     .run()
//!     .await?;
//! report.assert_acts_once();
//! # Ok(()) }
//! ```
//!
//! The run's relays deliver one message at a time and poll every 10 ms;
//! a relay "dies" when its handler's future never ends and the run aborts
//! it, and a dead or stalled relay's lease is ended by the run in
//! `idem_outbox`, so that the next relay claims at once. Name a topic of
//! the run's own: a run refuses to start while messages of it are pending.
//!
//! The faults are injected, never waited for: on SQLite through the
//! commit hook of the run's connections (a lost acknowledgement drops the
//! caller's future while its commit goes through; a cancellation turns
//! the commit into a rollback and drops the future), on PostgreSQL and
//! MariaDB through a [`proxy::FaultProxy`] of the run's own between the
//! pool and the server (a lost acknowledgement throws the server's reply
//! to `COMMIT` away; a cancellation closes the connection before the
//! server has the `COMMIT`). Only the two side-by-side scenarios
//! (concurrent duplicates, the lease's two handlers) depend on timing, and
//! only to catch a broken handler: a correct one acts once whatever the
//! interleaving.
//!
//! # The report
//!
//! [`Report::assert_acts_once`] panics with one line per action that did
//! not act once, naming the scenario, the action, the key its calls
//! derived (read from the attribute's `idempotent` span) and the likely
//! cause. A `state_machine` handler that writes its deduction through a
//! second pool, outside the call's transaction, gives:
//!
//! ```text
//! acts_once: scenario "cancelled before commit": action #12 (key "coupon-deduct:112"):
//! effect counted 2, expected 1 (doubled): its call was cancelled at its commit 1 of 1,
//! then 1 retry answered Executed: the cancelled call's transaction rolled back, yet its
//! effect stayed: it is written outside the call's transaction (a second pool or
//! connection, an HTTP call)
//! ```
//!
//! (one line, wrapped here). The guide's chapter "Prove your handlers act
//! once" (`idem_runtime::guide::acts_once`) shows the messages for a check
//! outside the transaction and for a key template missing a field.
//!
//! `Display` prints a table: per scenario the calls made, how many
//! executed, answered `Duplicate` or failed, the faults injected, and the
//! actions doubled or lost.
//!
//! # Databases
//!
//! - [`ActsOnce::sqlite`] (feature `sqlite`, the default): a fresh
//!   database file of the run's own in WAL mode, so that readers never wait
//!   for a writer, as on the servers (SQLite's shared in-memory database
//!   locks whole tables and would hide a check outside the transaction).
//!   Nothing to set up.
//! - `ActsOnce::postgres` (feature `postgres`), `ActsOnce::mysql`
//!   (feature `mysql`): a server's URL; [`ActsOnce::run`] answers
//!   [`Error::Unreachable`] when it is down, for the test to skip. Name the
//!   tables so that they meet no other test's, and drop what an earlier run
//!   left in `setup`; idem's own tables are migrated by the run. Keys must
//!   be new on every run (a `record` key stays in `idem_record`).
//!
//! The fault proxy is public ([`proxy`]) for tests of your own: it loses
//! `COMMIT` acknowledgements at random or on a scripted `COMMIT`, cuts or
//! holds one, takes the server down, or black-holes it.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod acts_once;
mod answer;
mod backend;
mod error;
mod keys;
pub mod proxy;
mod relay;
mod relay_runner;
mod report;
mod runner;
mod scenario;
mod script;

pub use acts_once::ActsOnce;
pub use backend::TestBackend;
pub use error::Error;
pub use report::{ActionReport, Report, ScenarioReport};
pub use scenario::Scenario;
pub use script::CommitFault;

//! # The coupon double-deduction incident, replayed at peak
//!
//! *Async Idempotency in Practice* opens with a promotion during which some
//! users lost two coupons for one order. Each order committed together with
//! its "deduct the coupon" message in a local message table (an outbox); a
//! poller delivered the messages. At peak, a commit acknowledgement was
//! lost: the deduction had committed, the application saw a time-out, and
//! the message was delivered again. Retries are how the pipeline heals, so
//! duplicate deliveries are not a bug to remove but a fact to survive.
//!
//! This example replays that peak with idem's own outbox and relay. It
//! places `--orders` orders (default 500), each with an `UNUSED` coupon and
//! its deduction message enqueued **in the order's transaction**, then
//! drains the outbox with relays. Every duplicate comes from a real
//! mechanism:
//!
//! - **lost acknowledgements**: on PostgreSQL and MariaDB the relays'
//!   connections go through a fault proxy that forwards `COMMIT`, lets the
//!   server commit, then throws the reply away and closes the connection
//!   (`--lost-ack-rate` of all commits, default 0.2: the handlers' and the
//!   relays' claims alike); on SQLite, which has no network, idem's
//!   `testing` hook commits the handler's transaction and then reports the
//!   same error. A failed attempt goes back to the relay, which retries it
//!   with back-off — unless the message is already `success`: the relay's
//!   bookkeeping never overwrites a success, so an attempt whose commit in
//!   fact landed (with the message marked in the same transaction) is not
//!   retried. A claim whose acknowledgement is lost is read back at once
//!   and its messages delivered as claimed: with the default 30 s lease, a
//!   message that waited for its lease would stretch the drain visibly;
//! - **concurrent redelivery**: `--relays` relays (default 3) drain each
//!   topic at once, and for `--redelivery-rate` of the orders (default 0.3)
//!   the producer published the message a second time under a new message
//!   id (a producer retry), right after the first: two messages, one
//!   coupon, delivered side by side.
//!
//! Two handlers consume the same workload, each on its own tables and
//! topic, through the same relay machinery and the same kind of lossy
//! connections, both at the same time:
//!
//! - **the article's fault version**, written by hand: the coupon's status
//!   is read *outside* the transaction; then `BEGIN`, the deduction (ledger
//!   row, coupon `USED`), the outbox message marked `success`, `COMMIT`. A
//!   failed commit is returned as an error, for the relay to retry. Two
//!   deliveries of one order running at once both read `UNUSED`, and both
//!   deduct: the row lock only serializes the double deduction;
//! - **`deduct_coupon`**, an `#[idempotent(strategy = state_machine)]`
//!   handler: the attribute reads the coupon's state under a row lock
//!   (SQLite: `BEGIN IMMEDIATE`), runs the body (one ledger row), flips the
//!   coupon `UNUSED` → `USED` and marks the message, all in one
//!   transaction. A delivery that finds the coupon `USED` answers
//!   `Outcome::Duplicate` without running the body.
//!
//! The fault version double-deducts a fair share of the producer-retried
//! orders; the `#[idempotent]` handler deducts every coupon exactly once.
//!
//! ## The output
//!
//! The two handlers side by side, counted in the database where possible:
//!
//! - *messages*: outbox rows (orders plus producer retries);
//! - *deliveries*: the attempts recorded in the outbox (each claim by a
//!   relay is one), and how many times the handler actually ran;
//! - *lost acks*: commit acknowledgements thrown away on the handler's
//!   connections, on its deduction `COMMIT`, on the relays' claims of
//!   messages (lost claims, and how many messages were read back), and
//!   elsewhere (claims that found nothing, bookkeeping; on SQLite the
//!   `testing` hook's counts by kind of commit are printed for the whole
//!   process);
//! - *re-claimed*: messages claimed after their lease expired;
//! - *double deductions*: coupons with more than one ledger row;
//! - *lost deductions*: coupons with no ledger row although not all of
//!   their messages were dead-lettered (a message marked `success`, or
//!   still pending when the run stopped, with nothing deducted);
//! - *dead-lettered*: messages the relay gave up on (status `failed`);
//! - *throughput*: messages settled (success or dead-lettered) per second,
//!   from the relays' start until nothing of the topic is pending (both
//!   handlers share the machine and the database while they run).
//!
//! - *elapsed*, and the same for a fault-free reference drain of the same
//!   workload run first (`--no-reference` skips it), with the ratio;
//! - *attempts*: a histogram, attempts → messages. The README's target:
//!   with 20% lost acknowledgements the `#[idempotent]` drain takes at most
//!   1.5× the reference, and no message uses more than 2 attempts unless
//!   its handler failed; the last line says whether this run met it.
//!
//! `--json` prints the same as one JSON object on stdout. A progress bar is
//! drawn on stderr when it is a terminal (not with `--json`).
//!
//! ```text
//! cargo run -p idem-examples --bin coupon              # SQLite, in a temporary file
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p idem-examples --bin coupon
//! DATABASE_URL=mysql://root@127.0.0.1:3306/test cargo run -p idem-examples --bin coupon
//! ```
//!
//! One handler serves the three databases: it runs on `sqlx::Any`, and the
//! database is chosen at run time by the URL. Only the placeholders of the
//! hand-written SQL differ (see [`sql`]).
//!
//! The process exits with status 1 if the `#[idempotent]` handler deducts a
//! coupon twice or loses a deduction, and with status 2 on a setup error.
//!
//! The pieces: [`Args`] (the command line), [`handlers`] (the two handlers
//! under test), [`sql`] (the two placeholder styles), `workload` (placing
//! the orders), `drain` (one handler's relays and what they left behind),
//! `report` (the output) and [`run`] (all of it, in order).

mod args;
mod drain;
pub mod handlers;
mod report;
mod run;
pub mod sql;
mod workload;

pub use args::Args;
pub use run::run;

/// Any error of a run.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

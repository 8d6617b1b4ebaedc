//! Reusable pieces of idem's examples (not published).
//!
//! - [`bench`](mod@bench): the benchmarks' PostgreSQL set-up.
//! - [`coupon`]: the coupon double-deduction incident replayed at peak, the
//!   article's fault version against an `#[idempotent]` handler. Run it
//!   with `cargo run -p idem-examples --bin coupon`.
//! - [`payments`]: third-party payment callbacks over HTTP — the payment
//!   serial as idempotency key (validated: format and HMAC signature), the
//!   `record` strategy, and the order's state as secondary verification;
//!   with a simulated payment platform that retries. Run it with
//!   `cargo run -p idem-examples --bin payment_callbacks`.
//! - [`readme`]: the code `README.md` shows, compiled and run by
//!   `tests/readme_snippets.rs`.

pub mod bench;
pub mod coupon;
pub mod payments;
pub mod readme;

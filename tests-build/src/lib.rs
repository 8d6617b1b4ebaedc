//! Compile-fail and compile-pass tests of `#[idempotent]` and
//! `#[derive(State)]`, in `tests/ui.rs` and `ui/{fail,pass}/*.rs`.
//!
//! A crate of its own so that the cases build with only the features they
//! use. Regenerate the expected errors with
//! `TRYBUILD=overwrite cargo test -p idem-tests-build`, then read them.

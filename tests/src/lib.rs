//! idem's integration tests are in `tests/*.rs`, against the real servers;
//! the helpers they share are in `idem-testkit`, the compile-fail tests in
//! `tests-build`. This library holds nothing of its own.
//!
//! Transitional: `examples/` still depends on this crate for the kit's
//! helpers (`idem_tests::{postgres, ids, concurrently, proxy::FaultProxy}`).
//! Until it depends on `idem-testkit` directly, the kit is re-exported here;
//! delete this re-export then.

#[doc(hidden)]
pub use idem_testkit::*;

//! idem's integration tests are in `tests/*.rs`, against the real servers;
//! the helpers they share are in `idem-testkit`, the compile-fail tests in
//! `tests-build`. This library holds nothing of its own, and no crate
//! depends on it.

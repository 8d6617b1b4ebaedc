//! idem's integration tests, against the real servers, are in
//! `tests/<area>/`: one test binary per area of `idem-runtime/src`
//! (`strategies`, `call`, `backend`, `outbox`, `archive`, `amqp`, `nats`,
//! `http`, `cache`) and one for the deployments a test starts itself
//! (`clusters`), each file a module; `cache_outage.rs` and `pgbouncer.rs`
//! are binaries of their own (they restart Redis servers of their own, and
//! turn a process-wide mode on). What several binaries share is in
//! `tests/common/`, the helpers of every crate's tests in `idem-testkit`,
//! the compile-fail tests in `tests-build`. This library holds nothing of
//! its own, and no crate depends on it.

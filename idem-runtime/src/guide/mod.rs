//! The guide: how to use idem, one chapter per module.
//!
//! The [crate root](crate) is the API reference; these chapters explain
//! how the pieces fit, what each one guarantees and what the tests measured.
//! Read them in this order:
//!
//! 1. [`strategies`]: setting up, what a call answers, the three strategies
//!    (`state_machine`, `record`, `unique_insert`) and the code each one
//!    generates, written by hand.
//! 2. [`keys`]: how a key template becomes a key, and why parts are
//!    percent-encoded.
//! 3. [`outbox`]: the outbox table, `enqueue`, the relay that delivers it,
//!    fault injection, and the model the protocol is checked against.
//! 4. [`composition`]: one message for several handlers (fan-out), and a
//!    handler inside a transaction the caller holds.
//! 5. [`acts_once`]: prove your own handlers act once, in your CI, with
//!    the `idem-test` crate: concurrent duplicates, lost commit
//!    acknowledgements and cancelled calls, and what a failure says.
//! 6. [`entry_points`]: the front layers of each entry point: the Redis
//!    cache, RabbitMQ, NATS JetStream, Kafka, RocketMQ, Redis Streams, payment
//!    callbacks, `Idempotency-Key` requests over HTTP.
//! 7. [`operating`]: metrics and spans, record expiry and archiving, the
//!    retention check, the `idem` command-line tool and the web console.
//! 8. [`deployments`]: the backends and their features, standbys, Galera,
//!    pgbouncer, several databases.
//! 9. [`errors`]: the error enum, what is retryable, which database errors
//!    are transient.
//! 10. [`upgrading`]: schema versions, what `migrate` changes, the rolling
//!     upgrade rule, and key changes.
//! 11. [`attributes`]: every option of `#[idempotent]` and what is checked
//!     at compile time.
//!
//! # How the examples are tested
//!
//! Every example of these chapters runs in `cargo test --workspace`:
//!
//! - The examples that need no server are doctests (SQLite in memory),
//!   run by `cargo test --doc`.
//! - The examples that need a server (PostgreSQL, Redis, RabbitMQ, NATS)
//!   are, byte for byte, marked regions of the repository's
//!   `examples/src/readme/` files (and of the payment-callbacks example,
//!   `examples/src/payments/`, run by `examples/tests/payments.rs`),
//!   compiled there and run against the real servers by
//!   `examples/tests/readme_snippets.rs`, which also fails when
//!   a ```` ```rust ```` block of a chapter is not such a region. These
//!   chapters (the `.md` files beside this module) are therefore shown in
//!   the documentation but not handed to rustdoc's doctest runner
//!   (`cfg_attr(not(doctest), doc = …)`): their code runs where its
//!   servers and tables are. The doctest files (`*.doctest.md`) are handed
//!   to it, and no block in them is marked `ignore`.
//!
//! Tables, topics and queues in the server examples are prefixed `readme_`
//! / `readme.`, so that they never meet another test's on a shared server.

#[cfg_attr(not(doctest), doc = include_str!("strategies.md"))]
#[doc = include_str!("strategies.doctest.md")]
pub mod strategies {}

#[cfg_attr(not(doctest), doc = include_str!("keys.md"))]
#[doc = include_str!("keys.doctest.md")]
pub mod keys {}

#[cfg_attr(not(doctest), doc = include_str!("outbox.md"))]
#[doc = include_str!("outbox.doctest.md")]
pub mod outbox {}

#[cfg_attr(not(doctest), doc = include_str!("composition.md"))]
#[doc = include_str!("composition.doctest.md")]
pub mod composition {}

#[cfg_attr(not(doctest), doc = include_str!("acts_once.md"))]
pub mod acts_once {}

#[cfg_attr(not(doctest), doc = include_str!("entry_points.md"))]
pub mod entry_points {}

#[cfg_attr(not(doctest), doc = include_str!("operating.md"))]
#[doc = include_str!("operating.doctest.md")]
pub mod operating {}

#[cfg_attr(not(doctest), doc = include_str!("deployments.md"))]
pub mod deployments {}

#[cfg_attr(not(doctest), doc = include_str!("errors.md"))]
pub mod errors {}

#[cfg_attr(not(doctest), doc = include_str!("upgrading.md"))]
pub mod upgrading {}

#[cfg_attr(not(doctest), doc = include_str!("attributes.md"))]
pub mod attributes {}

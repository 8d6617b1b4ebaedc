//! The consumer core that the three entry points share: the outbox relay,
//! the RabbitMQ consumer and the NATS JetStream consumer (features `amqp`,
//! `nats`).
//!
//! Each entry point has its own message type (the relay's `Delivery`, an
//! AMQP or a NATS `Message`), its own topology and its own way to settle
//! a message (mark the outbox row; ack, retry queue or reject; ack, nak or
//! term), but one handler shape, one way to run it and one reading of
//! what it came to:
//!
//! - a handler parses the payload of the message's body (an unparsable
//!   one is a failure that no retry heals) and runs the `#[idempotent]`
//!   call, answering whether it executed or was a duplicate;
//! - it runs in a task of its own, so that a panic is a failed attempt
//!   and not a dead consumer;
//! - one give-up rule says what a failed attempt comes to: a retry, or a
//!   dead letter once no retry heals it or it was the last attempt
//!   allowed;
//! - a fan-out makes one handler of several subscribers: one message,
//!   several handlers, each acting once in its own scope.
//!
//! What users see of it: the broker consumers count in one
//! [`ConsumerStats`] and run behind one [`ConsumerHandle`], which the
//! `amqp` and `nats` modules name `ConsumerHandle` for their `Message`.

mod failure;
mod fan_out;
#[cfg(any(feature = "amqp", feature = "nats"))]
mod handle;
mod run;
#[cfg(any(feature = "amqp", feature = "nats"))]
mod settle;
#[cfg(any(feature = "amqp", feature = "nats"))]
mod stats;

pub(crate) use failure::{Failure, Next, Verdict};
#[cfg(any(feature = "amqp", feature = "nats"))]
pub(crate) use fan_out::Handling;
pub(crate) use fan_out::{Subscriber, add, fan_out};
#[cfg(any(feature = "amqp", feature = "nats"))]
pub use handle::ConsumerHandle;
#[cfg(any(feature = "amqp", feature = "nats"))]
pub(crate) use handle::Running;
pub(crate) use run::{Handler, Incoming, handler, inline, run};
#[cfg(feature = "nats")]
pub(crate) use run::{start, verdict};
#[cfg(any(feature = "amqp", feature = "nats"))]
pub(crate) use settle::{Settle, settle};
#[cfg(any(feature = "amqp", feature = "nats"))]
pub use stats::ConsumerStats;

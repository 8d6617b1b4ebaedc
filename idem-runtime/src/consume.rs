//! The consumer core that the three entry points share: the outbox relay,
//! the RabbitMQ consumer and the NATS JetStream consumer.
//!
//! Each entry point has its own message type (a [`Delivery`](crate::outbox::Delivery),
//! an AMQP or a NATS `Message`) and its own way to settle a message (mark
//! the outbox row; ack, retry queue or reject; ack, nak or term), but one
//! handler shape, one way to run it and one reading of what it came to:
//!
//! - a [`Handler`] parses the payload (an unparsable one is a failure that
//!   no retry heals) and runs the `#[idempotent]` call, answering whether
//!   it executed (`true`) or was a duplicate (`false`);
//! - [`start`] runs it in a task of its own, so that a panic is a failed
//!   attempt and not a dead consumer, and [`verdict`] reads the outcome
//!   into a [`Verdict`];
//! - [`fan_out`] makes one handler of several [`Subscriber`]s: one message,
//!   several handlers, each acting once in its own scope.

use crate::Error;
use crate::task::BoxFuture;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::task::{JoinError, JoinHandle};

/// A message an entry point hands to its handlers.
pub(crate) trait Incoming: Send + 'static {
    /// The payload, parsed from the message's JSON body.
    fn payload<P: DeserializeOwned>(&self) -> Result<P, serde_json::Error>;
}

/// A handler as stored: parses the payload, then runs the call
/// (`Ok(true)`: executed, `Ok(false)`: duplicate).
pub(crate) type Handler<M> =
    Arc<dyn Fn(M) -> Result<BoxFuture<Result<bool, Error>>, serde_json::Error> + Send + Sync>;

/// The handler running `f(message, payload)`, with the payload parsed as `P`.
pub(crate) fn handler<M, P, F, Fut, T>(f: F) -> Handler<M>
where
    M: Incoming,
    P: DeserializeOwned + Send + 'static,
    F: Fn(M, P) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<crate::Outcome<T>, Error>> + Send + 'static,
    T: Send + 'static,
{
    Arc::new(move |m: M| {
        let payload: P = m.payload()?;
        let fut = f(m, payload);
        Ok(Box::pin(async move { fut.await.map(|o| o.is_executed()) }) as BoxFuture<_>)
    })
}

/// A failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// Whether a later attempt may succeed.
    pub(crate) retryable: bool,
    /// Why, for the logs and the dead letter.
    pub(crate) reason: String,
    /// Whether the handler's commit may have landed (its outcome is
    /// unknown: [`Error::CommitUnknown`]).
    pub(crate) commit_unknown: bool,
}

impl Failure {
    /// A failure no retry heals.
    pub(crate) fn dead(reason: impl Into<String>) -> Self {
        Failure {
            retryable: false,
            reason: reason.into(),
            commit_unknown: false,
        }
    }

    /// A failure a retry may heal.
    pub(crate) fn retry(reason: impl Into<String>) -> Self {
        Failure {
            retryable: true,
            ..Failure::dead(reason)
        }
    }

    /// What a handler's error says about its attempt.
    pub(crate) fn of(e: &Error) -> Self {
        Failure {
            retryable: e.is_retryable(),
            reason: format!("{}: {e}", e.kind()),
            commit_unknown: matches!(e, Error::CommitUnknown(_)),
        }
    }
}

/// What one attempt came to: `Ok(executed)` (`false`: a duplicate), or
/// the failure.
pub(crate) type Verdict = Result<bool, Failure>;

/// Parses the payload and starts the handler in a task of its own; an
/// unparsable payload is a failure no retry heals.
pub(crate) fn start<M>(
    handler: &Handler<M>,
    message: M,
) -> Result<JoinHandle<Result<bool, Error>>, Failure> {
    match handler(message) {
        Ok(fut) => Ok(tokio::spawn(fut)),
        Err(e) => Err(Failure::dead(unparsable(&e))),
    }
}

/// [`start`] without a task of its own, for a caller that runs each
/// message in a task already (the relay's deliveries): the handler is
/// polled in the caller's task, a panic caught as a failed attempt that a
/// retry may heal, as [`verdict`] reads a panicked task.
pub(crate) fn inline<M>(handler: &Handler<M>, message: M) -> Result<Inline, Failure> {
    match handler(message) {
        Ok(fut) => Ok(Inline(Some(fut))),
        Err(e) => Err(Failure::dead(unparsable(&e))),
    }
}

/// A handler run by [`inline`]; its output is the attempt's [`Verdict`].
pub(crate) struct Inline(Option<BoxFuture<Result<bool, Error>>>);

impl Future for Inline {
    type Output = Verdict;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Verdict> {
        let Some(fut) = self.0.as_mut() else {
            return Poll::Ready(Err(Failure::retry("handler polled after it ended")));
        };
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx)));
        let verdict = match polled {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(Ok(executed))) => Ok(executed),
            Ok(Poll::Ready(Err(e))) => Err(Failure::of(&e)),
            Err(panic) => Err(Failure::retry(format!(
                "handler panicked: {}",
                panic_message(&*panic)
            ))),
        };
        // Never polled again; a panicked future is dropped here.
        self.0 = None;
        Poll::Ready(verdict)
    }
}

/// The message of a panic's payload (`panic!` gives a `&str` or a
/// `String`).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic payload that is not a string")
}

/// What a handler's task came to: a panic is a failed attempt, which a
/// retry may heal.
pub(crate) fn verdict(joined: Result<Result<bool, Error>, JoinError>) -> Verdict {
    match joined {
        Ok(Ok(executed)) => Ok(executed),
        Ok(Err(e)) => Err(Failure::of(&e)),
        Err(join) => Err(Failure::retry(panicked(&join))),
    }
}

/// Starts the handler and waits for it: [`start`], then [`verdict`].
pub(crate) async fn run<M>(handler: &Handler<M>, message: M) -> Verdict {
    match start(handler, message) {
        Ok(task) => verdict(task.await),
        Err(failure) => Err(failure),
    }
}

fn unparsable(e: &serde_json::Error) -> String {
    format!("unparsable payload: {e}")
}

fn panicked(join: &JoinError) -> String {
    format!("handler panicked: {join}")
}

/// One handler of a fanned-out message: its name (unique among the
/// subscribers of one topic or queue) and its handler.
pub(crate) struct Subscriber<M> {
    pub(crate) name: Arc<str>,
    pub(crate) handler: Handler<M>,
}

impl<M> Clone for Subscriber<M> {
    fn clone(&self) -> Self {
        Subscriber {
            name: self.name.clone(),
            handler: self.handler.clone(),
        }
    }
}

/// Adds the subscriber `name` to `subscribers`.
///
/// # Panics
/// When `subscribers` has one of that name already (`of` names the topic
/// or queue in the message).
pub(crate) fn add<M>(subscribers: &mut Vec<Subscriber<M>>, of: &str, name: String, h: Handler<M>) {
    assert!(
        subscribers.iter().all(|s| *s.name != *name),
        "{of} has a subscriber named `{name}` already"
    );
    subscribers.push(Subscriber {
        name: name.into(),
        handler: h,
    });
}

/// The handler of a fanned-out message: its subscribers one after the
/// other, in order, each on the message `hand(&message, settles)` gives
/// it, where `settles` is true for the last subscriber when every one
/// before it ended well (the relay gives that one the delivery that marks
/// the message). A subscriber that fails or panics does not stop the
/// others; the first failure is the attempt's, naming its subscriber. An
/// unknown commit outcome of the last subscriber stays one, so that the
/// entry point can read back whether it landed.
pub(crate) fn fan_out<M: Send + 'static>(
    subscribers: Vec<Subscriber<M>>,
    hand: fn(&M, bool) -> M,
) -> Handler<M> {
    let subscribers: Arc<[Subscriber<M>]> = subscribers.into();
    Arc::new(move |m: M| {
        let subscribers = subscribers.clone();
        Ok(Box::pin(async move {
            let mut executed = false;
            let mut failed: Option<Error> = None;
            let last = subscribers.len().saturating_sub(1);
            for (k, s) in subscribers.iter().enumerate() {
                let message = hand(&m, k == last && failed.is_none());
                let result = match (s.handler)(message) {
                    Err(e) => Err(Error::Handler {
                        source: unparsable(&e).into(),
                        retryable: false,
                    }),
                    // A panicking subscriber is a failed attempt; the
                    // others still run.
                    Ok(fut) => tokio::spawn(fut).await.unwrap_or_else(|join| {
                        Err(Error::Handler {
                            source: panicked(&join).into(),
                            retryable: true,
                        })
                    }),
                };
                match result {
                    Ok(ran) => executed |= ran,
                    Err(e) => {
                        tracing::info!(subscriber = &*s.name, error = %e, "a subscriber of a fanned-out message failed");
                        if failed.is_none() {
                            failed = Some(match e {
                                // The settling commit's outcome: read back.
                                e @ Error::CommitUnknown(_) if k == last => e,
                                e => Error::Handler {
                                    retryable: e.is_retryable(),
                                    source: format!("subscriber `{}`: {}: {e}", s.name, e.kind())
                                        .into(),
                                },
                            });
                        }
                    }
                }
            }
            match failed {
                None => Ok(executed),
                Some(e) => Err(e),
            }
        }) as BoxFuture<_>)
    })
}

/// What a consumer of a queue runs for each message: one handler, or the
/// subscribers of a fan-out.
#[cfg(any(feature = "amqp", feature = "nats"))]
pub(crate) enum Handling<M> {
    /// One handler (`Consumer::new`).
    One(Handler<M>),
    /// Several (`Consumer::fan_out`, then `subscribe` for each).
    Fanned(Vec<Subscriber<M>>),
}

#[cfg(any(feature = "amqp", feature = "nats"))]
impl<M: Clone + Send + 'static> Handling<M> {
    /// Subscribes `h` as `name` (`of` names the queue in the messages).
    ///
    /// # Panics
    /// On a consumer of one handler, or a second subscriber of that name.
    pub(crate) fn subscribe(&mut self, of: &str, name: String, h: Handler<M>) {
        match self {
            Handling::One(_) => panic!(
                "{of} has a handler already (Consumer::new): build a consumer of several \
                 handlers with Consumer::fan_out, then subscribe each"
            ),
            Handling::Fanned(subs) => add(subs, of, name, h),
        }
    }

    /// The handler to run for each message: an error for a fan-out with
    /// no subscriber (it would acknowledge every message unhandled).
    pub(crate) fn into_handler(self, of: &str) -> Result<Handler<M>, Error> {
        match self {
            Handling::One(h) => Ok(h),
            Handling::Fanned(subs) if subs.is_empty() => Err(Error::Config {
                reason: format!(
                    "{of} is a fan-out without subscribers: subscribe at least one handler \
                     (Consumer::subscribe) before spawning it"
                ),
            }),
            Handling::Fanned(subs) => Ok(fan_out(subs, |m, _| m.clone())),
        }
    }

    /// The subscribers' names (empty for a consumer of one handler).
    pub(crate) fn names(&self) -> Vec<Arc<str>> {
        match self {
            Handling::One(_) => Vec::new(),
            Handling::Fanned(subs) => subs.iter().map(|s| s.name.clone()).collect(),
        }
    }
}

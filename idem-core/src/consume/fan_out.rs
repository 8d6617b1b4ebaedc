//! One message, several handlers: the subscribers of a topic or a queue,
//! run one after the other as one handler.

use super::run::{Handler, panicked, unparsable};
use crate::Error;
use crate::task::BoxFuture;
use std::sync::Arc;

/// One handler of a fanned-out message: its name (unique among the
/// subscribers of one topic or queue) and its handler.
pub struct Subscriber<M> {
    /// Its name, unique among the subscribers of one topic or queue.
    pub name: Arc<str>,
    /// What it runs for each message.
    pub handler: Handler<M>,
}

impl<M> std::fmt::Debug for Subscriber<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
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
pub fn add<M>(subscribers: &mut Vec<Subscriber<M>>, of: &str, name: String, h: Handler<M>) {
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
pub fn fan_out<M: Send + 'static>(
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
                let started = tokio::time::Instant::now();
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
                crate::metrics::subscriber(&s.name, &result, started.elapsed());
                match result {
                    Ok(ran) => executed |= ran,
                    Err(e) => {
                        tracing::info!(subscriber = &*s.name, error = %format_args!("{e:#}"), "a subscriber of a fanned-out message failed");
                        if failed.is_none() {
                            failed = Some(match e {
                                // The settling commit's outcome: read back.
                                e @ Error::CommitUnknown(_) if k == last => e,
                                e => Error::Handler {
                                    retryable: e.is_retryable(),
                                    source: Box::new(SubscriberFailed {
                                        name: s.name.clone(),
                                        error: e,
                                    }),
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

/// A subscriber's failure, naming it; its source is the subscriber's own
/// error, so that what caused it (a deadlock a relay batch takes for its
/// contention, say) is still found in the chain.
#[derive(Debug)]
struct SubscriberFailed {
    name: Arc<str>,
    error: Error,
}

impl std::fmt::Display for SubscriberFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "subscriber `{}` failed", self.name)
    }
}

impl std::error::Error for SubscriberFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// What a consumer of a queue runs for each message: one handler, or the
/// subscribers of a fan-out.
pub enum Handling<M> {
    /// One handler (`Consumer::new`).
    One(Handler<M>),
    /// Several (`Consumer::fan_out`, then `subscribe` for each).
    Fanned(Vec<Subscriber<M>>),
}

impl<M> std::fmt::Debug for Handling<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Handling::One(_) => f.write_str("One"),
            Handling::Fanned(subs) => f.debug_tuple("Fanned").field(subs).finish(),
        }
    }
}

impl<M: Clone + Send + 'static> Handling<M> {
    /// Subscribes `h` as `name` (`of` names the queue in the messages).
    ///
    /// # Panics
    /// On a consumer of one handler, or a second subscriber of that name.
    pub fn subscribe(&mut self, of: &str, name: String, h: Handler<M>) {
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
    pub fn into_handler(self, of: &str) -> Result<Handler<M>, Error> {
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
    pub fn names(&self) -> Vec<Arc<str>> {
        match self {
            Handling::One(_) => Vec::new(),
            Handling::Fanned(subs) => subs.iter().map(|s| s.name.clone()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::classify::tests::db;
    use crate::consume::Failure;

    fn failing(e: fn() -> Error) -> Handler<()> {
        Arc::new(move |_: ()| Ok(Box::pin(async move { Err(e()) }) as BoxFuture<_>))
    }

    fn succeeding() -> Handler<()> {
        Arc::new(|_: ()| Ok(Box::pin(async { Ok(true) }) as BoxFuture<_>))
    }

    fn subscribers(handlers: Vec<Handler<()>>) -> Vec<Subscriber<()>> {
        let mut subs = Vec::new();
        for (k, h) in handlers.into_iter().enumerate() {
            add(&mut subs, "topic `t`", format!("s{k}"), h);
        }
        subs
    }

    /// A subscriber that lost a deadlock fails the fanned-out message with
    /// an error that still says so (a relay batch takes it for its own
    /// contention, not for the message's failure), and names the
    /// subscriber; any other error does not read as a conflict.
    #[tokio::test]
    async fn a_subscribers_conflict_stays_a_conflict() {
        let deadlock = || Error::from_handler(Box::new(db("40P01", "deadlock detected")));
        let duplicate = || Error::from_handler(Box::new(db("23505", "duplicate key")));
        for (first, conflict) in [(failing(deadlock), true), (failing(duplicate), false)] {
            let fanned = fan_out(subscribers(vec![first, succeeding()]), |_, _| ());
            let Err(e) = fanned(()).expect("no payload to parse").await else {
                panic!("the failing subscriber fails the message");
            };
            let failure = Failure::of(&e);
            assert_eq!(failure.conflict, conflict, "{e}");
            assert!(
                failure.reason.contains("subscriber `s0`"),
                "{}",
                failure.reason
            );
        }
    }
}

//! Relay routes under the harness: the user's route handler wrapped (a
//! [`Tap`]) so that the run learns when a relay starts the handler and what
//! it answers, can hold it before it starts, and can make its relay die
//! right after it, before the relay records anything.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_runtime::Outcome;
use idem_runtime::outbox::{Delivery, Relay};
use serde::de::DeserializeOwned;
use sqlx::Pool;
use tokio::sync::{Semaphore, mpsc};
use tracing::Dispatch;
use tracing::instrument::{Instrument, WithSubscriber};

use crate::answer::{Answer, Local};
use crate::backend::TestBackend;
use crate::keys::Keys;

/// Registers the wrapped handler on a relay.
type RegisterFn<DB> = Box<dyn Fn(Relay<DB>, Arc<Tap>) -> Relay<DB>>;
/// Enqueues one action's message.
pub(crate) type EnqueueFn<DB, I> =
    Box<dyn Fn(Pool<DB>, I) -> Local<'static, Result<(), idem_runtime::Error>>>;

/// The route under test: its topic and how to register it.
pub(crate) struct Route<DB: TestBackend> {
    pub(crate) topic: String,
    register: RegisterFn<DB>,
}

/// The lease of the harness's relays: long enough that no renewal falls
/// inside a scenario; the run expires a lease itself where it needs to.
const LEASE: Duration = Duration::from_secs(60);

impl<DB: TestBackend> Route<DB> {
    /// A relay on `pool` named `owner`, with the route wrapped in `tap`:
    /// one handler at a time (so that it makes no other commit while the
    /// handler runs), polling every 10 ms, retrying within 100 ms.
    pub(crate) fn relay(&self, pool: &Pool<DB>, tap: &Arc<Tap>, owner: &str) -> Relay<DB> {
        let relay = Relay::new(pool.clone())
            .owner(owner)
            .lease(LEASE)
            .concurrency(1)
            .poll_interval(Duration::from_millis(10))
            .backoff(Duration::from_millis(10), Duration::from_millis(100))
            .heartbeat_interval(Duration::from_secs(3600));
        (self.register)(relay, tap.clone())
    }
}

/// A relay owner name no other relay uses, on this or an earlier run: its
/// lease is expired by owner, on a server other tests share.
pub(crate) fn owner(who: Who) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() % 1_000_000_000_000);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    format!(
        "idem-test-{}-{}-{nanos}-{n}",
        who.letter(),
        std::process::id()
    )
}

impl<DB: TestBackend> Route<DB> {
    /// `handler` on `topic`, wrapped in each relay's tap.
    pub(crate) fn new<P, F, Fut, T>(topic: &str, handler: F) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(Delivery<DB>, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, idem_runtime::Error>> + Send + 'static,
        T: Send + 'static,
    {
        let handler = Arc::new(handler);
        let name = topic.to_owned();
        let register: RegisterFn<DB> = Box::new(move |relay, tap| {
            let handler = handler.clone();
            relay.route(name.clone(), move |d, p: P| {
                tap.clone().around(handler(d, p))
            })
        });
        Route {
            topic: topic.to_owned(),
            register,
        }
    }
}

/// Which of a scenario's two relays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Who {
    A,
    B,
}

impl Who {
    pub(crate) fn letter(self) -> char {
        match self {
            Who::A => 'a',
            Who::B => 'b',
        }
    }
}

/// What a tapped handler reports to the run.
#[derive(Debug)]
pub(crate) enum Event {
    /// The relay started the handler (it waits there while held).
    Entered(Who),
    /// The handler answered.
    Answered(Who, Answer),
}

/// The harness's wrapper around one relay's handler.
#[derive(Debug)]
pub(crate) struct Tap {
    who: Who,
    action: usize,
    /// After its first answer, the relay "dies": the handler's future
    /// does not end while the run is there, so the relay records nothing
    /// until the run aborts it.
    dies: bool,
    /// Closed: handlers start at once; open with no permit: they wait.
    go: Semaphore,
    events: mpsc::UnboundedSender<Event>,
    dispatch: Dispatch,
}

impl Tap {
    /// The tap of relay `who` for action `action`; `held`: its handlers
    /// wait for [`release`](Self::release) before they start.
    pub(crate) fn new(
        who: Who,
        action: usize,
        held: bool,
        dies: bool,
        events: &mpsc::UnboundedSender<Event>,
        dispatch: &Dispatch,
    ) -> Arc<Tap> {
        let tap = Tap {
            who,
            action,
            dies,
            go: Semaphore::new(0),
            events: events.clone(),
            dispatch: dispatch.clone(),
        };
        if !held {
            tap.release();
        }
        Arc::new(tap)
    }

    /// Lets every handler of this relay start, now and from now on.
    pub(crate) fn release(&self) {
        self.go.close();
    }

    /// Runs one delivery's handler `call` under the tap.
    async fn around<T, Fut>(self: Arc<Self>, call: Fut) -> Result<Outcome<T>, idem_runtime::Error>
    where
        Fut: Future<Output = Result<Outcome<T>, idem_runtime::Error>>,
    {
        let _ = self.events.send(Event::Entered(self.who));
        // Closed (released): `Err` at once. Never given a permit.
        let _ = self.go.acquire().await;
        let span = Keys::span(&self.dispatch, self.action);
        let result = call
            .instrument(span)
            .with_subscriber(self.dispatch.clone())
            .await;
        let answer = match &result {
            Ok(Outcome::Executed(_)) => Answer::Executed,
            Ok(Outcome::Duplicate(_)) => Answer::Duplicate,
            Err(e) => Answer::Failed(e.to_string()),
        };
        let _ = self.events.send(Event::Answered(self.who, answer));
        if self.dies {
            // Until the run aborts this relay; or, if the run itself was
            // dropped (its receiver with it), no longer: the relay then
            // settles the delivery and stops instead of waiting forever.
            self.events.closed().await;
        }
        result
    }
}

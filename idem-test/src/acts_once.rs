//! The run's description ([`ActsOnce`]) and its driver.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use idem_runtime::Outcome;
use idem_runtime::outbox::Delivery;
use serde::de::DeserializeOwned;
use sqlx::Pool;

pub(crate) use crate::answer::{Answer, Local};
use crate::backend::TestBackend;
use crate::error::Error;
use crate::relay::{EnqueueFn, Route};
use crate::scenario::Scenario;

pub(crate) type CallFn<DB, I> = Box<dyn Fn(Pool<DB>, I) -> Local<'static, Answer>>;
type SetupFn<DB> = Box<dyn Fn(Pool<DB>) -> Local<'static, Result<(), sqlx::Error>>>;
type PrepareFn<DB, I> = Box<dyn Fn(Pool<DB>, I) -> Local<'static, Result<(), sqlx::Error>>>;
type EffectFn<DB, I> = Box<dyn Fn(Pool<DB>, I) -> Local<'static, Result<i64, sqlx::Error>>>;

/// A proof that a handler acts once: the actions to run it on, how to
/// call it and how to count its effect, and the [`Scenario`]s to put it
/// through. [`run`](ActsOnce::run) gives a [`Report`](crate::Report).
///
/// `DB` is the handler's database, `I` the input of one action (its
/// message, its arguments). Action `n` is `input(n)`; each scenario takes
/// [`actions`](ActsOnce::actions) new ones, so `input` must give distinct
/// actions for distinct numbers.
pub struct ActsOnce<DB: TestBackend, I> {
    pub(crate) handler: String,
    pub(crate) url: Option<String>,
    pub(crate) input: Box<dyn Fn(usize) -> I>,
    pub(crate) setup: Option<SetupFn<DB>>,
    prepare: Option<PrepareFn<DB, I>>,
    pub(crate) call: Option<CallFn<DB, I>>,
    pub(crate) effect: Option<EffectFn<DB, I>>,
    /// The scenarios asked for; `None`: those the run's parts allow.
    pub(crate) scenarios: Option<Vec<Scenario>>,
    pub(crate) route: Option<Route<DB>>,
    pub(crate) enqueue: Option<EnqueueFn<DB, I>>,
    pub(crate) actions: usize,
    pub(crate) duplicates: usize,
    pub(crate) hold: Duration,
    pub(crate) expected: i64,
    pub(crate) retries: usize,
}

impl<DB: TestBackend, I> fmt::Debug for ActsOnce<DB, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActsOnce")
            .field("handler", &self.handler)
            .field("backend", &DB::LABEL)
            .field("scenarios", &self.scenarios)
            .field("actions", &self.actions)
            .field("duplicates", &self.duplicates)
            .field("hold", &self.hold)
            .field("expected", &self.expected)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "sqlite")]
impl<I: Clone + 'static> ActsOnce<sqlx::Sqlite, I> {
    /// A run on SQLite: a fresh database file of its own in the system's
    /// temporary directory (WAL mode, removed when the run ends). Nothing
    /// to set up.
    pub fn sqlite(handler: &str, input: impl Fn(usize) -> I + 'static) -> Self {
        Self::new(handler, None, input)
    }
}

#[cfg(feature = "postgres")]
impl<I: Clone + 'static> ActsOnce<sqlx::Postgres, I> {
    /// A run on the PostgreSQL server at `url`, through a fault proxy of
    /// the run's own. Name your tables so that they meet no other test's.
    pub fn postgres(handler: &str, url: &str, input: impl Fn(usize) -> I + 'static) -> Self {
        Self::new(handler, Some(url), input)
    }
}

#[cfg(feature = "mysql")]
impl<I: Clone + 'static> ActsOnce<sqlx::MySql, I> {
    /// A run on the MariaDB or MySQL server at `url`, through a fault
    /// proxy of the run's own.
    pub fn mysql(handler: &str, url: &str, input: impl Fn(usize) -> I + 'static) -> Self {
        Self::new(handler, Some(url), input)
    }
}

impl<DB: TestBackend, I: Clone + 'static> ActsOnce<DB, I> {
    /// A run of `handler` (its name in the report) on actions `input(0)`,
    /// `input(1)`, …, on the database at `url` (`None`: SQLite's own).
    pub fn new(handler: &str, url: Option<&str>, input: impl Fn(usize) -> I + 'static) -> Self {
        ActsOnce {
            handler: handler.to_owned(),
            url: url.map(str::to_owned),
            input: Box::new(input),
            setup: None,
            prepare: None,
            call: None,
            effect: None,
            scenarios: None,
            route: None,
            enqueue: None,
            actions: 4,
            duplicates: 8,
            hold: Duration::from_millis(200),
            expected: 1,
            retries: 3,
        }
    }

    /// Runs once, after idem's tables are migrated and before any call:
    /// create the handler's tables (drop what an earlier run left on a
    /// server). The pool is the one the calls get.
    pub fn setup<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Pool<DB>) -> Fut + 'static,
        Fut: Future<Output = Result<(), sqlx::Error>> + 'static,
    {
        self.setup = Some(Box::new(move |pool| Box::pin(f(pool))));
        self
    }

    /// Runs for each action before its scenario starts: seed the rows its
    /// call needs (the entity a `state_machine` handler moves).
    pub fn prepare<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Pool<DB>, I) -> Fut + 'static,
        Fut: Future<Output = Result<(), sqlx::Error>> + 'static,
    {
        self.prepare = Some(Box::new(move |pool, input| Box::pin(f(pool, input))));
        self
    }

    /// The call: your handler on the pool and one action's input. It may
    /// open its own transaction or be given one; it answers what the
    /// handler answered (`Outcome::Executed`, `Outcome::Duplicate`, an
    /// error).
    ///
    /// The future runs in the caller's task, so it need not be `Send`.
    /// While it runs, the default `tracing` subscriber is the run's own,
    /// which reads the key each call derives from the attribute's
    /// `idempotent` span: your handler's spans and events do not reach
    /// your subscriber then, and a call spawned onto another task shows no
    /// key in the report.
    pub fn call<F, Fut, T, E>(mut self, f: F) -> Self
    where
        F: Fn(Pool<DB>, I) -> Fut + 'static,
        Fut: Future<Output = Result<Outcome<T>, E>> + 'static,
        E: fmt::Display,
    {
        self.call = Some(Box::new(move |pool, input| {
            let call = f(pool, input);
            Box::pin(async move {
                match call.await {
                    Ok(Outcome::Executed(_)) => Answer::Executed,
                    Ok(Outcome::Duplicate(_)) => Answer::Duplicate,
                    Err(e) => Answer::Failed(e.to_string()),
                }
            })
        }));
        self
    }

    /// How much of one action's effect the database holds (a `COUNT(*)`
    /// of its rows, with the action's id bound): checked against
    /// [`expect_effect`](Self::expect_effect) once its calls are done.
    pub fn effect<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Pool<DB>, I) -> Fut + 'static,
        Fut: Future<Output = Result<i64, sqlx::Error>> + 'static,
    {
        self.effect = Some(Box::new(move |pool, input| Box::pin(f(pool, input))));
        self
    }

    /// The scenarios to run. By default, those the run's parts allow:
    /// [`Scenario::CALLS`] with a [`call`](Self::call),
    /// [`Scenario::RELAY`] with a [`route`](Self::route). With any of
    /// the call scenarios, [`Scenario::Single`] runs first.
    pub fn scenarios(mut self, scenarios: impl IntoIterator<Item = Scenario>) -> Self {
        let mut list: Vec<Scenario> = scenarios.into_iter().collect();
        if list.iter().any(|s| !s.through_relay()) {
            list.push(Scenario::Single);
        }
        list.sort();
        list.dedup();
        self.scenarios = Some(list);
        self
    }

    /// The scenarios the run takes (see [`scenarios`](Self::scenarios)).
    pub(crate) fn planned(&self) -> Vec<Scenario> {
        match &self.scenarios {
            Some(list) => list.clone(),
            None => Scenario::ALL
                .into_iter()
                .filter(|s| match s.through_relay() {
                    true => self.route.is_some(),
                    false => self.call.is_some(),
                })
                .collect(),
        }
    }

    /// Actions per scenario (default 4, at least 1).
    pub fn actions(mut self, n: usize) -> Self {
        self.actions = n.max(1);
        self
    }

    /// Calls of each action side by side in
    /// [`Scenario::ConcurrentDuplicates`] (default 8, at least 2).
    pub fn duplicates(mut self, n: usize) -> Self {
        self.duplicates = n.max(2);
        self
    }

    /// How long the first commit of each burst of duplicates is held, its
    /// locks kept, while the others run into it (default 200 ms).
    pub fn hold(mut self, hold: Duration) -> Self {
        self.hold = hold;
        self
    }

    /// The effect one action must leave (default 1).
    pub fn expect_effect(mut self, n: i64) -> Self {
        self.expected = n;
        self
    }

    /// Retries after a faulted call, until one answers (default 3, at
    /// least 1: a cancelled call left unretried would read as an effect
    /// the handler lost).
    pub fn retries(mut self, n: usize) -> Self {
        self.retries = n.max(1);
        self
    }

    /// Runs [`prepare`](Self::prepare) for action `n`.
    pub(crate) async fn prepare_action(&self, pool: &Pool<DB>, n: usize) -> Result<(), Error> {
        match &self.prepare {
            Some(prepare) => prepare(pool.clone(), (self.input)(n))
                .await
                .map_err(|source| Error::Fixture {
                    step: format!("prepare of action #{n}"),
                    source,
                }),
            None => Ok(()),
        }
    }

    /// Counts action `n`'s effect.
    pub(crate) async fn count_effect(&self, pool: &Pool<DB>, n: usize) -> Result<i64, Error> {
        let effect = self.effect.as_ref().ok_or_else(|| missing("effect"))?;
        effect(pool.clone(), (self.input)(n))
            .await
            .map_err(|source| Error::Fixture {
                step: format!("effect of action #{n}"),
                source,
            })
    }
}

impl<DB: TestBackend, I: Clone + 'static> ActsOnce<DB, I> {
    /// The route the relay scenarios ([`Scenario::RELAY`](crate::Scenario::RELAY))
    /// deliver through: `topic` and its handler, as you give them to
    /// [`Relay::route`](idem_runtime::outbox::Relay::route). Each relay the run starts routes `topic` to it,
    /// wrapped so that the run knows when the handler starts and what it
    /// answers. Name a topic of the run's own: a run refuses to start
    /// while messages of it are pending.
    pub fn route<P, F, Fut, T>(mut self, topic: &str, handler: F) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(Delivery<DB>, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, idem_runtime::Error>> + Send + 'static,
        T: Send + 'static,
    {
        self.route = Some(Route::new(topic, handler));
        self
    }

    /// How one action becomes a message on the route's topic: your
    /// producer's code, e.g. [`outbox::enqueue`](idem_runtime::outbox::enqueue)
    /// in a transaction of its own. The relay scenarios call it once per
    /// action.
    pub fn enqueue<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Pool<DB>, I) -> Fut + 'static,
        Fut: Future<Output = Result<(), idem_runtime::Error>> + 'static,
    {
        self.enqueue = Some(Box::new(move |pool, input| Box::pin(f(pool, input))));
        self
    }
}

pub(crate) fn missing(what: &str) -> Error {
    Error::Config(format!("the run has no `{what}`: set it with `.{what}(…)`"))
}

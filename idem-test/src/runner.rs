//! How a run goes: each scenario in turn, each action's calls under the
//! scenario's fault, then every action's effect counted.

use std::sync::Arc;

use futures_util::future::join_all;
use tracing::Dispatch;
use tracing::instrument::{Instrument, WithSubscriber};

use crate::acts_once::{ActsOnce, Answer, CallFn, missing};
use crate::backend::{Fixture, TestBackend};
use crate::error::Error;
use crate::keys::Keys;
use crate::report::{ActionReport, Report, ScenarioReport};
use crate::scenario::Scenario;
use crate::script::CommitFault;

impl<DB: TestBackend, I: Clone + 'static> ActsOnce<DB, I> {
    /// Runs every scenario and reports. An error means the run could not
    /// be made (a server down, a failing setup), never that the handler
    /// failed to act once: that is in the report.
    pub async fn run(&self) -> Result<Report, Error> {
        let planned = self.planned();
        if planned.is_empty() {
            return Err(missing("call"));
        }
        let call = match planned.iter().any(|s| !s.through_relay()) {
            true => Some(self.call.as_ref().ok_or_else(|| missing("call"))?),
            false => None,
        };
        self.effect.as_ref().ok_or_else(|| missing("effect"))?;
        let connections = u32::try_from(self.duplicates + 2).unwrap_or(u32::MAX);
        let fx = DB::open(self.url.as_deref(), connections).await?;
        idem_runtime::migrate(&fx.pool)
            .await
            .map_err(|e| Error::Config(format!("idem's migration failed: {e}")))?;
        if let Some(setup) = &self.setup {
            setup(fx.pool.clone())
                .await
                .map_err(|source| Error::Fixture {
                    step: "setup".into(),
                    source,
                })?;
        }
        let keys = Arc::new(Keys::default());
        let mut runner = Runner {
            spec: self,
            call,
            fx: &fx,
            dispatch: Keys::dispatch(&keys),
            keys,
            commits_per_call: 0,
        };
        if planned.iter().any(|s| s.through_relay()) {
            runner.check_topic().await?;
        }
        let mut scenarios = Vec::new();
        for (i, &scenario) in planned.iter().enumerate() {
            scenarios.push(runner.scenario(scenario, i * self.actions).await?);
        }
        fx.pool.close().await;
        Ok(Report {
            handler: self.handler.clone(),
            backend: DB::LABEL,
            scenarios,
        })
    }
}

/// The counts of one action's calls.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    calls: u64,
    executed: u64,
    duplicates: u64,
    failed: u64,
    first_error: Option<String>,
    pub(crate) faults: u64,
}

impl Tally {
    pub(crate) fn add(&mut self, answer: &Answer) {
        self.calls += 1;
        match answer {
            Answer::Executed => self.executed += 1,
            Answer::Duplicate => self.duplicates += 1,
            Answer::Failed(e) => {
                self.failed += 1;
                self.first_error.get_or_insert_with(|| e.clone());
            }
            Answer::Dropped => self.failed += 1,
        }
    }
}

/// One run: the spec, its database, and the keys its calls derive.
pub(crate) struct Runner<'a, DB: TestBackend, I> {
    pub(crate) spec: &'a ActsOnce<DB, I>,
    /// The call, when a call scenario runs.
    pub(crate) call: Option<&'a CallFn<DB, I>>,
    pub(crate) fx: &'a Fixture<DB>,
    pub(crate) keys: Arc<Keys>,
    pub(crate) dispatch: Dispatch,
    /// The most commits one call made in [`Scenario::Single`].
    pub(crate) commits_per_call: u64,
}

impl<DB: TestBackend, I: Clone + 'static> Runner<'_, DB, I> {
    /// Runs `scenario` on the actions numbered from `first`.
    pub(crate) async fn scenario(
        &mut self,
        scenario: Scenario,
        first: usize,
    ) -> Result<ScenarioReport, Error> {
        let numbers: Vec<usize> = (first..first + self.spec.actions).collect();
        for &n in &numbers {
            self.spec.prepare_action(&self.fx.pool, n).await?;
        }
        let mut actions = Vec::new();
        for (j, &n) in numbers.iter().enumerate() {
            let input = (self.spec.input)(n);
            let mut tally = Tally::default();
            let story = match scenario {
                Scenario::Single => self.single(n, input, &mut tally).await,
                Scenario::ConcurrentDuplicates => self.concurrent(n, input, &mut tally).await,
                Scenario::LostAcks => {
                    self.faulted(n, j, input, CommitFault::LoseAck, &mut tally)
                        .await?
                }
                Scenario::Cancelled => {
                    self.faulted(n, j, input, CommitFault::Cut, &mut tally)
                        .await?
                }
                Scenario::RelayRestarted => self.restarted(n, j, &mut tally).await?,
                Scenario::LeaseExpired => self.lease_expired(n, &mut tally).await?,
            };
            actions.push(self.action_report(n, tally, story).await?);
        }
        for a in &mut actions {
            a.sharing = self.keys.sharing(a.action);
        }
        Ok(ScenarioReport { scenario, actions })
    }

    async fn action_report(
        &self,
        n: usize,
        t: Tally,
        story: String,
    ) -> Result<ActionReport, Error> {
        let effect = self.spec.count_effect(&self.fx.pool, n).await?;
        Ok(ActionReport {
            action: n,
            keys: self.keys.of(n),
            calls: t.calls,
            executed: t.executed,
            duplicates: t.duplicates,
            failed: t.failed,
            first_error: t.first_error,
            faults: t.faults,
            effect,
            expected: self.spec.expected,
            story,
            sharing: Vec::new(),
        })
    }

    /// One call of action `n`, in a span that ties its key to it.
    async fn invoke(&self, n: usize, input: I) -> Answer {
        let Some(call) = self.call else {
            return Answer::Failed("the run has no `call`".into());
        };
        let span = Keys::span(&self.dispatch, n);
        call(self.fx.pool.clone(), input)
            .instrument(span)
            .with_subscriber(self.dispatch.clone())
            .await
    }

    async fn single(&mut self, n: usize, input: I, tally: &mut Tally) -> String {
        let before = self.fx.faults.commits();
        let answer = self.invoke(n, input).await;
        let commits = self.fx.faults.commits() - before;
        self.commits_per_call = self.commits_per_call.max(commits);
        tally.add(&answer);
        format!("its one call answered {answer}, after {commits} commit(s)")
    }

    async fn concurrent(&self, n: usize, input: I, tally: &mut Tally) -> String {
        let duplicates = self.spec.duplicates;
        let mut fired = self.fx.faults.arm(1, CommitFault::Hold(self.spec.hold));
        let calls = (0..duplicates).map(|_| self.invoke(n, input.clone()));
        let answers = join_all(calls).await;
        self.fx.faults.disarm();
        if fired.try_recv().is_ok() {
            tally.faults += 1;
        }
        answers.iter().for_each(|a| tally.add(a));
        format!(
            "{} of {duplicates} concurrent calls executed, {} answered Duplicate, {} failed",
            tally.executed, tally.duplicates, tally.failed
        )
    }

    /// Action `n` (the `j`-th of its scenario) with `fault` on one of its
    /// commits, then retried until a call answers.
    async fn faulted(
        &self,
        n: usize,
        j: usize,
        input: I,
        fault: CommitFault,
        tally: &mut Tally,
    ) -> Result<String, Error> {
        let per_call = self.commits_per_call.max(1);
        let nth = 1 + j as u64 % per_call;
        let faults = &self.fx.faults;
        let mut fired = faults.arm(nth, fault);
        let answer = if faults.drops_the_call() {
            let call = self.invoke(n, input.clone());
            let answer = tokio::select! {
                biased;
                Ok(()) = &mut fired => Answer::Dropped,
                answer = call => answer,
            };
            // The commit may end, and the call with it, between the two
            // branches' polls: its answer is then dropped all the same (the
            // faulted commit was its last step).
            match fired.try_recv() {
                Ok(()) => Answer::Dropped,
                Err(_) => answer,
            }
        } else {
            self.invoke(n, input.clone()).await
        };
        faults.disarm();
        let injected = matches!(answer, Answer::Dropped) || fired.try_recv().is_ok();
        if matches!(answer, Answer::Dropped) {
            faults.settle().await.map_err(Error::Database)?;
        }
        tally.add(&answer);
        tally.faults += u64::from(injected);
        let mut last = answer;
        let mut retries = 0;
        while matches!(last, Answer::Failed(_) | Answer::Dropped) && retries < self.spec.retries {
            last = self.invoke(n, input.clone()).await;
            tally.add(&last);
            retries += 1;
        }
        let what = match (fault, injected) {
            (_, false) => {
                return Ok(format!(
                    "no fault injected (its call made fewer than {nth} commits), the call answered {last}"
                ));
            }
            (CommitFault::Cut, true) => "was cancelled at",
            _ => "lost the acknowledgement of",
        };
        Ok(format!(
            "its call {what} its commit {nth} of {per_call}, then {retries} retr{} answered {last}",
            if retries == 1 { "y" } else { "ies" }
        ))
    }
}

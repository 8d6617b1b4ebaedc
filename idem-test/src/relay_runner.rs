//! The relay scenarios: each action's message delivered by real relays,
//! one of which dies mid-delivery ([`Scenario::RelayRestarted`]) or loses
//! its lease to another ([`Scenario::LeaseExpired`]).
//!
//! [`Scenario::RelayRestarted`]: crate::Scenario::RelayRestarted
//! [`Scenario::LeaseExpired`]: crate::Scenario::LeaseExpired

use std::time::{Duration, Instant};

use idem_runtime::outbox::RelayHandle;
use idem_runtime::outbox::admin;
use tokio::sync::mpsc;

use crate::acts_once::{Answer, missing};
use crate::backend::TestBackend;
use crate::error::Error;
use crate::relay::{Event, Route, Tap, Who, owner};
use crate::runner::{Runner, Tally};
use crate::script::CommitFault;

/// The longest wait for a relay to start a handler, answer, or drain its
/// topic: far longer than any of it takes (milliseconds); reached only
/// when the route's message never comes (see the errors).
const PATIENCE: Duration = Duration::from_secs(30);

/// What the tapped handlers reported, kept in order.
struct Events {
    rx: mpsc::UnboundedReceiver<Event>,
    seen: Vec<Event>,
}

impl Events {
    /// Waits for an event that `want` picks (kept ones first), removes it
    /// and returns it; `what` names it in the error.
    async fn take(&mut self, want: impl Fn(&Event) -> bool, what: &str) -> Result<Event, Error> {
        if let Some(i) = self.seen.iter().position(&want) {
            return Ok(self.seen.remove(i));
        }
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(e)) if want(&e) => return Ok(e),
                Ok(Some(e)) => self.seen.push(e),
                Ok(None) | Err(_) => {
                    return Err(Error::Config(format!("{what} within {PATIENCE:?}")));
                }
            }
        }
    }

    async fn entered(&mut self, who: Who) -> Result<(), Error> {
        let what = format!(
            "relay {} never started the handler (does `enqueue` write a message of the \
             route's topic, whose payload the route's type accepts?)",
            who.letter()
        );
        self.take(|e| matches!(e, Event::Entered(w) if *w == who), &what)
            .await
            .map(drop)
    }

    async fn answered(&mut self, who: Who) -> Result<Answer, Error> {
        let what = format!(
            "relay {}'s handler never answered (did it panic, or wait on something?)",
            who.letter()
        );
        match self
            .take(|e| matches!(e, Event::Answered(w, _) if *w == who), &what)
            .await?
        {
            Event::Answered(_, answer) => Ok(answer),
            Event::Entered(_) => unreachable!("picked an answer"),
        }
    }

    /// The answers left: later deliveries (retries) of either relay.
    fn rest(&mut self) -> Vec<Answer> {
        while let Ok(e) = self.rx.try_recv() {
            self.seen.push(e);
        }
        self.seen
            .drain(..)
            .filter_map(|e| match e {
                Event::Answered(_, a) => Some(a),
                Event::Entered(_) => None,
            })
            .collect()
    }
}

/// One action's message enqueued, relay A spawned on it, and what the
/// relays' taps report on.
struct Stage {
    topic: String,
    /// The topic's dead letters before the action.
    failed_before: i64,
    tx: mpsc::UnboundedSender<Event>,
    events: Events,
    a_owner: String,
    tap_a: std::sync::Arc<Tap>,
    a: RelayHandle,
}

/// How a topic's messages stand once drained.
struct Drained {
    /// Still pending after [`PATIENCE`].
    pending: i64,
    /// Dead-lettered by this action.
    failed: i64,
}

impl<DB: TestBackend, I: Clone + 'static> Runner<'_, DB, I> {
    fn route(&self) -> Result<&Route<DB>, Error> {
        self.spec.route.as_ref().ok_or_else(|| missing("route"))
    }

    /// Enqueues action `n`'s message.
    async fn enqueue(&self, n: usize) -> Result<(), Error> {
        let enqueue = self
            .spec
            .enqueue
            .as_ref()
            .ok_or_else(|| missing("enqueue"))?;
        enqueue(self.fx.pool.clone(), (self.spec.input)(n))
            .await
            .map_err(|source| Error::Enqueue { action: n, source })
    }

    /// The topic's pending and dead-lettered messages.
    async fn open_messages(&self, topic: &str) -> Result<(i64, i64), Error> {
        let stats = admin::backlog(&self.fx.pool, Some(topic))
            .await
            .map_err(|e| Error::Config(format!("reading the outbox failed: {e}")))?;
        Ok((stats.totals.pending, stats.totals.failed))
    }

    /// Waits (a running relay delivering) until none of the topic's
    /// messages is pending, at most [`PATIENCE`].
    async fn drain(&self, topic: &str, failed_before: i64) -> Result<Drained, Error> {
        let started = Instant::now();
        loop {
            let (pending, failed) = self.open_messages(topic).await?;
            if pending == 0 || started.elapsed() > PATIENCE {
                return Ok(Drained {
                    pending,
                    failed: failed - failed_before,
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until relay `owner`'s row in `idem_process` is there
    /// (`present`) or gone: its heartbeat, written by a task of its own
    /// when it starts and deleted after it stops, is a commit that must
    /// not fall where a fault is armed.
    async fn process_row(&self, owner: &str, present: bool) -> Result<(), Error> {
        let started = Instant::now();
        loop {
            let rows = admin::processes(&self.fx.pool)
                .await
                .map_err(|e| Error::Config(format!("reading idem_process failed: {e}")))?;
            if rows.iter().any(|p| p.id == owner) == present {
                return Ok(());
            }
            if started.elapsed() > PATIENCE {
                let what = if present {
                    "never registered"
                } else {
                    "never unregistered"
                };
                return Err(Error::Config(format!(
                    "relay {owner} {what} in idem_process"
                )));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Refuses a topic with messages pending before the run: the run's
    /// relays would deliver them to the handler too.
    pub(crate) async fn check_topic(&self) -> Result<(), Error> {
        let topic = &self.route()?.topic;
        let (pending, _) = self.open_messages(topic).await?;
        match pending {
            0 => Ok(()),
            n => Err(Error::Config(format!(
                "topic {topic:?} has {n} pending message(s) already (an earlier run's?): give \
                 the route a topic of the run's own"
            ))),
        }
    }

    /// Enqueues action `n`'s message (the topic's dead letters counted
    /// before) and spawns relay A on it, its handlers held; `dies`: A dies
    /// after its handler's first answer.
    async fn stage(&self, n: usize, dies: bool) -> Result<Stage, Error> {
        let topic = self.route()?.topic.clone();
        let (_, failed_before) = self.open_messages(&topic).await?;
        self.enqueue(n).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let a_owner = owner(Who::A);
        let tap_a = Tap::new(Who::A, n, true, dies, &tx, &self.dispatch);
        let a = self.spawn(&tap_a, &a_owner)?;
        Ok(Stage {
            topic,
            failed_before,
            tx,
            events: Events {
                rx,
                seen: Vec::new(),
            },
            a_owner,
            tap_a,
            a,
        })
    }

    fn spawn(&self, tap: &std::sync::Arc<Tap>, owner: &str) -> Result<RelayHandle, Error> {
        Ok(self.route()?.relay(&self.fx.pool, tap, owner).spawn())
    }

    /// Action `n` (the `j`-th of its scenario): relay A dies in its
    /// handler, after its commit (`j` even) or with its commit cut (`j`
    /// odd); its lease is expired and relay B drains the topic.
    pub(crate) async fn restarted(
        &self,
        n: usize,
        j: usize,
        tally: &mut Tally,
    ) -> Result<String, Error> {
        let Stage {
            topic,
            failed_before,
            tx,
            mut events,
            a_owner,
            tap_a,
            a,
        } = self.stage(n, true).await?;
        events.entered(Who::A).await?;
        self.process_row(&a_owner, true).await?;
        let cut = j % 2 == 1;
        let mut fired = cut.then(|| self.fx.faults.arm(1, CommitFault::Cut));
        tap_a.release();
        let first = events.answered(Who::A).await;
        self.fx.faults.disarm();
        // Killed with its handler's future: it records nothing.
        let _ = a.shutdown_within(Duration::ZERO).await;
        let first = first?;
        self.process_row(&a_owner, false).await?;
        let was_cut = fired.as_mut().is_some_and(|f| f.try_recv().is_ok());
        tally.add(&first);
        tally.faults += u64::from(!cut || was_cut);
        DB::expire_lease(&self.fx.pool, &topic, &a_owner)
            .await
            .map_err(Error::Database)?;
        let tap_b = Tap::new(Who::B, n, false, false, &tx, &self.dispatch);
        let b_owner = owner(Who::B);
        let b = self.spawn(&tap_b, &b_owner)?;
        let drained = self.drain(&topic, failed_before).await?;
        let _ = b.shutdown_within(PATIENCE).await;
        self.process_row(&b_owner, false).await?;
        let later = events.rest();
        later.iter().for_each(|a| tally.add(a));
        let how = match (cut, was_cut) {
            (false, _) => "after its handler's transaction committed",
            (true, true) => "with its handler's commit cut",
            (true, false) => "in its handler (which made no commit to cut)",
        };
        Ok(format!(
            "relay A died {how}, its handler having answered {first}; then relay B {}",
            delivered(&later, &drained)
        ))
    }

    /// Action `n`: relay A claims it and stalls; its lease is expired and
    /// relay B reclaims it; both handlers then run side by side, the first
    /// commit held.
    pub(crate) async fn lease_expired(&self, n: usize, tally: &mut Tally) -> Result<String, Error> {
        let Stage {
            topic,
            failed_before,
            tx,
            mut events,
            a_owner,
            tap_a,
            a,
        } = self.stage(n, false).await?;
        let tap_b = Tap::new(Who::B, n, true, false, &tx, &self.dispatch);
        let b_owner = owner(Who::B);
        let mut b = None;
        let both = async {
            events.entered(Who::A).await?;
            let expired = DB::expire_lease(&self.fx.pool, &topic, &a_owner)
                .await
                .map_err(Error::Database)?;
            if expired != 1 {
                return Err(Error::Config(format!(
                    "relay A's lease on topic {topic:?} could not be expired ({expired} rows)"
                )));
            }
            b = Some(self.spawn(&tap_b, &b_owner)?);
            events.entered(Who::B).await?;
            self.process_row(&a_owner, true).await?;
            self.process_row(&b_owner, true).await?;
            let mut fired = self.fx.faults.arm(1, CommitFault::Hold(self.spec.hold));
            tap_a.release();
            tap_b.release();
            let answers = (events.answered(Who::A).await, events.answered(Who::B).await);
            self.fx.faults.disarm();
            tally.faults += u64::from(fired.try_recv().is_ok());
            Ok((answers.0?, answers.1?))
        };
        let both = both.await;
        tap_a.release();
        tap_b.release();
        let drained = match &both {
            Ok(_) => Some(self.drain(&topic, failed_before).await?),
            Err(_) => None,
        };
        let _ = a.shutdown_within(PATIENCE).await;
        if let Some(b) = b {
            let _ = b.shutdown_within(PATIENCE).await;
        }
        let (first_a, first_b) = both?;
        self.process_row(&a_owner, false).await?;
        self.process_row(&b_owner, false).await?;
        tally.add(&first_a);
        tally.add(&first_b);
        let later = events.rest();
        later.iter().for_each(|a| tally.add(a));
        let drained = drained.unwrap_or(Drained {
            pending: 0,
            failed: 0,
        });
        Ok(format!(
            "relay A's lease ran out before its handler started and relay B reclaimed the \
             message; side by side, A's handler answered {first_a}, B's {first_b}{}",
            after(&later, &drained)
        ))
    }
}

/// What relay B did, in words.
fn delivered(answers: &[Answer], drained: &Drained) -> String {
    let mut text = match answers {
        [] => "had nothing to deliver (the message was settled)".to_owned(),
        _ => format!("delivered it: {}", list(answers)),
    };
    text.push_str(&settled(drained));
    text
}

/// What the relays did after the two first answers, in words.
fn after(answers: &[Answer], drained: &Drained) -> String {
    let mut text = match answers {
        [] => String::new(),
        _ => format!("; then a retry: {}", list(answers)),
    };
    text.push_str(&settled(drained));
    text
}

fn list(answers: &[Answer]) -> String {
    answers
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn settled(d: &Drained) -> String {
    match (d.pending, d.failed) {
        (0, 0) => String::new(),
        (0, f) => format!("; the message was dead-lettered ({f})"),
        (p, _) => format!("; {p} message(s) still pending after {PATIENCE:?}"),
    }
}

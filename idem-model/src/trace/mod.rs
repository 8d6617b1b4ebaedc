//! Conformance: a trace of the relay's protocol events, as the runtime
//! records them (its `testing` feature), replayed through the model's step
//! relation. Every observed step must be one the model allows from the
//! state reached so far, with the outcome observed, and every state reached
//! must satisfy the invariants.
//!
//! # The events
//!
//! One JSON object per event, in the order the database saw them (a
//! single process's order of emission is enough for one relay process; a
//! trace of several processes must be merged in the database's order, e.g.
//! by a sequence taken in the statement's own transaction). Every event
//! names its `kind`; all but the two batch events also name the outbox
//! row (`msg`, its `id`), the claim's lease owner (`owner`, the
//! `relay#seq` the claim wrote) and the attempt the claim wrote
//! (`attempt`). Fields not listed are ignored (a `topic`, a `relay`, a
//! timestamp may be added freely).
//!
//! ```json
//! {"kind":"claim","msg":7,"attempt":1,"owner":"r1#4","outcome":"ok"}
//! {"kind":"claim","msg":7,"attempt":2,"owner":"r1#5","outcome":"lost_ack"}
//! {"kind":"claim","msg":7,"attempt":0,"owner":"r1#6","outcome":"refused"}
//! {"kind":"claim","msg":9,"attempt":1,"owner":"r2#3","outcome":"ok","key":"order-42"}
//! {"kind":"claim_read_back","msg":7,"attempt":2,"owner":"r1#5","held":true}
//! {"kind":"renew","msg":7,"attempt":2,"owner":"r1#5","renewed":true}
//! {"kind":"fenced_update","msg":7,"attempt":2,"owner":"r1#5","held":true}
//! {"kind":"guard","msg":7,"attempt":2,"owner":"r1#5","done":false}
//! {"kind":"effect","msg":7,"attempt":2,"owner":"r1#5"}
//! {"kind":"aborted","msg":7,"attempt":2,"owner":"r1#5"}
//! {"kind":"transition","msg":7,"attempt":2,"owner":"r1#5","ok":true}
//! {"kind":"commit","msg":7,"attempt":2,"owner":"r1#5","outcome":"ok","dup":false}
//! {"kind":"marker","msg":7,"attempt":2,"owner":"r1#5"}
//! {"kind":"landed","msg":7,"attempt":2,"owner":"r1#5","success":true}
//! {"kind":"settle","msg":7,"attempt":2,"owner":"r1#5","dead":false,"retryable":true,"applied":true}
//! {"kind":"settle","msg":7,"attempt":3,"owner":"r2#1","dead":true,"retryable":true,"applied":true,"in_tx":true}
//! {"kind":"relay_mark","msg":7,"attempt":2,"owner":"r1#5","applied":true}
//! {"kind":"batch_open","owner":"r3#2","renewed":[7,8]}
//! {"kind":"batch_open","owner":"r3#3","renewed":[],"begun":false}
//! {"kind":"batch_commit","owner":"r3#2","outcome":"ok"}
//! ```
//!
//! - `claim`: one per row a claim took, each with the claim's outcome:
//!   `ok` (committed, acknowledged), `lost_ack` (the outcome unknown to the
//!   relay: applied or not, the read-back tells), `refused` (nothing
//!   applied, known). `attempt` is the row's `attempts` after the claim;
//!   for a claim that is not `ok` it may be `0` (unknown), and is then
//!   taken from the model. `key`: the row's ordering key, absent for a
//!   row without one (see *Ordering keys* below).
//! - `claim_read_back`: the read-back of a `lost_ack` claim (`held`: the
//!   row is pending under the claim's owner, its lease running; a failed
//!   read is `held: false`).
//! - `renew`: a lease renewal under the claim's owner. On the per-message
//!   path after a batch that did not commit, it is the step that decides
//!   whether the message is still this claim's (`renewed: false`: left to
//!   its holder); anywhere else it is the heartbeat's, and `renewed: true`
//!   requires the row to be held by the claim.
//! - `fenced_update`: the handler's transaction's fenced success update
//!   (`held`: it updated one row).
//! - `guard`: the state check (`done`: the action is already done, the
//!   call answers `Duplicate`).
//! - `effect`: the handler body's write, in the call's transaction; for a
//!   route whose handler does not take its delivery's source (a
//!   publisher), its publish (see below).
//! - `aborted`: the handler's call whose transaction aborted before its
//!   end (a statement of it failed: `BEGIN`, the fenced update, the state
//!   check; a lost connection, a Galera certification failure); replayed
//!   as the body failing, its transaction rolled back.
//! - `transition`: the guarded transition (`ok: true`), or the body's
//!   failure (`ok: false`, the transaction rolled back); for a publisher
//!   route, the handler's answer.
//! - `commit`: the handler's transaction's `COMMIT`: `ok`, `lost_ack` (the
//!   outcome unknown: applied or not), `failed` (refused, nothing
//!   applied); `dup`: the call answered `Duplicate`.
//! - `marker`: the cache marker written after an acknowledged commit
//!   (none is required: a relay without a cache writes none).
//! - `landed`: the read-back of a handler commit whose outcome was
//!   unknown (`success`: the row is `success`; a failed read is `false`).
//! - `settle`: the failure bookkeeping, fenced by owner and attempt:
//!   `dead` (the relay's decision: not retryable, or `attempt >=
//!   max_attempts`), `retryable` (the error's class), `applied` (it
//!   changed the row, after its retries and read-back). `in_tx: true`: the
//!   bookkeeping written in the handler's own transaction (rolled back to
//!   the savepoint after the fenced update, then committed with the
//!   `commit` event that follows) rather than on the pool.
//! - `relay_mark`: the relay-side success mark of a route whose handler
//!   did not take its source (`outbox_success_pool`, fenced, retried and
//!   read back after a lost acknowledgement); `applied`: the relay
//!   confirmed it (`false`: stale, or every try failed).
//! - `batch_open`: a batch's `BEGIN` and renewal (`renewed`: the ids the
//!   renewal returned with the claim's attempts; `begun: false`, default
//!   `true`: `BEGIN` failed, every message goes the per-message path).
//!   It concerns every row claimed under `owner`.
//! - `batch_commit`: the deferred success update and the batch's
//!   `COMMIT`: `ok`, `lost_ack`, `failed` (refused), `short` (the update
//!   matched fewer rows than expected: rolled back). The handlers' own
//!   steps in a batch are `guard`, `effect`, `transition` events under the
//!   batch's owner.
//!
//! # The projection
//!
//! The model holds two rows; a trace holds any number of messages and
//! claims. Each message is checked on its own (the protocol's steps for
//! one row read and write that row, its entity, and the transactions that
//! lock it): its row is the model's row 0, acting on an entity of its own,
//! and each claim of it (each lease owner) is a model relay of its own
//! (a model relay runs one claim at a time; a real relay running many is,
//! to the protocol, several relays). A claim of several rows in one batch
//! is, for each of its rows, a batch of that row: the batch's `short`
//! outcome, caused by another row, is to this row a refused commit (the
//! same per-message path follows).
//!
//! What the trace does not show, the checker supplies:
//!
//! - time: a lease runs out whenever the model lets it (`Expire`, with
//!   `long_transactions`: a transaction may outlive its lease), taken when
//!   a claim finds the row's lease running; a lease the model says was
//!   looked after is a stall (counted in [`CheckReport::stalls`]);
//! - hidden outcomes: a `lost_ack` commit is followed both as applied and
//!   as not applied (a set of candidate states, narrowed by the read-backs
//!   that follow); a failed read and a refused fence look alike;
//! - crashes: a claim whose events stop before its delivery ends is taken
//!   to have crashed after its last event, its transaction aborted (a
//!   killed process, a dropped future, the end of the test); with
//!   [`TraceConfig::killed`], also after one more statement that it never
//!   reported, with any outcome, and a claim may be missing altogether;
//! - the route: a delivery whose first event after its claim is an
//!   `effect` or a `transition` (no `fenced_update`) runs on the relay's
//!   own path (a publisher route, or a handler failing before its call);
//! - the error class: a `settle`'s `retryable` is the handler's to choose;
//! - the protocol's version: a claim with a `settle` whose `in_tx` is set
//!   is replayed on the protocol with issue 23's fix (the failure
//!   bookkeeping in the handler's transaction, or the batch's, and on the
//!   pool only after that transaction was lost), any other on the relay's
//!   earlier protocol (the bookkeeping on the pool after the rollback).
//!
//! Faults are not bounded: the trace's lost acknowledgements are whatever
//! the run injected.
//!
//! # Ordering keys
//!
//! A claim carrying a `key` took a row under the head rule: no other
//! `pending` row of the key with a smaller id, none holding a running
//! lease (and, with [`KeyMode::Hold`], no `failed` one with a smaller id).
//! Across the messages of a key seen in the trace (each through the
//! `key` of its claims; ids give the enqueue order), every `ok` claim of
//! a keyed message is checked against the others, at the claim:
//!
//! - a message of the key with a smaller id must be settled: `success`
//!   committed, or dead-lettered (`failed`; with [`KeyMode::Hold`], only
//!   `success`);
//! - no other message of the key may be in flight: `pending` and held by
//!   a claim still delivering it (its events not ended; a claim whose
//!   events stopped is taken to have crashed, its lease to have run out).
//!
//! Where a lost acknowledgement leaves a message's outcome open, the
//! claim tells: the candidate states where that message blocks the claim
//! are dropped; with none left, the claim is a violation. A message is
//! known to the key from its first claim on; the rule is checked only
//! among the messages checked (see [`TraceConfig::messages`]).
//! [`check`] checks the default mode, [`KeyMode::Continue`];
//! [`check_ordered`] takes the relay's mode.
//!
//! Events of a message outside [`TraceConfig::messages`] (when it is set)
//! are skipped and counted in [`CheckReport::ignored`]: a trace may hold
//! messages of routes the run does not check. Without it, every message is
//! checked; an event for a claim the trace never showed is a violation.

mod checker;
mod event;
mod keys;
mod relay;
mod replay;

pub use crate::KeyMode;
pub use checker::{CheckReport, INVARIANTS, TraceConfig, Violation, check, check_ordered};
pub use event::{BatchOutcome, ClaimOutcome, CommitOutcome, Event};

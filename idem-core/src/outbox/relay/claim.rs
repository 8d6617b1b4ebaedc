//! Claims: due messages leased under an owner of their own, spread over
//! the due set while there is a backlog, claimed again after a conflict,
//! and read back when a claim's commit outcome is unknown (see the
//! [module documentation](super)).

use super::Inner;
use crate::Error;
use crate::backend::{Backend, ClaimError, Claimed, OutboxRow};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The waits before each read-back of a claim whose commit outcome is
/// unknown (a fresh connection each time).
const RECOVERY_WAITS: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_millis(20),
    Duration::from_millis(100),
    Duration::from_millis(400),
];

/// How many times in a row a claim that lost a conflict (see the module
/// documentation) is retried at once before the relay waits out its poll
/// interval.
pub(super) const CONFLICT_RETRIES: u32 = 3;

/// One claim's rows, and the lease owner that claim wrote.
pub(super) struct Batch {
    pub(super) owner: Arc<str>,
    pub(super) rows: Vec<OutboxRow>,
}

/// What one claim produced.
pub(super) enum Round {
    /// Rows to deliver.
    Claimed(Batch),
    /// A claim whose commit outcome is unknown, to read back.
    Lost {
        owner: Arc<str>,
        chosen: Claimed,
        error: sqlx::Error,
    },
}

impl<DB: Backend> Inner<DB> {
    /// Claims up to `n` messages, reading back a claim whose commit
    /// outcome is unknown before it returns.
    pub(super) async fn claim_up_to(&self, n: i64) -> Result<Batch, Error> {
        match self.claim_round(n).await? {
            Round::Claimed(batch) => Ok(batch),
            Round::Lost {
                owner,
                chosen,
                error,
            } => self.recover(owner, chosen, error).await,
        }
    }

    /// Claims up to `n` messages: at a spread offset while there is a
    /// backlog, again at once (after a few milliseconds of jitter) when
    /// the claim lost a conflict, at most `CONFLICT_RETRIES` times.
    pub(super) async fn claim_round(&self, n: i64) -> Result<Round, Error> {
        let i = self;
        let limit = n.min(i.claiming.batch_size);
        let mut conflicts = 0;
        loop {
            let owner: Arc<str> = i.claim_owner().into();
            if i.routing.topics.is_empty() {
                return Ok(Round::Claimed(Batch {
                    owner,
                    rows: Vec::new(),
                }));
            }
            let mut offset = i.spread_offset(limit);
            let mut claimed = self.claim_at(&owner, limit, offset).await;
            if offset > 0 && matches!(&claimed, Ok(c) if c.rows.is_empty()) {
                // The due set ends before the offset: from the oldest.
                offset = 0;
                claimed = self.claim_at(&owner, limit, 0).await;
            }
            // A claim's `at` is taken after it: a claim can take a message
            // only once its previous holder's last write has committed
            // (whose `at` is taken before it), and on SQLite the claim
            // waits for the write lock inside its statement.
            let at = crate::probe::now();
            match claimed {
                Ok(claimed) => {
                    trace_claim(&claimed.rows, &owner, "ok", None, at);
                    let n = claimed.rows.len() as i64;
                    i.claiming.backlog.store(n >= limit, Ordering::Relaxed);
                    i.claiming
                        .emptied
                        .store(n < limit && offset == 0, Ordering::Relaxed);
                    let batch = self.counted(owner, claimed);
                    return Ok(Round::Claimed(self.uncount_reclaimed(batch).await));
                }
                Err(ClaimError::Failed(e)) if crate::backend::classify::is_conflict(&e) => {
                    i.stats.claim_conflicts.fetch_add(1, Ordering::Relaxed);
                    if conflicts >= CONFLICT_RETRIES {
                        return Err(e.into());
                    }
                    conflicts += 1;
                    let jitter = Duration::from_micros(500 + random() % 4_500);
                    tracing::debug!(
                        error = %format_args!("{e:#}"),
                        offset,
                        retry = conflicts,
                        retry_in = ?jitter,
                        "outbox claim lost a conflict with a concurrent claim; claiming again"
                    );
                    tokio::time::sleep(jitter).await;
                }
                Err(ClaimError::Failed(e)) => return Err(e.into()),
                Err(ClaimError::CommitUnknown { error, chosen }) => {
                    trace_claim(&chosen.rows, &owner, "lost_ack", None, at);
                    i.stats.lost_claims.fetch_add(1, Ordering::Relaxed);
                    if !i.claiming.recover_claims {
                        return Err(Error::CommitUnknown(error));
                    }
                    return Ok(Round::Lost {
                        owner,
                        chosen,
                        error,
                    });
                }
            }
        }
    }

    /// One claim statement of up to `limit` rows, skipping `offset` due
    /// rows.
    async fn claim_at(&self, owner: &str, limit: i64, offset: i64) -> Result<Claimed, ClaimError> {
        let i = self;
        i.stats.claims.fetch_add(1, Ordering::Relaxed);
        // The topics whose gate an outage closed, and those at their
        // limit, are left out.
        let topics = i.limits.open(i.gates.open(&i.routing.topics));
        crate::probe::before_claim().await;
        DB::claim_outbox(
            &i.pool,
            &i.claiming.claim,
            owner,
            &topics,
            limit,
            offset,
            i.policy.lease.as_secs_f64(),
        )
        .await
    }

    /// The rows of a claim by `owner`, counted.
    fn counted(&self, owner: Arc<str>, claimed: Claimed) -> Batch {
        let stats = &self.stats;
        stats
            .claimed
            .fetch_add(claimed.rows.len() as u64, Ordering::Relaxed);
        stats
            .reclaimed
            .fetch_add(claimed.reclaimed as u64, Ordering::Relaxed);
        Batch {
            owner,
            rows: claimed.rows,
        }
    }

    /// Reads back the rows a claim by `owner` whose commit failed with
    /// `error` (outcome unknown) leased, if it landed; a few quick tries,
    /// each on a fresh connection.
    pub(super) async fn recover(
        &self,
        owner: Arc<str>,
        chosen: Claimed,
        mut error: sqlx::Error,
    ) -> Result<Batch, Error> {
        let i = self;
        let ids: Vec<i64> = chosen.rows.iter().map(|r| r.id).collect();
        for wait in RECOVERY_WAITS {
            tokio::time::sleep(wait).await;
            match DB::recover_claim(&i.pool, &owner, &ids).await {
                Ok(rows) => {
                    trace_claim(
                        &chosen.rows,
                        &owner,
                        "read_back",
                        Some(&rows),
                        crate::probe::now(),
                    );
                    i.stats
                        .recovered
                        .fetch_add(rows.len() as u64, Ordering::Relaxed);
                    tracing::info!(
                        owner = &*owner,
                        chosen = ids.len(),
                        recovered = rows.len(),
                        "outbox claim's commit outcome was unknown; read back"
                    );
                    // The commit is all or nothing: found, every chosen
                    // row was leased, those taken over included.
                    let reclaimed = if rows.is_empty() { 0 } else { chosen.reclaimed };
                    let batch = self.counted(owner, Claimed { rows, reclaimed });
                    return Ok(self.uncount_reclaimed(batch).await);
                }
                Err(e) => error = e,
            }
        }
        tracing::warn!(owner = &*owner, %error, "could not read back an outbox claim whose commit outcome is unknown; its messages wait out their lease");
        Err(Error::CommitUnknown(error))
    }
}

impl<DB: Backend> Inner<DB> {
    /// Where the next claim of `limit` rows starts in the due set: 0 with
    /// no backlog or no spread, else `k·limit` for a random `k` in
    /// `0..claim_spread`.
    fn spread_offset(&self, limit: i64) -> i64 {
        if self.claiming.claim_spread <= 1 || !self.claiming.backlog.load(Ordering::Relaxed) {
            return 0;
        }
        let k = random() % u64::from(self.claiming.claim_spread);
        i64::try_from(k).unwrap_or(0).saturating_mul(limit)
    }

    /// A lease owner no other claim writes: the relay's owner and the next
    /// sequence number.
    fn claim_owner(&self) -> String {
        format!(
            "{}#{:x}",
            self.claiming.owner,
            self.claiming.claims.fetch_add(1, Ordering::Relaxed)
        )
    }
}

/// Traces the claim of `rows` by `owner` (see [`crate::probe`]): `outcome`
/// `ok` or `lost_ack`, or `read_back` with the rows found leased.
fn trace_claim(
    rows: &[OutboxRow],
    owner: &str,
    outcome: &str,
    found: Option<&[OutboxRow]>,
    at: u64,
) {
    for r in rows {
        let fields = || {
            let mut fields = match found {
                None => serde_json::json!({ "outcome": outcome, "at": at }),
                Some(found) => {
                    serde_json::json!({ "held": found.iter().any(|x| x.id == r.id), "at": at })
                }
            };
            // The ordering key, for the checker's order per key.
            if let Some(key) = &r.ordering_key {
                fields["key"] = key.as_str().into();
            }
            fields
        };
        let kind = if found.is_some() {
            "claim_read_back"
        } else {
            "claim"
        };
        // A claim whose outcome is unknown: its attempt too (on Galera,
        // another node's claim may have taken the row meanwhile).
        let attempt = if outcome == "lost_ack" { 0 } else { r.attempts };
        crate::probe::emit(kind, r.id, &r.topic, attempt, owner, fields);
    }
}

/// A random number, drawn afresh on each call.
fn random() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    std::collections::hash_map::RandomState::new().hash_one(CALLS.fetch_add(1, Ordering::Relaxed))
}

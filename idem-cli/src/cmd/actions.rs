//! `idem outbox show | discard | retry-now | pause | resume | paused`,
//! through [`idem_runtime::outbox::admin`]. Each action is recorded under
//! the actor `cli:<user>` (see [`actor`]).

use crate::Fail;
use crate::opt::OutboxCommand;
use crate::output::{Out, name, shorten, table};
use idem_runtime::outbox::admin::{self, ActionReport, Attempt, MessageDetail};
use idem_runtime::timestamp::utc_text;
use serde::Serialize;
use sqlx::AnyPool;

/// The longest actor the admin API records, in bytes.
const MAX_ACTOR: usize = 128;

/// Runs one of the commands of this file (`idem outbox stats | list |
/// requeue` are `cmd::outbox`'s).
pub(crate) async fn run(pool: &AnyPool, cmd: OutboxCommand, out: Out) -> Result<(), Fail> {
    match cmd {
        OutboxCommand::Show { id } => show(pool, id, out).await,
        OutboxCommand::Discard { ids, reason } => {
            let report = admin::discard(pool, &ids, &reason, &actor()).await?;
            report_out(&report, "discarded (moved to the history as failed)", out)
        }
        OutboxCommand::RetryNow { ids } => {
            let report = admin::retry_now(pool, &ids, &actor()).await?;
            report_out(&report, "due now", out)
        }
        OutboxCommand::Pause { topic, reason } => {
            let reason = reason.unwrap_or_default();
            let newly = admin::pause(pool, &topic, &reason, &actor()).await?;
            let shown = name(&topic).into_owned();
            let text = if newly {
                format!("paused topic {shown}: relays no longer claim its messages\n")
            } else {
                format!("topic {shown} was paused already (its first reason stays)\n")
            };
            out.emit(
                &Changed {
                    topic,
                    changed: newly,
                },
                || text,
            )
        }
        OutboxCommand::Resume { topic } => {
            let was = admin::resume(pool, &topic, &actor()).await?;
            let shown = name(&topic).into_owned();
            let text = if was {
                format!("resumed topic {shown}: relays claim its messages again\n")
            } else {
                format!("topic {shown} was not paused: nothing changed\n")
            };
            out.emit(
                &Changed {
                    topic,
                    changed: was,
                },
                || text,
            )
        }
        OutboxCommand::Paused => paused(pool, out).await,
        OutboxCommand::Stats { .. } | OutboxCommand::List { .. } | OutboxCommand::Requeue(_) => {
            Err(Fail::usage("not an action command"))
        }
    }
}

/// Who acts, as the attempt log and the audit events record it:
/// `cli:` and the login name (`$USER`, else `$LOGNAME`), without control
/// characters and cut to fit; `cli` without one.
pub(crate) fn actor() -> String {
    let user = ["USER", "LOGNAME"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .map(|u| u.chars().filter(|c| !c.is_control()).collect::<String>())
        .find(|u| !u.trim().is_empty());
    let Some(user) = user else {
        return "cli".into();
    };
    let mut actor = format!("cli:{}", user.trim());
    while actor.len() > MAX_ACTOR {
        actor.pop();
    }
    actor
}

/// What `pause` and `resume` print with `--json`.
#[derive(Serialize)]
struct Changed {
    topic: String,
    /// `pause`: newly paused; `resume`: it was paused.
    changed: bool,
}

/// `idem outbox show ID` prints this with `--json`.
#[derive(Serialize)]
struct Shown {
    message: MessageDetail,
    attempts: Vec<Attempt>,
}

async fn show(pool: &AnyPool, id: i64, out: Out) -> Result<(), Fail> {
    let Some(message) = admin::message(pool, id).await? else {
        return Err(Fail::not_found(format!(
            "no outbox message with id {id} (neither online nor archived)"
        )));
    };
    let attempts = admin::attempts(pool, id).await?;
    let shown = Shown { message, attempts };
    out.emit(&shown, || {
        detail_text(&shown.message) + "\n" + &log_text(&shown.attempts)
    })
}

fn detail_text(m: &MessageDetail) -> String {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let rows = [
        ("id", m.id.to_string()),
        ("topic", name(&m.topic).into_owned()),
        ("msg_id", m.msg_id.clone()),
        ("status", m.status.clone()),
        ("attempts", m.attempts.to_string()),
        ("next_attempt", utc_text(&m.next_attempt_at)),
        ("lease_owner", opt(&m.lease_owner)),
        (
            "locked_until",
            m.locked_until.as_ref().map_or("-".into(), utc_text),
        ),
        ("last_error", opt(&m.last_error)),
        ("ordering_key", opt(&m.ordering_key)),
        ("created_at", utc_text(&m.created_at)),
        ("updated_at", utc_text(&m.updated_at)),
        (
            "archived_at",
            m.archived_at.as_ref().map_or("- (online)".into(), utc_text),
        ),
        ("headers", opt(&m.headers)),
        ("payload", m.payload.clone()),
    ];
    rows.iter().map(|(k, v)| format!("{k:<13} {v}\n")).collect()
}

fn log_text(log: &[Attempt]) -> String {
    if log.is_empty() {
        return "no failed attempts or operator actions logged\n".into();
    }
    let rows: Vec<Vec<String>> = log
        .iter()
        .map(|a| {
            vec![
                a.attempt.to_string(),
                a.outcome.clone(),
                utc_text(&a.at),
                a.actor.clone().unwrap_or_else(|| "-".into()),
                shorten(a.detail.as_deref().unwrap_or("-"), 80),
            ]
        })
        .collect();
    table(&["ATTEMPT", "OUTCOME", "AT", "ACTOR", "DETAIL"], &rows)
}

/// An action's report: what it did, refused and skipped.
fn report_out(report: &ActionReport, done: &str, out: Out) -> Result<(), Fail> {
    let ids = |v: &[i64]| v.iter().map(i64::to_string).collect::<Vec<_>>().join(" ");
    out.emit(report, || {
        let mut s = format!("{} message(s) {done}", report.done.len());
        if !report.done.is_empty() {
            s += &format!(": {}", ids(&report.done));
        }
        s += "\n";
        if !report.in_flight.is_empty() {
            s += &format!(
                "refused, a relay is delivering them now (try again once settled): {}\n",
                ids(&report.in_flight)
            );
        }
        if !report.skipped.is_empty() {
            s += &format!(
                "skipped (delivered, or no such message online): {}\n",
                ids(&report.skipped)
            );
        }
        s
    })
}

async fn paused(pool: &AnyPool, out: Out) -> Result<(), Fail> {
    let topics = admin::paused(pool).await?;
    out.emit(&topics, || {
        if topics.is_empty() {
            return "no paused topics\n".into();
        }
        let rows: Vec<Vec<String>> = topics
            .iter()
            .map(|t| {
                vec![
                    name(&t.topic).into_owned(),
                    t.paused_by.clone().unwrap_or_else(|| "-".into()),
                    utc_text(&t.paused_at),
                    shorten(t.reason.as_deref().unwrap_or("-"), 80),
                ]
            })
            .collect();
        table(&["TOPIC", "PAUSED_BY", "PAUSED_AT", "REASON"], &rows)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_actor_names_the_cli() {
        let a = actor();
        assert!(a == "cli" || a.starts_with("cli:"), "{a}");
        assert!(a.len() <= MAX_ACTOR && !a.chars().any(char::is_control));
    }
}

//! `idem outbox stats | list | requeue`, through
//! [`idem_runtime::outbox::admin`].

use crate::Fail;
use crate::opt::{RequeueArgs, StatusArg};
use crate::output::{Out, human, messages_table, name, table};
use idem_runtime::outbox::admin::{self, Requeue, RequeueTarget, TopicStats};
use sqlx::AnyPool;
use std::time::Duration;

/// A `--topic` filter: the topic exactly as given (spaces are part of a
/// topic: `"pay "` is not `pay`); an empty one filters nothing.
fn filter(topic: Option<&str>) -> Option<&str> {
    topic.filter(|t| !t.is_empty())
}

pub(crate) async fn stats(pool: &AnyPool, topic: Option<&str>, out: Out) -> Result<(), Fail> {
    let topic = filter(topic);
    let report = admin::stats(pool, topic).await?;
    out.emit(&report, || {
        if report.topics.is_empty() {
            return "no outbox messages\n".into();
        }
        let row = |t: &TopicStats| {
            vec![
                name(&t.topic).into_owned(),
                t.pending.to_string(),
                t.success.to_string(),
                t.failed.to_string(),
                t.total.to_string(),
                t.oldest_pending_age_secs
                    .map(|s| human(Duration::from_secs_f64(s)))
                    .unwrap_or_else(|| "-".into()),
            ]
        };
        let mut rows: Vec<Vec<String>> = report.topics.iter().map(row).collect();
        rows.push(row(&report.totals));
        table(
            &[
                "TOPIC",
                "PENDING",
                "SUCCESS",
                "FAILED",
                "TOTAL",
                "OLDEST PENDING",
            ],
            &rows,
        )
    })
}

pub(crate) async fn list(
    pool: &AnyPool,
    status: StatusArg,
    topic: Option<&str>,
    limit: i64,
    out: Out,
) -> Result<(), Fail> {
    if limit < 1 {
        return Err(Fail::usage("--limit must be at least 1"));
    }
    let status = status.status();
    let topic = filter(topic);
    let messages = admin::list(pool, status, topic, limit).await?;
    out.emit(&messages, || {
        if messages.is_empty() {
            format!("no {} messages\n", status.as_str())
        } else {
            let mut s = messages_table(&messages);
            if messages.len() as i64 == limit {
                s += &format!("(first {limit}; raise --limit to see more)\n");
            }
            s
        }
    })
}

pub(crate) async fn requeue(pool: &AnyPool, args: RequeueArgs, out: Out) -> Result<(), Fail> {
    let t = &args.target;
    let target = if let Some(id) = t.id {
        RequeueTarget::Id(id)
    } else if let Some(topic) = &t.topic {
        if topic.is_empty() {
            return Err(Fail::usage(
                "--topic is empty: give the topic exactly as stored (spaces included), or \
                 --all-failed",
            ));
        }
        RequeueTarget::Topic(topic.clone())
    } else if t.all_failed {
        RequeueTarget::AllFailed
    } else {
        return Err(Fail::usage(
            "choose what to requeue: --id, --topic or --all-failed",
        ));
    };
    let what = Requeue {
        target,
        max_id: None,
        dry_run: args.dry_run,
    };
    let report = admin::requeue_by(pool, &what, &super::actions::actor()).await?;
    if let (Some(id), true) = (t.id, report.messages.is_empty()) {
        // Say why nothing happened.
        match admin::status_of(pool, id).await? {
            Some(s) => eprintln!("idem: message {id} is {s}, not failed: nothing to requeue"),
            None => eprintln!("idem: no outbox message with id {id}"),
        }
    }
    out.emit(&report, || {
        let mut s = String::new();
        if !report.messages.is_empty() {
            s += &messages_table(&report.messages);
        }
        if report.dry_run {
            s += &format!(
                "dry run: {} failed message(s) would be requeued; nothing changed\n",
                report.requeued
            );
        } else {
            s += &format!(
                "requeued {} failed message(s) (now pending, attempts reset)\n",
                report.requeued
            );
        }
        s
    })
}

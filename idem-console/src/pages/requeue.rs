//! `GET /requeue`: the preview of a requeue (a dry run: how many failed
//! messages it takes, and which); `POST /requeue`: its confirmation,
//! bounded by the preview's highest id so it never takes a message that
//! failed after the operator looked.

use super::messages::message_table;
use crate::error::PageError;
use crate::fmt;
use crate::params::{Params, query_string};
use crate::read::{SCAN_TIMEOUT, answering, bounded};
use crate::throttle::Client;
use crate::{Shared, layout, write};
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Html;
use idem_runtime::Operable;
use idem_runtime::outbox::admin::{self, Requeue, RequeueTarget};
use maud::{Markup, html};

/// Messages a preview lists (it counts them all).
const SHOWN: usize = 100;
/// The most messages one selection may name.
const MAX_SELECTION: usize = 1000;

fn target(p: &Params) -> Result<RequeueTarget, PageError> {
    let mut ids = p.ints("id")?;
    // A crafted selection may name an id twice: once is what it means.
    ids.sort_unstable();
    ids.dedup();
    let topic = p.get("topic");
    let all = p.get("all") == Some("1");
    match (ids.is_empty(), topic, all) {
        (false, None, false) => {
            if ids.len() > MAX_SELECTION {
                return Err(PageError::BadRequest(format!(
                    "select at most {MAX_SELECTION} messages at once (or requeue their topic)"
                )));
            }
            Ok(RequeueTarget::Ids(ids))
        }
        (true, Some(t), false) => Ok(RequeueTarget::Topic(t.to_string())),
        (true, None, true) => Ok(RequeueTarget::AllFailed),
        (true, None, false) => Err(PageError::BadRequest(
            "nothing selected: tick the messages to requeue, or choose a topic or all".into(),
        )),
        _ => Err(PageError::BadRequest(
            "choose one of: a selection (id=…), a topic (topic=…) or all (all=1)".into(),
        )),
    }
}

/// The form fields naming `t`.
fn fields(t: &RequeueTarget) -> Vec<(&'static str, String)> {
    match t {
        RequeueTarget::Id(id) => vec![("id", id.to_string())],
        RequeueTarget::Ids(ids) => ids.iter().map(|id| ("id", id.to_string())).collect(),
        RequeueTarget::Topic(t) => vec![("topic", t.clone())],
        RequeueTarget::AllFailed => vec![("all", "1".into())],
    }
}

/// What `t` takes, in words (a topic [shown exactly](fmt::name)).
fn describe(t: &RequeueTarget) -> Markup {
    match t {
        RequeueTarget::Id(id) => html! { "message " (id) },
        RequeueTarget::Ids(ids) => html! { "the " (ids.len()) " selected message(s)" },
        RequeueTarget::Topic(t) => {
            html! { "every dead letter of topic " code #target-topic { (fmt::name(t)) } }
        }
        RequeueTarget::AllFailed => html! { "every dead letter" },
    }
}

pub(crate) async fn preview<DB: Operable>(
    State(c): State<Shared<DB>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Result<Html<String>, PageError> {
    let viewer = c.auth.viewer(&headers);
    let p = Params::query(q.as_deref());
    let target = target(&p)?;
    answering(&c.pool).await?;
    let plan = bounded(SCAN_TIMEOUT, admin::preview(&c.pool, &target, SHOWN as i64)).await?;
    let max_id = plan.max_id;
    let here = format!("/requeue?{}", query_string(fields(&target)));
    let login = format!(
        "{}?{}",
        c.mount.url("/login"),
        query_string([("next", here)])
    );
    let left_alone = match &target {
        RequeueTarget::Ids(ids) => ids.len().saturating_sub(plan.count as usize),
        _ => 0,
    };
    let body = html! {
        h1 { "Requeue: preview" }
        p { "Requeue " (describe(&target)) ": " strong #preview-count { (plan.count) } " failed message(s) would go back to pending (attempts reset to 0, due now; the last error is kept, prefixed with “requeued:”)." }
        @if left_alone > 0 {
            p.note #not-failed { (left_alone) " of the selected messages are not dead letters (pending, delivered or gone) and are left alone." }
        }
        @if !plan.first.is_empty() {
            (message_table(&c.mount, &plan.first, false))
            @if plan.count > plan.first.len() as u64 { p.note #shown { "The first " (plan.first.len()) " of " (plan.count) " are shown." } }
        }
        @if let (Some(max_id), true) = (max_id, plan.count > 0) {
            @if let Some(csrf) = viewer.csrf.as_ref().filter(|_| viewer.writable) {
                form method="post" action=(c.mount.url("/requeue")) #confirm-form {
                    input type="hidden" name="csrf" value=(csrf);
                    input type="hidden" name="max_id" value=(max_id);
                    input type="hidden" name="previewed" value=(plan.count);
                    @for (k, v) in fields(&target) { input type="hidden" name=(k) value=(v); }
                    p.actions {
                        button.danger type="submit" #confirm { "Requeue " (plan.count) " message(s)" }
                        " " a href=(c.mount.url("/dead-letters")) { "Cancel" }
                    }
                }
            } @else if viewer.writable {
                p.note #need-sign-in { a href=(login) { "Sign in with the write token" } " to requeue them." }
            } @else {
                p.note #read-only { "This console is read-only (started without a write token): nothing can be requeued from here." }
            }
        }
    };
    Ok(layout::page(
        &c.mount,
        "Requeue",
        "/dead-letters",
        &viewer,
        body,
    ))
}

pub(crate) async fn confirm<DB: Operable>(
    State(c): State<Shared<DB>>,
    client: Client,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Html<String>, PageError> {
    let p = Params::body(&body);
    let actor = write::authorize(&c, &headers, p.get("csrf"), client)?;
    let target = target(&p)?;
    let Some(max_id) = p.int("max_id")? else {
        return Err(PageError::BadRequest(
            "`max_id` is missing: confirm a requeue from its preview (GET /requeue)".into(),
        ));
    };
    let previewed = p.int("previewed")?;
    answering(&c.pool).await?;
    // Cut short, the requeue rolls back or went through: either way
    // confirming again is safe (only failed messages change, up to the
    // preview's highest id).
    let what = Requeue {
        target: target.clone(),
        dry_run: false,
        max_id: Some(max_id),
    };
    let done = bounded(SCAN_TIMEOUT, admin::requeue_by(&c.pool, &what, &actor)).await?;
    c.figures.backlog.clear().await;
    metrics::counter!("idem_console_requeued_total").increment(done.requeued);
    let viewer = c.auth.viewer(&headers);
    let body = html! {
        h1 { "Requeued" }
        p { "Requeued " strong #requeued-count { (done.requeued) } " message(s) of " (describe(&target)) ": they are pending again, for the relay to deliver." }
        @if let Some(n) = previewed.filter(|n| *n > done.requeued as i64) {
            p.note #fewer { (n - done.requeued as i64) " of the " (n) " previewed were no longer dead letters (requeued, delivered or archived meanwhile) and were left alone." }
        }
        p { a href=(c.mount.url("/dead-letters")) { "Back to the dead letters" } " · " a href=(c.mount.url("/")) { "Overview" } }
    };
    Ok(layout::page(
        &c.mount,
        "Requeued",
        "/dead-letters",
        &viewer,
        body,
    ))
}

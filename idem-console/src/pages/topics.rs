//! `/topics`: each topic's backlog and dead letters and whether it is
//! paused (relays do not claim a paused topic's pending messages); and
//! `POST /topics/pause`, `POST /topics/resume`, the topic in the form's
//! body (a topic may hold spaces and any other printable character, so it
//! travels exactly as stored, never in the path). Both pass
//! [`write::authorize`] first.

use super::actions::reason;
use super::message::MAX_REASON_CHARS;
use crate::error::PageError;
use crate::mount::Mount;
use crate::params::{Params, query_string};
use crate::read::{READ_TIMEOUT, SCAN_TIMEOUT, answering, bounded};
use crate::throttle::Client;
use crate::{Shared, fmt, layout, write};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Html;
use idem_runtime::Operable;
use idem_runtime::outbox::MAX_ID_LEN;
use idem_runtime::outbox::admin::{self, PausedTopic};
use idem_runtime::timestamp::utc_text;
use maud::{Markup, html};
use std::collections::BTreeMap;

/// One row of the page: a topic's counts and its pause, if any.
#[derive(Default)]
struct Row<'a> {
    pending: i64,
    failed: i64,
    paused: Option<&'a PausedTopic>,
}

pub(crate) async fn page<DB: Operable>(
    State(c): State<Shared<DB>>,
    headers: HeaderMap,
) -> Result<Html<String>, PageError> {
    let viewer = c.auth.viewer(&headers);
    answering(&c.pool).await?;
    let stats = c.stats().await?;
    let paused = bounded(READ_TIMEOUT, admin::paused(&c.pool)).await?;
    let mut rows: BTreeMap<&str, Row> = BTreeMap::new();
    for t in &stats.topics {
        let r = rows.entry(&t.topic).or_default();
        r.pending = t.pending;
        r.failed = t.failed;
    }
    for p in &paused {
        rows.entry(&p.topic).or_default().paused = Some(p);
    }
    let csrf = viewer.csrf.as_deref().filter(|_| viewer.writable);
    let note = write::controls(
        &c.mount,
        &viewer,
        "/topics",
        "to pause or resume topics",
        |_| html! {},
    );
    let body = html! {
        h1 { "Topics" }
        p.note { "A paused topic's pending messages stay where they are: relays do not claim them until it is resumed (a message already claimed finishes its attempt). Its messages can still be enqueued." }
        (note)
        p.note #paused-count { (paused.len()) " paused topic(s)." }
        @if rows.is_empty() {
            p.note #no-topics { "No topic has messages, and none is paused." }
        } @else {
            table #topic-states {
                thead { tr { th { "Topic" } th.num { "Pending" } th.num { "Dead letters" } th { "State" } @if csrf.is_some() { th { "" } } } }
                tbody { @for (topic, r) in &rows { (row(&c.mount, topic, r, csrf)) } }
            }
        }
        @if let Some(csrf) = csrf {
            h2 { "Pause another topic" }
            form.filter method="post" action=(c.mount.url("/topics/pause")) #pause-by-name {
                input type="hidden" name="csrf" value=(csrf);
                label { "Topic " input type="text" name="topic" #pause-topic size="24" maxlength=(MAX_ID_LEN) required; }
                label { " Reason " input type="text" name="reason" #pause-topic-reason size="32" maxlength=(MAX_REASON_CHARS) placeholder="(optional)"; }
                " " button type="submit" { "Pause" }
            }
        }
    };
    Ok(layout::page(&c.mount, "Topics", "/topics", &viewer, body))
}

/// A topic's row, with its form when the viewer may write (`csrf`).
fn row(mount: &Mount, topic: &str, r: &Row, csrf: Option<&str>) -> Markup {
    let list = |path: &str, pairs: Vec<(&str, String)>| {
        format!("{}?{}", mount.url(path), query_string(pairs))
    };
    html! {
        tr data-topic=(topic) data-state=(if r.paused.is_some() { "paused" } else { "running" }) {
            td.topic { (fmt::name(topic)) }
            td.num.pending { a href=(list("/messages", vec![("status", "pending".into()), ("topic", topic.into())])) { (r.pending) } }
            td.num.failed { @if r.failed > 0 { a href=(list("/dead-letters", vec![("topic", topic.into())])) { (r.failed) } } @else { "0" } }
            td.state {
                @if let Some(p) = r.paused {
                    span.badge.paused { "paused" }
                    " since " span.since { (utc_text(&p.paused_at)) }
                    @if let Some(by) = &p.paused_by { " by " code.by { (by) } }
                    @if let Some(why) = &p.reason { br; span.reason { (why) } }
                } @else {
                    span.badge.running { "running" }
                }
            }
            @if let Some(csrf) = csrf {
                td.action {
                    @if r.paused.is_some() {
                        form.inline method="post" action=(mount.url("/topics/resume")) {
                            input type="hidden" name="csrf" value=(csrf);
                            input type="hidden" name="topic" value=(topic);
                            button.resume type="submit" { "Resume" }
                        }
                    } @else {
                        form.inline method="post" action=(mount.url("/topics/pause")) {
                            input type="hidden" name="csrf" value=(csrf);
                            input type="hidden" name="topic" value=(topic);
                            input.reason type="text" name="reason" size="20" maxlength=(MAX_REASON_CHARS) placeholder="reason (optional)" aria-label=(format!("reason to pause {topic}"));
                            " " button.pause type="submit" { "Pause" }
                        }
                    }
                }
            }
        }
    }
}

/// The topic a pause or resume names: required, as a topic is stored.
fn topic(p: &Params) -> Result<&str, PageError> {
    p.filter("topic", MAX_ID_LEN)?
        .ok_or_else(|| PageError::BadRequest("`topic` is missing: name the topic".into()))
}

pub(crate) async fn pause<DB: Operable>(
    State(c): State<Shared<DB>>,
    client: Client,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Html<String>, PageError> {
    let p = Params::body(&body);
    let actor = write::authorize(&c, &headers, p.get("csrf"), client)?;
    let topic = topic(&p)?;
    let reason = reason(&p)?.unwrap_or("");
    answering(&c.pool).await?;
    let paused = bounded(SCAN_TIMEOUT, admin::pause(&c.pool, topic, reason, &actor)).await?;
    let said = if paused {
        html! { "Topic " code #result-topic { (fmt::name(topic)) } " is paused: relays no longer claim its pending messages, until it is resumed." }
    } else {
        html! { "Topic " code #result-topic { (fmt::name(topic)) } " was already paused: its pause (reason, by whom, since) is unchanged." }
    };
    Ok(result(&c, &headers, "Paused", paused, said))
}

pub(crate) async fn resume<DB: Operable>(
    State(c): State<Shared<DB>>,
    client: Client,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Html<String>, PageError> {
    let p = Params::body(&body);
    let actor = write::authorize(&c, &headers, p.get("csrf"), client)?;
    let topic = topic(&p)?;
    answering(&c.pool).await?;
    let resumed = bounded(SCAN_TIMEOUT, admin::resume(&c.pool, topic, &actor)).await?;
    let said = if resumed {
        html! { "Topic " code #result-topic { (fmt::name(topic)) } " is resumed: relays claim its pending messages again." }
    } else {
        html! { "Topic " code #result-topic { (fmt::name(topic)) } " was not paused: nothing changed." }
    };
    Ok(result(&c, &headers, "Resumed", resumed, said))
}

/// The page answering a pause or resume.
fn result<DB: Operable>(
    c: &Shared<DB>,
    headers: &HeaderMap,
    title: &str,
    changed: bool,
    said: Markup,
) -> Html<String> {
    let viewer = c.auth.viewer(headers);
    let title = if changed { title } else { "Nothing changed" };
    let body = html! {
        h1 { (title) }
        p #result data-outcome=(if changed { "done" } else { "unchanged" }) { (said) }
        p { a #back-to-topics href=(c.mount.url("/topics")) { "Back to the topics" } " · " a href=(c.mount.url("/")) { "Overview" } }
    };
    layout::page(&c.mount, title, "/topics", &viewer, body)
}

//! `/messages` (any status) and `/dead-letters` (failed, with their
//! reasons, to select for a requeue): oldest first, a page at a time.

use crate::error::PageError;
use crate::fmt;
use crate::mount::Mount;
use crate::params::{Params, query_string};
use crate::read::{READ_TIMEOUT, answering, bounded};
use crate::{Shared, layout};
use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Html;
use idem_runtime::Operable;
use idem_runtime::outbox::admin::{self, OutboxMessage};
use idem_runtime::outbox::{MAX_ID_LEN, Status};
use idem_runtime::timestamp::utc_text;
use maud::{Markup, html};

/// Rows per page unless `limit` says otherwise.
const PAGE: i64 = 50;
/// The largest `limit`.
const MAX_PAGE: i64 = 500;

struct Listing {
    status: Status,
    topic: Option<String>,
    after: Option<i64>,
    limit: i64,
}

fn listing(p: &Params, default: Status) -> Result<Listing, PageError> {
    let status = match p.get("status") {
        None => default,
        Some("pending") => Status::Pending,
        Some("success") => Status::Success,
        Some("failed") => Status::Failed,
        Some(other) => {
            let shown: String = other.chars().take(40).collect();
            return Err(PageError::BadRequest(format!(
                "`status` must be pending, success or failed, not {shown:?}"
            )));
        }
    };
    let limit = p.int("limit")?.unwrap_or(PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(PageError::BadRequest(format!(
            "`limit` must be between 1 and {MAX_PAGE}"
        )));
    }
    Ok(Listing {
        status,
        topic: p.filter("topic", MAX_ID_LEN)?.map(str::to_string),
        after: p.int("after")?,
        limit,
    })
}

pub(crate) async fn messages<DB: Operable>(
    State(c): State<Shared<DB>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Result<Html<String>, PageError> {
    let l = listing(&Params::query(q.as_deref()), Status::Pending)?;
    render(&c, &headers, l, "/messages").await
}

pub(crate) async fn dead_letters<DB: Operable>(
    State(c): State<Shared<DB>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Result<Html<String>, PageError> {
    let p = Params::query(q.as_deref());
    if p.get("status").is_some() {
        return Err(PageError::BadRequest(
            "dead letters are the failed messages: use /messages?status=… for others".into(),
        ));
    }
    let l = listing(&p, Status::Failed)?;
    render(&c, &headers, l, "/dead-letters").await
}

async fn render<DB: Operable>(
    c: &Shared<DB>,
    headers: &HeaderMap,
    l: Listing,
    path: &'static str,
) -> Result<Html<String>, PageError> {
    let viewer = c.auth.viewer(headers);
    let dead = path == "/dead-letters";
    answering(&c.pool).await?;
    let page = bounded(
        READ_TIMEOUT,
        admin::page(&c.pool, l.status, l.topic.as_deref(), l.after, l.limit),
    )
    .await?;
    let stats = c.stats().await?;
    let topics: Vec<&str> = stats
        .topics
        .iter()
        .filter(|t| !dead || t.failed > 0)
        .map(|t| t.topic.as_str())
        .collect();
    let of_status = |t: &admin::TopicStats| match l.status {
        Status::Pending => t.pending,
        Status::Success => t.success,
        Status::Failed => t.failed,
    };
    let total = match &l.topic {
        Some(topic) => stats
            .topics
            .iter()
            .find(|t| &t.topic == topic)
            .map(of_status)
            .unwrap_or(0),
        None => of_status(&stats.totals),
    };
    let link = |after: Option<i64>| {
        let mut pairs = Vec::new();
        if !dead {
            pairs.push(("status", l.status.as_str().to_string()));
        }
        if let Some(t) = &l.topic {
            pairs.push(("topic", t.clone()));
        }
        if let Some(a) = after {
            pairs.push(("after", a.to_string()));
        }
        if l.limit != PAGE {
            pairs.push(("limit", l.limit.to_string()));
        }
        format!("{}?{}", c.mount.url(path), query_string(pairs))
    };
    let title = if dead {
        "Dead letters".to_string()
    } else {
        format!("Messages: {}", l.status.as_str())
    };
    let filter = filter_form(&c.mount, path, dead, &l, &topics);
    let table = message_table(&c.mount, &page.messages, dead);
    let body = html! {
        h1 { (title) }
        (filter)
        p.note #count { (total) " " (l.status.as_str()) " message(s)"
            @if let Some(t) = &l.topic { " in topic " code { (fmt::name(t)) } }
            @if l.after.is_some() { "; this page starts after id " (l.after.unwrap_or(0)) }
        }
        @if page.messages.is_empty() {
            p.note #empty { "Nothing here." }
        } @else if dead {
            form method="get" action=(c.mount.url("/requeue")) #selection {
                (table)
                p.actions {
                    button type="submit" #preview-selected { "Preview requeue of the selected" }
                    @if let Some(t) = &l.topic {
                        " " a.button #preview-topic href=(format!("{}?{}", c.mount.url("/requeue"), query_string([("topic", t.clone())]))) { "Preview requeue of all of " (fmt::name(t)) }
                    } @else {
                        " " a.button #preview-all href=(c.mount.url("/requeue?all=1")) { "Preview requeue of all dead letters" }
                    }
                }
            }
        } @else {
            (table)
        }
        p.pages {
            @if l.after.is_some() { a #first-page href=(link(None)) { "← First page" } " " }
            @if let Some(next) = page.next_after { a #next-page href=(link(Some(next))) { "Next page →" } }
        }
    };
    Ok(layout::page(&c.mount, &title, path, &viewer, body))
}

/// The page's filter: status (not on the dead letters' page) and topic.
fn filter_form(mount: &Mount, path: &str, dead: bool, l: &Listing, topics: &[&str]) -> Markup {
    html! {
        form.filter method="get" action=(mount.url(path)) {
            @if !dead {
                label { "Status "
                    select name="status" {
                        @for s in ["pending", "success", "failed"] {
                            option value=(s) selected[s == l.status.as_str()] { (s) }
                        }
                    }
                }
            }
            label { " Topic "
                select name="topic" #topic-filter {
                    option value="" selected[l.topic.is_none()] { "(all topics)" }
                    @for t in topics {
                        option value=(t) selected[l.topic.as_deref() == Some(*t)] { (fmt::label(t)) }
                    }
                }
            }
            " " button type="submit" { "Show" }
        }
    }
}

/// The messages as a table; `select`: with a checkbox per row.
/// (Its links are under `mount`.)
pub(crate) fn message_table(mount: &Mount, messages: &[OutboxMessage], select: bool) -> Markup {
    html! {
        table #messages {
            thead { tr {
                @if select { th { "" } }
                th.num { "Id" } th { "Topic" } th { "Message id" } th { "Status" } th.num { "Attempts" } th { "Last error" } th { "Updated (UTC)" }
                @if select { th { "" } }
            } }
            tbody {
                @for m in messages {
                    tr data-id=(m.id) {
                        @if select { td { input type="checkbox" name="id" value=(m.id) aria-label=(format!("select message {}", m.id)); } }
                        td.num.id { a.message-link href=(super::message::url(mount, m.id)) { (m.id) } }
                        td.topic { (fmt::name(&m.topic)) }
                        td { code { (m.msg_id) } }
                        td { span class=(format!("status {}", m.status)) { (m.status) } }
                        td.num { (m.attempts) }
                        td.error { (m.last_error.as_deref().unwrap_or("")) }
                        td { (utc_text(&m.updated_at)) }
                        @if select { td { a.requeue-one href=(mount.url(&format!("/requeue?id={}", m.id))) { "Requeue…" } } }
                    }
                }
            }
        }
    }
}

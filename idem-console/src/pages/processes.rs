//! `/processes`: the relays and consumers registered in `idem_process`,
//! with their last heartbeat, marked stale when it is older than
//! [`STALE_AFTER`].

use crate::error::PageError;
use crate::read::{READ_TIMEOUT, answering, bounded};
use crate::{Shared, fmt, layout};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Html;
use idem_runtime::Operable;
use idem_runtime::outbox::admin::{self, Process};
use idem_runtime::timestamp::utc_text;
use maud::{Markup, html};
use std::time::Duration;

/// How often a relay or consumer beats (by default: each can be given
/// its own interval).
pub(crate) const HEARTBEAT_EVERY: Duration = idem_runtime::process::DEFAULT_INTERVAL;
/// Missed beats after which a process is shown stale.
pub(crate) const MISSED_BEATS: u32 = 3;
/// The heartbeat age past which a process is stale.
pub(crate) const STALE_AFTER: Duration = HEARTBEAT_EVERY.saturating_mul(MISSED_BEATS);

pub(crate) async fn page<DB: Operable>(
    State(c): State<Shared<DB>>,
    headers: HeaderMap,
) -> Result<Html<String>, PageError> {
    let viewer = c.auth.viewer(&headers);
    answering(&c.pool).await?;
    let all = bounded(READ_TIMEOUT, admin::processes(&c.pool)).await?;
    let stale = all.iter().filter(|p| p.heartbeat_age > STALE_AFTER).count();
    let body = html! {
        h1 { "Processes" }
        p.note #stale-rule { "Relays and consumers beat every " (HEARTBEAT_EVERY.as_secs()) " s (unless configured otherwise); one whose last heartbeat is more than "
            (STALE_AFTER.as_secs()) " s old (" (MISSED_BEATS) " beats missed, by the database's clock) is marked stale: stopped, hung or cut off from the database. A process that stopped cleanly is gone from the list." }
        p.note #process-count { (all.len()) " process(es), " (stale) " stale." }
        @if all.is_empty() {
            p.note #no-processes { "No relay or consumer is registered." }
        } @else {
            table #processes {
                thead { tr { th { "Kind" } th { "Name" } th { "Id" } th { "Host" } th.num { "Pid" } th { "Started (UTC)" } th { "Last heartbeat (UTC)" } th.num { "Age" } th { "State" } } }
                tbody { @for p in &all { (row(p)) } }
            }
        }
    };
    Ok(layout::page(
        &c.mount,
        "Processes",
        "/processes",
        &viewer,
        body,
    ))
}

fn row(p: &Process) -> Markup {
    let stale = p.heartbeat_age > STALE_AFTER;
    html! {
        tr data-id=(p.id) data-state=(if stale { "stale" } else { "alive" }) {
            td.kind { (p.kind) }
            td.name { (fmt::name(&p.name)) }
            td.id { code { (p.id) } }
            td.host { (p.host.as_deref().unwrap_or("-")) }
            td.num.pid { @if let Some(pid) = p.pid { (pid) } @else { "-" } }
            td.started { (utc_text(&p.started_at)) }
            td.heartbeat { (utc_text(&p.heartbeat_at)) }
            td.num.age { (fmt::age(p.heartbeat_age.as_secs_f64())) }
            td.state { @if stale { span.badge.stale { "stale" } } @else { span.badge.alive { "alive" } } }
        }
    }
}

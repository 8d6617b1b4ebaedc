//! `/`: the outbox at a glance, and `/live`, its part that refreshes.

use crate::chart;
use crate::error::PageError;
use crate::params::query_string;
use crate::read::answering;
use crate::{Shared, fmt, layout};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Html;
use idem_runtime::Operable;
use idem_runtime::outbox::admin::TopicStats;
use idem_runtime::timestamp::utc_text;
use maud::{Markup, html};

pub(crate) async fn page<DB: Operable>(
    State(c): State<Shared<DB>>,
    headers: HeaderMap,
) -> Result<Html<String>, PageError> {
    let viewer = c.auth.viewer(&headers);
    let live = live_part(&c).await?;
    Ok(layout::page(
        &c.mount,
        "Overview",
        "/",
        &viewer,
        html! {
            h1 { "Outbox" }
            noscript { p.note { "Reload the page to refresh it (with JavaScript it refreshes itself every 3 s)." } }
            div #live data-refresh=(c.mount.url("/live")) data-every="3000" { (live) }
        },
    ))
}

pub(crate) async fn live<DB: Operable>(
    State(c): State<Shared<DB>>,
) -> Result<Html<String>, PageError> {
    Ok(Html(live_part(&c).await?.into_string()))
}

fn age(secs: Option<f64>) -> String {
    secs.map(fmt::age).unwrap_or_else(|| "-".into())
}

fn topic_link(url: String, pairs: Vec<(&str, String)>) -> String {
    format!("{url}?{}", query_string(pairs))
}

async fn live_part<DB: Operable>(c: &Shared<DB>) -> Result<Markup, PageError> {
    answering(&c.pool).await?;
    let stats = c.stats().await?;
    let deliveries = c.deliveries().await?;
    let leases = c.leases().await?;
    let now = chart::unix_now();
    // The sampler's points only: a view adds none.
    let samples = c
        .samples
        .lock()
        .map_err(|_| PageError::Database("the chart's samples are poisoned".into()))?
        .clone();
    let last_minute: u64 = deliveries.iter().rev().take(6).sum();
    let t = &stats.totals;
    // `totals`: the sum row, whose "topic" is no topic to filter on.
    let row = |s: &TopicStats, totals: bool| {
        html! {
            tr data-topic=[(!totals).then_some(&s.topic)] {
                td.topic {
                    @if totals { "(all topics)" }
                    @else { a href=(topic_link(c.mount.url("/messages"), vec![("status", "pending".into()), ("topic", s.topic.clone())])) { (fmt::name(&s.topic)) } }
                }
                td.num.pending { (s.pending) }
                td.num.success { (s.success) }
                td.num.failed {
                    @if s.failed > 0 && !totals {
                        a href=(topic_link(c.mount.url("/dead-letters"), vec![("topic", s.topic.clone())])) { (s.failed) }
                    } @else if s.failed > 0 {
                        a href=(c.mount.url("/dead-letters")) { (s.failed) }
                    } @else { "0" }
                }
                td.num.total { (s.total) }
                td.num.oldest { (age(s.oldest_pending_age_secs)) }
            }
        }
    };
    Ok(html! {
        section.cards {
            div.card { div.label { "Pending" } div.value #total-pending { (t.pending) } }
            div.card.bad[t.failed > 0] { div.label { "Dead letters" } div.value #total-failed { a href=(c.mount.url("/dead-letters")) { (t.failed) } } }
            div.card { div.label { "Delivered" } div.value #total-success { (t.success) } }
            div.card { div.label { "Oldest pending" } div.value #oldest-pending { (age(t.oldest_pending_age_secs)) } }
            div.card { div.label { "Deliveries, last minute" } div.value #deliveries-1m { (last_minute) } }
            div.card { div.label { "Relays holding leases" } div.value #lease-holders { (leases.len()) } }
        }
        section {
            h2 { "Backlog and deliveries, last 10 minutes" }
            p.legend { span.key.backlog { "backlog (pending, left axis)" } " " span.key.rate { "deliveries/s (right axis)" } }
            (chart::svg(&samples, &deliveries, now))
        }
        section {
            h2 { "By topic" }
            @if stats.topics.is_empty() {
                p.note #no-topics { "The outbox is empty." }
            } @else {
                table #topics {
                    thead { tr { th { "Topic" } th.num { "Pending" } th.num { "Delivered" } th.num { "Dead letters" } th.num { "Total" } th.num { "Oldest pending" } } }
                    tbody { @for s in &stats.topics { (row(s, false)) } }
                    tfoot { (row(t, true)) }
                }
            }
        }
        section {
            h2 { "Relays holding leases" }
            @if leases.is_empty() {
                p.note #no-leases { "No relay holds a lease on a pending message." }
            } @else {
                table #leases {
                    thead { tr { th { "Relay (lease owner)" } th.num { "Messages" } th.num { "Live leases" } th { "Earliest expiry" } th { "Latest expiry" } } }
                    tbody {
                        @for l in &leases {
                            tr data-owner=(l.owner) {
                                td { code { (l.owner) } }
                                td.num { (l.messages) }
                                td.num { (l.live) }
                                td { (l.earliest_expiry.as_ref().map_or("-".into(), utc_text)) }
                                td { (l.latest_expiry.as_ref().map_or("-".into(), utc_text)) }
                            }
                        }
                    }
                }
            }
        }
    })
}

//! `/lookup?key=&caller=`: the record the `Idempotency-Key` layer
//! (`idem_runtime::http`) keeps for one HTTP request, found by the key
//! the client sent and the caller it was scoped to, online or archived.

use crate::error::PageError;
use crate::params::Params;
use crate::read::{READ_TIMEOUT, answering, bounded};
use crate::{Shared, layout};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use idem_runtime::outbox::admin::{self, RequestRecord};
use idem_runtime::timestamp::utc_text;
use idem_runtime::{Error, Operable};
use maud::{Markup, html};

/// The longest key or caller the form takes, in bytes (a key is at most
/// 128; the admin API says what else is wrong with one).
const MAX_FIELD: usize = 512;

/// What a look-up found.
enum Found {
    /// No key asked for yet.
    Nothing,
    /// The key or caller cannot be a request's (the API's reason).
    Bad(String),
    NoSuchRequest,
    Record(Box<RequestRecord>),
}

pub(crate) async fn page<DB: Operable>(
    State(c): State<Shared<DB>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Result<Response, PageError> {
    let viewer = c.auth.viewer(&headers);
    let p = Params::query(q.as_deref());
    let key = p.filter("key", MAX_FIELD)?;
    let caller = p.filter("caller", MAX_FIELD)?;
    let found = match key {
        None => Found::Nothing,
        Some(k) => {
            answering(&c.pool).await?;
            let read = bounded(
                READ_TIMEOUT,
                admin::request(&c.pool, k, caller.unwrap_or("")),
            );
            match read.await {
                Ok(Some(r)) => Found::Record(Box::new(r)),
                Ok(None) => Found::NoSuchRequest,
                Err(Error::Config { reason }) => Found::Bad(reason),
                Err(e) => return Err(e.into()),
            }
        }
    };
    let form = html! {
        form.filter method="get" action=(c.mount.url("/lookup")) #lookup {
            label { "Idempotency-Key " input type="text" name="key" #key size="40" maxlength="128" value=(key.unwrap_or("")) required; }
            label { " Caller " input type="text" name="caller" #caller size="24" value=(caller.unwrap_or("")) required placeholder="as the identity function answers"; }
            " " button type="submit" #look-up { "Look up" }
        }
    };
    let body = html! {
        h1 { "HTTP requests" }
        (form)
        @match &found {
            Found::Nothing => p.note { "Look up what the Idempotency-Key layer kept for a request: the key the client sent (unquoted) and the caller its identity function named. Archived requests are found too." },
            Found::Bad(reason) => p.error #lookup-error { (reason) },
            Found::NoSuchRequest => p.note #not-found { "No such request: no record for this key and caller, neither online nor archived (expired answers are archived, then removed)." },
            Found::Record(r) => (record(r)),
        }
    };
    let status = match &found {
        Found::Bad(_) => StatusCode::BAD_REQUEST,
        Found::NoSuchRequest => StatusCode::NOT_FOUND,
        _ => StatusCode::OK,
    };
    let html: Html<String> = layout::page(&c.mount, "Requests", "/lookup", &viewer, body);
    Ok((status, html).into_response())
}

/// A request's record, as a table.
fn record(r: &RequestRecord) -> Markup {
    html! {
        table.record #request data-state=(r.state) {
            tr { th { "Idempotency-Key" } td #request-key { code { (r.key) } } }
            tr { th { "Scope" } td #request-scope { (r.scope) } }
            tr { th { "State" } td #request-state {
                @match r.state.as_str() {
                    "in_flight" => { span.badge #state-badge { "in flight" } " a request holds the key; no answer yet" },
                    "answered" => { span.badge.online #state-badge { "answered" } " retries get the kept answer" },
                    other => { span.badge #state-badge { (other) } " not an HTTP answer" },
                }
            } }
            tr { th { "Answer status" } td #response-status { @if let Some(s) = r.response_status { (s) } @else { "-" } } }
            tr { th { "Answer body" } td #response-body { @if let Some(b) = &r.response_body { pre { (b) } } @else { "-" } } }
            tr { th { "Fingerprint" } td.fingerprint { code { (r.fingerprint) } } }
            tr { th { "Record key" } td #record-key { code { (r.record_key) } } }
            tr { th { "Created (UTC)" } td #request-created { (utc_text(&r.created_at)) } }
            tr { th { "Expires (UTC)" } td #request-expires { (utc_text(&r.expires_at)) } }
            tr { th { "Where" } td #request-where {
                @if let Some(at) = &r.archived_at { span.badge.archived { "archived" } " at " (utc_text(at)) }
                @else { span.badge.online { "online" } }
            } }
        }
    }
}

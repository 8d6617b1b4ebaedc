//! `/messages/{id}`: one message, online or archived: its fields, its
//! headers and payload, its attempt log (failed attempts and operator
//! actions), and for a signed-in viewer the forms to retry it now or to
//! discard it ([`super::actions`]).

use crate::error::PageError;
use crate::mount::Mount;
use crate::params::query_string;
use crate::read::{READ_TIMEOUT, answering, bounded};
use crate::viewer::Viewer;
use crate::{Shared, fmt, layout, write};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Html;
use idem_runtime::Operable;
use idem_runtime::outbox::admin::{self, Attempt, MessageDetail};
use idem_runtime::time::OffsetDateTime;
use idem_runtime::timestamp::utc_text;
use maud::{Markup, html};

/// The longest reason, in characters (the admin API's bound, which the
/// forms' `maxlength` repeats).
pub(crate) const MAX_REASON_CHARS: usize = 500;

/// The id of `/messages/{id}`, or a 400 that says what it must be.
pub(crate) fn message_id(path: Result<Path<String>, PathRejection>) -> Result<i64, PageError> {
    let raw = match path {
        Ok(Path(raw)) => raw,
        Err(e) => {
            return Err(PageError::BadRequest(format!(
                "the message id in the path is unreadable: {e}"
            )));
        }
    };
    match raw.trim().parse::<i64>() {
        Ok(id) if id > 0 => Ok(id),
        _ => {
            let shown: String = raw.chars().take(40).collect();
            Err(PageError::BadRequest(format!(
                "a message id is a positive whole number (such as /messages/42), not {shown:?}"
            )))
        }
    }
}

/// A message's URL (under the mount).
pub(crate) fn url(mount: &Mount, id: i64) -> String {
    mount.url(&format!("/messages/{id}"))
}

pub(crate) async fn page<DB: Operable>(
    State(c): State<Shared<DB>>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Html<String>, PageError> {
    let id = message_id(path)?;
    let viewer = c.auth.viewer(&headers);
    answering(&c.pool).await?;
    let Some(m) = bounded(READ_TIMEOUT, admin::message(&c.pool, id)).await? else {
        return Err(PageError::NotFound(format!(
            "no message with id {id}, neither in the outbox nor archived (archived messages \
             are removed once the history's retention has passed)"
        )));
    };
    let log = bounded(READ_TIMEOUT, admin::attempts(&c.pool, id)).await?;
    let now = OffsetDateTime::now_utc();
    let body = html! {
        h1 { "Message " (m.id) " " span class=(format!("status {}", m.status)) #status { (m.status) } }
        (fields(&c.mount, &m, now))
        h2 { "Actions" }
        (actions(&c.mount, &viewer, &m, now))
        h2 { "Attempt log" }
        (attempt_log(&log))
        h2 { "Headers" }
        (headers_part(m.headers.as_deref()))
        h2 { "Payload" }
        (payload_part(&m.payload))
    };
    let title = format!("Message {id}");
    Ok(layout::page(&c.mount, &title, "/messages", &viewer, body))
}

/// Whether a relay holds a live lease on `m` (by this console's clock).
pub(crate) fn in_flight(m: &MessageDetail, now: OffsetDateTime) -> bool {
    m.lease_owner.is_some() && m.locked_until.is_some_and(|t| t > now)
}

/// `t` in words, relative to `now`: `in 3m 07s` or `3m 07s ago`.
fn relative(t: OffsetDateTime, now: OffsetDateTime) -> String {
    let secs = (t - now).as_seconds_f64();
    if secs > 0.0 {
        format!("in {}", fmt::age(secs))
    } else {
        format!("{} ago", fmt::age(-secs))
    }
}

/// The message's own fields, as a table.
fn fields(mount: &Mount, m: &MessageDetail, now: OffsetDateTime) -> Markup {
    let live = in_flight(m, now);
    let topic = format!(
        "{}?{}",
        mount.url("/messages"),
        query_string([("status", m.status.clone()), ("topic", m.topic.clone())])
    );
    html! {
        table.record #message data-id=(m.id) {
            tr { th { "Topic" } td #topic { a href=(topic) { (fmt::name(&m.topic)) } } }
            tr { th { "Message id" } td #msg-id { code { (m.msg_id) } } }
            tr { th { "Attempts" } td #attempts { (m.attempts) } }
            tr { th { "Created (UTC)" } td #created { (utc_text(&m.created_at)) } }
            tr { th { "Updated (UTC)" } td #updated { (utc_text(&m.updated_at)) } }
            tr { th { "Next attempt (UTC)" } td #next-attempt {
                (utc_text(&m.next_attempt_at))
                @if m.status == "pending" && m.archived_at.is_none() {
                    " " span.note { "(" @if m.next_attempt_at <= now { "due" } @else { (relative(m.next_attempt_at, now)) } ")" }
                }
            } }
            tr { th { "Lease" } td #lease {
                @match (&m.lease_owner, &m.locked_until) {
                    (Some(owner), Some(until)) => {
                        code { (owner) } " until " (utc_text(until)) " "
                        @if live { span.badge.live #lease-state { "live" } } @else { span.badge #lease-state { "expired" } }
                    },
                    (Some(owner), None) => { code { (owner) } " " span.badge #lease-state { "no expiry" } },
                    _ => { span.note #lease-state { "none" } },
                }
            } }
            tr { th { "Ordering key" } td #ordering-key { @if let Some(k) = &m.ordering_key { code { (fmt::name(k)) } } @else { span.note { "none" } } } }
            tr { th { "Last error" } td.error #last-error { (m.last_error.as_deref().unwrap_or("")) } }
            tr { th { "Where" } td #where {
                @if let Some(at) = &m.archived_at { span.badge.archived { "archived" } " at " span #archived-at { (utc_text(at)) } }
                @else { span.badge.online { "online" } }
            } }
        }
    }
}

/// The forms to retry `m` now and to discard it, as the viewer may use
/// them (an archived or delivered message has none).
fn actions(mount: &Mount, viewer: &Viewer, m: &MessageDetail, now: OffsetDateTime) -> Markup {
    let open = m.archived_at.is_none() && (m.status == "failed" || m.status == "pending");
    if !open {
        return html! { p.note #no-actions { "None: the message is "
        @if m.archived_at.is_some() { "archived" } @else { "delivered" } "." } };
    }
    let live = in_flight(m, now);
    let here = format!("/messages/{}", m.id);
    let forms = |csrf: &str| {
        html! {
            @if live {
                p.note #in-flight { "A relay holds a live lease on this message (it is being delivered): it cannot be retried or discarded until the lease ends." }
            }
            div.action-forms {
                @if !live {
                    form method="post" action=(mount.url(&format!("{here}/retry-now"))) #retry-form {
                        input type="hidden" name="csrf" value=(csrf);
                        p.actions {
                            button type="submit" #retry-now { "Retry now" }
                            " " span.note { @if m.status == "failed" { "back to pending, attempts reset to 0, due now" } @else { "due now, its attempts kept" } }
                        }
                    }
                }
                form method="post" action=(mount.url(&format!("{here}/discard"))) #discard-form {
                    input type="hidden" name="csrf" value=(csrf);
                    p.actions {
                        label { "Reason " input type="text" name="reason" #reason size="40" maxlength=(MAX_REASON_CHARS) required placeholder="why it is given up"; }
                        " " button.danger type="submit" #discard { "Discard" }
                    }
                    p.note { "Discarding archives the message as failed, with the reason, and it is never delivered." }
                }
            }
        }
    };
    write::controls(mount, viewer, &here, "to retry or discard it", forms)
}

/// The attempt log, oldest first.
fn attempt_log(log: &[Attempt]) -> Markup {
    html! {
        @if log.is_empty() {
            p.note #no-attempts { "Nothing logged: no failed attempt and no operator action (successful attempts are not logged)." }
        } @else {
            table #attempt-log {
                thead { tr { th.num { "Attempt" } th { "Outcome" } th { "Detail" } th { "Actor" } th { "At (UTC)" } } }
                tbody {
                    @for a in log {
                        tr data-outcome=(a.outcome) {
                            td.num { (a.attempt) }
                            td.outcome { span class=(format!("outcome {}", a.outcome)) { (a.outcome) } }
                            td.detail { (a.detail.as_deref().unwrap_or("")) }
                            td.actor { @if let Some(who) = &a.actor { code { (who) } } }
                            td.at { (utc_text(&a.at)) }
                        }
                    }
                }
            }
        }
    }
}

/// The headers: a table when they are a JSON object, else their text.
fn headers_part(headers: Option<&str>) -> Markup {
    let Some(raw) = headers else {
        return html! { p.note #no-headers { "None." } };
    };
    match serde_json::from_str::<serde_json::Value>(raw) {
        Ok(serde_json::Value::Object(map)) => html! {
            table #headers {
                thead { tr { th { "Name" } th { "Value" } } }
                tbody {
                    @for (k, v) in &map {
                        tr {
                            td.name { code { (k) } }
                            td.value { @match v { serde_json::Value::String(s) => (s), other => code { (other) } } }
                        }
                    }
                }
            }
        },
        _ => html! { pre #headers-raw { (raw) } },
    }
}

/// The payload: pretty-printed when it is JSON, else as it is (escaped
/// either way).
fn payload_part(payload: &str) -> Markup {
    let pretty = serde_json::from_str::<serde_json::Value>(payload)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok());
    html! {
        @match pretty {
            Some(p) => pre.payload #payload data-json="true" { (p) },
            None => pre.payload #payload { (payload) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(raw: &str) -> Result<i64, PageError> {
        message_id(Ok(Path(raw.to_string())))
    }

    #[test]
    fn ids_are_positive_whole_numbers() {
        assert_eq!(id("42").unwrap(), 42);
        assert_eq!(id(" 7 ").unwrap(), 7);
        for bad in [
            "",
            "abc",
            "-3",
            "0",
            "1.5",
            "99999999999999999999",
            "1;DROP",
        ] {
            assert!(matches!(id(bad), Err(PageError::BadRequest(_))), "{bad:?}");
        }
    }

    #[test]
    fn payloads_and_headers_are_escaped_pretty_when_json() {
        let p = payload_part(r#"{"a":"<b>"}"#).into_string();
        assert!(
            p.contains("data-json") && p.contains("&quot;a&quot;: &quot;&lt;b&gt;&quot;"),
            "{p}"
        );
        let p = payload_part("<i>raw").into_string();
        assert!(
            !p.contains("data-json") && p.contains("&lt;i&gt;raw"),
            "{p}"
        );
        let h = headers_part(Some(r#"{"k":"<v>","n":1}"#)).into_string();
        assert!(
            h.contains(r#"id="headers""#) && h.contains("&lt;v&gt;"),
            "{h}"
        );
        for raw in ["[1,2]", "<not json>"] {
            let h = headers_part(Some(raw)).into_string();
            assert!(
                h.contains(r#"id="headers-raw""#) && !h.contains("<not"),
                "{h}"
            );
        }
        assert!(headers_part(None).into_string().contains("no-headers"));
    }
}

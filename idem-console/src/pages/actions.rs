//! `POST /messages/{id}/retry-now` and `POST /messages/{id}/discard`: an
//! operator's action on one message, from its page
//! ([`super::message`]), through the guarded functions of
//! [`idem_runtime::outbox::admin`] (which log it in the message's attempt
//! log). Each passes [`write::authorize`] first, and answers with a page
//! saying what was done, or why not: a relay holds a live lease on the
//! message (409), or it is no longer what the action takes (409).

use super::message::{self, MAX_REASON_CHARS, message_id};
use crate::error::PageError;
use crate::params::Params;
use crate::read::{SCAN_TIMEOUT, answering, bounded};
use crate::throttle::Client;
use crate::{Shared, layout, write};
use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use idem_runtime::Operable;
use idem_runtime::outbox::admin::{self, ActionReport};
use maud::{Markup, html};

/// What one action did to the one message it named.
enum Outcome {
    Done,
    InFlight,
    Skipped,
}

fn outcome(report: &ActionReport, id: i64) -> Outcome {
    if report.done.contains(&id) {
        Outcome::Done
    } else if report.in_flight.contains(&id) {
        Outcome::InFlight
    } else {
        Outcome::Skipped
    }
}

/// The reason a form gives (one line, at most [`MAX_REASON_CHARS`]
/// characters, else a 400); none when blank.
pub(crate) fn reason(p: &Params) -> Result<Option<&str>, PageError> {
    // A character is at most 4 bytes: the admin API counts characters.
    let r = p.filter("reason", 4 * MAX_REASON_CHARS)?;
    if let Some(r) = r
        && r.chars().count() > MAX_REASON_CHARS
    {
        return Err(PageError::BadRequest(format!(
            "a reason is at most {MAX_REASON_CHARS} characters long"
        )));
    }
    Ok(r.filter(|r| !r.trim().is_empty()))
}

pub(crate) async fn retry_now<DB: Operable>(
    State(c): State<Shared<DB>>,
    client: Client,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Bytes,
) -> Result<Response, PageError> {
    let p = Params::body(&body);
    let actor = write::authorize(&c, &headers, p.get("csrf"), client)?;
    let id = message_id(path)?;
    answering(&c.pool).await?;
    let report = bounded(SCAN_TIMEOUT, admin::retry_now(&c.pool, &[id], &actor)).await?;
    c.figures.backlog.clear().await;
    let (status, title, said) = match outcome(&report, id) {
        Outcome::Done => (
            StatusCode::OK,
            "Retrying now",
            html! { "Message " (id) " is due now: a relay delivers it at its next poll (a dead letter went back to pending with its attempts reset to 0)." },
        ),
        Outcome::InFlight => (StatusCode::CONFLICT, "Not retried", in_flight(id)),
        Outcome::Skipped => (
            StatusCode::CONFLICT,
            "Not retried",
            html! { "Message " (id) " was left alone: it is neither a dead letter nor pending (delivered, discarded or archived meanwhile)." },
        ),
    };
    Ok(result(&c, &headers, id, status, title, said))
}

pub(crate) async fn discard<DB: Operable>(
    State(c): State<Shared<DB>>,
    client: Client,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Bytes,
) -> Result<Response, PageError> {
    let p = Params::body(&body);
    let actor = write::authorize(&c, &headers, p.get("csrf"), client)?;
    let id = message_id(path)?;
    let Some(reason) = reason(&p)? else {
        return Err(PageError::BadRequest(
            "a reason is required to discard a message: say why, for its log".into(),
        ));
    };
    answering(&c.pool).await?;
    let report = bounded(SCAN_TIMEOUT, admin::discard(&c.pool, &[id], reason, &actor)).await?;
    c.figures.backlog.clear().await;
    let (status, title, said) = match outcome(&report, id) {
        Outcome::Done => (
            StatusCode::OK,
            "Discarded",
            html! { "Message " (id) " was discarded: it is archived as failed with the reason " q #discard-reason { (reason) } ", and will not be delivered." },
        ),
        Outcome::InFlight => (StatusCode::CONFLICT, "Not discarded", in_flight(id)),
        Outcome::Skipped => (
            StatusCode::CONFLICT,
            "Not discarded",
            html! { "Message " (id) " was left alone: it is neither a dead letter nor pending (delivered, discarded or archived meanwhile)." },
        ),
    };
    Ok(result(&c, &headers, id, status, title, said))
}

fn in_flight(id: i64) -> Markup {
    html! { "Message " (id) " is in flight: a relay holds a live lease on it, so it was left alone. Try again once the relay is done with it (its page shows the lease)." }
}

/// The page answering an action: what was done (`said`), and where to go.
fn result<DB: Operable>(
    c: &Shared<DB>,
    headers: &HeaderMap,
    id: i64,
    status: StatusCode,
    title: &str,
    said: Markup,
) -> Response {
    let viewer = c.auth.viewer(headers);
    let body = html! {
        h1 { (title) }
        p #result data-outcome=(if status == StatusCode::OK { "done" } else { "refused" }) { (said) }
        p {
            a #back-to-message href=(message::url(&c.mount, id)) { "Back to message " (id) }
            " · " a href=(c.mount.url("/dead-letters")) { "Dead letters" }
            " · " a href=(c.mount.url("/")) { "Overview" }
        }
    };
    let page: Html<String> = layout::page(&c.mount, title, "/messages", &viewer, body);
    (status, page).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_one_line_and_bounded() {
        let p = Params::body(b"reason=+duplicate+&blank=+&nl=a%0Ab");
        assert_eq!(reason(&p).unwrap(), Some(" duplicate "));
        let p = Params::body(b"reason=+++");
        assert_eq!(reason(&p).unwrap(), None, "blank: none");
        assert_eq!(reason(&Params::body(b"")).unwrap(), None);
        assert!(reason(&Params::body(b"reason=a%0Ab")).is_err(), "a newline");
        let long = format!("reason={}", "%C3%A9".repeat(MAX_REASON_CHARS));
        assert!(
            reason(&Params::body(long.as_bytes())).is_ok(),
            "500 characters"
        );
        let longer = format!("reason={}", "e".repeat(MAX_REASON_CHARS + 1));
        assert!(reason(&Params::body(longer.as_bytes())).is_err());
    }
}

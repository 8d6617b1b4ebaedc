//! What a page answers when it cannot show what was asked.

use crate::layout;
use crate::mount::Mount;
use crate::read::RETRY_AFTER_SECS;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::html;

/// A page's failure, rendered as an HTML page with its status code.
#[derive(Debug)]
pub(crate) enum PageError {
    /// 400: a parameter that does not parse.
    BadRequest(String),
    /// 403: a write that is not allowed.
    Forbidden(String),
    /// 404.
    NotFound(String),
    /// 421: a `Host` the console does not answer to.
    Misdirected(String),
    /// 429: a client in its back-off after wrong tokens; `retry_after`
    /// seconds left.
    TooManyRequests {
        /// What to tell the client.
        message: String,
        /// Seconds until it may try again.
        retry_after: u64,
    },
    /// 503 with `Retry-After`: the database does not answer, or failed in
    /// a way a retry can heal (a lost connection, a time-out, a deadlock:
    /// [`is_retryable`](idem_runtime::Error::is_retryable)); the message
    /// says how, for the log.
    Unavailable(String),
    /// 500: the database failed otherwise (the message says how).
    Database(String),
}

impl From<idem_runtime::Error> for PageError {
    fn from(e: idem_runtime::Error) -> Self {
        match e {
            idem_runtime::Error::Config { reason } => PageError::BadRequest(reason),
            other if other.is_retryable() => PageError::Unavailable(other.to_string()),
            other => PageError::Database(other.to_string()),
        }
    }
}

/// A failure's page, left in the response's extensions for the router's
/// layer to render: it knows where the console is mounted, which the
/// links of the page depend on.
#[derive(Debug, Clone)]
pub(crate) struct ErrorPage {
    title: &'static str,
    message: String,
}

impl ErrorPage {
    pub(crate) fn render(&self, mount: &Mount) -> Html<String> {
        layout::bare(
            mount,
            self.title,
            html! {
                h1 { (self.title) }
                p.error #error { (self.message) }
                p { a href=(mount.url("/")) { "Back to the overview" } }
            },
        )
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let mut retry = None;
        let (status, title, message) = match self {
            PageError::BadRequest(m) => (StatusCode::BAD_REQUEST, "Bad request", m),
            PageError::Forbidden(m) => (StatusCode::FORBIDDEN, "Refused", m),
            PageError::NotFound(m) => (StatusCode::NOT_FOUND, "Not found", m),
            PageError::Misdirected(m) => (StatusCode::MISDIRECTED_REQUEST, "Unknown host", m),
            PageError::TooManyRequests {
                message,
                retry_after,
            } => {
                retry = Some(retry_after);
                (StatusCode::TOO_MANY_REQUESTS, "Too many attempts", message)
            }
            PageError::Unavailable(m) => {
                // As a database error: its text to the log only.
                tracing::warn!(error = %m, "idem console: the database is unavailable");
                retry = Some(RETRY_AFTER_SECS);
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Database unavailable",
                    format!(
                        "the database did not answer this page (it is down, unreachable or \
                         overloaded); the console's log has the details. Retry in \
                         {RETRY_AFTER_SECS} seconds."
                    ),
                )
            }
            PageError::Database(m) => {
                // The database's own text goes to the log only: it can
                // name tables, values and server details, and it came
                // with a prefix of its own.
                tracing::warn!(error = %m, "idem console: database error");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Database error",
                    "the database could not answer this page; the console's log has the \
                     details. Retry in a moment."
                        .to_owned(),
                )
            }
        };
        // The text alone, should the response ever leave without the
        // router's layer; the layer replaces it with the page.
        let mut r = (status, message.clone()).into_response();
        if let Some(secs) = retry {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        r.extensions_mut().insert(ErrorPage { title, message });
        r
    }
}

//! What a page answers when it cannot show what was asked.

use crate::layout;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
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
    /// 500: the database failed (the message says how).
    Database(String),
}

impl From<idem_runtime::Error> for PageError {
    fn from(e: idem_runtime::Error) -> Self {
        match e {
            idem_runtime::Error::Config { reason } => PageError::BadRequest(reason),
            other => PageError::Database(other.to_string()),
        }
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let (status, title, msg) = match self {
            PageError::BadRequest(m) => (StatusCode::BAD_REQUEST, "Bad request", m),
            PageError::Forbidden(m) => (StatusCode::FORBIDDEN, "Refused", m),
            PageError::NotFound(m) => (StatusCode::NOT_FOUND, "Not found", m),
            PageError::Database(m) => {
                tracing::warn!(error = %m, "idem console: database error");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Database error",
                    format!("database error: {m}"),
                )
            }
        };
        let body = layout::bare(
            title,
            html! {
                h1 { (title) }
                p.error #error { (msg) }
                p { a href="/" { "Back to the overview" } }
            },
        );
        (status, body).into_response()
    }
}

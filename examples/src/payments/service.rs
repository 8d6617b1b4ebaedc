//! The HTTP service: `POST` [`CALLBACK_PATH`] and its answers.

use super::handler::{PaymentError, apply_callback};
use super::protocol::{Callback, ErrorBody, verify_signature};
use super::{CALLBACK_PATH, MAX_BODY, REPLAY_HEADER, SIGNATURE_HEADER};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem_runtime::Outcome;
use sqlx::PgPool;
use std::sync::Arc;

/// An error answer: `status` with an [`ErrorBody`].
pub(super) fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = ErrorBody {
        code: code.into(),
        message: message.into(),
    };
    (status, axum::Json(body)).into_response()
}

#[derive(Clone)]
struct AppState {
    pool: PgPool,
    secret: Arc<[u8]>,
}

/// The service: `POST` [`CALLBACK_PATH`] (see the module's table of status
/// codes). `secret` is the HMAC key shared with the payment platform.
pub fn app(pool: PgPool, secret: impl Into<Vec<u8>>) -> Router {
    let state = AppState {
        pool,
        secret: secret.into().into(),
    };
    Router::new()
        .route(CALLBACK_PATH, post(callback))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// A callback turned away before the database: the answer's status, its
/// [`ErrorBody`] code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// 400 or 422.
    pub status: StatusCode,
    /// `BAD_SIGNATURE`, `BAD_REQUEST` or `UNSUPPORTED_STATUS`.
    pub code: &'static str,
    /// What is wrong.
    pub message: String,
}

impl Rejection {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Rejection {
            status,
            code,
            message: message.into(),
        }
    }
}

/// The endpoint's checks before anything touches the database, in order:
/// the signature over the raw `body` ([`verify_signature`]), the JSON
/// ([`Callback`]), and the status (`SUCCESS`). The serial's format is
/// checked next, by [`apply_callback`]'s `validate` ([`validate_serial`](super::validate_serial)).
pub fn parse_callback(
    secret: &[u8],
    body: &[u8],
    signature: Option<&HeaderValue>,
) -> Result<Callback, Rejection> {
    verify_signature(secret, body, signature)
        .map_err(|e| Rejection::new(StatusCode::BAD_REQUEST, "BAD_SIGNATURE", e.to_string()))?;
    let cb: Callback = serde_json::from_slice(body)
        .map_err(|e| Rejection::new(StatusCode::BAD_REQUEST, "BAD_REQUEST", e.to_string()))?;
    if cb.status != "SUCCESS" {
        let shown: String = cb
            .status
            .chars()
            .take(40)
            .flat_map(char::escape_default)
            .collect();
        return Err(Rejection::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "UNSUPPORTED_STATUS",
            format!("status `{shown}` is not SUCCESS"),
        ));
    }
    Ok(cb)
}

async fn callback(State(app): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    // 1. The signature, over the raw bytes, before anything else; the
    //    JSON; the status.
    let cb = match parse_callback(&app.secret, &body, headers.get(SIGNATURE_HEADER)) {
        Ok(cb) => cb,
        Err(r) => return error(r.status, r.code, r.message),
    };
    // 2. The serial's format (validate = …), the record, the order's state.
    match apply_callback(&app.pool, &cb).await {
        Ok(Outcome::Executed(r)) => (StatusCode::OK, axum::Json(r)).into_response(),
        Ok(Outcome::Duplicate(Some(r))) => (
            StatusCode::OK,
            [(REPLAY_HEADER, HeaderValue::from_static("true"))],
            axum::Json(r),
        )
            .into_response(),
        // The record strategy always stores the receipt: not reached.
        Ok(Outcome::Duplicate(None)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
            "duplicate without a stored receipt",
        ),
        Err(e) => error_response(&e),
    }
}

/// The HTTP answer for an error of [`apply_callback`].
pub fn error_response(e: &idem_runtime::Error) -> Response {
    use idem_runtime::Error as E;
    let msg = e.to_string();
    if e.is_retryable() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "RETRY_LATER", msg);
    }
    match e {
        E::InvalidKey { .. } => error(StatusCode::BAD_REQUEST, "BAD_SERIAL", msg),
        E::KeyConflict { .. } => error(StatusCode::CONFLICT, "SERIAL_REUSED", msg),
        E::IllegalState { .. } => error(StatusCode::CONFLICT, "ORDER_NOT_PAYABLE", msg),
        E::Handler { source, .. } => match source.downcast_ref::<PaymentError>() {
            Some(p) => {
                let (status, code) = match p {
                    PaymentError::UnknownOrder { .. } => {
                        (StatusCode::UNPROCESSABLE_ENTITY, "UNKNOWN_ORDER")
                    }
                    PaymentError::AmountMismatch { .. } => {
                        (StatusCode::UNPROCESSABLE_ENTITY, "AMOUNT_MISMATCH")
                    }
                    PaymentError::AlreadyPaid { .. } => {
                        (StatusCode::CONFLICT, "ORDER_ALREADY_PAID")
                    }
                    PaymentError::NotPayable { .. } => (StatusCode::CONFLICT, "ORDER_NOT_PAYABLE"),
                    PaymentError::SerialReused { .. } => (StatusCode::CONFLICT, "SERIAL_REUSED"),
                    PaymentError::Database(_) => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
                };
                error(status, code, p.to_string())
            }
            None => error(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", msg),
        },
        _ => error(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", msg),
    }
}

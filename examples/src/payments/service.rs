//! The HTTP service: `POST` [`CALLBACK_PATH`] and its answers.

use super::handler::{PaymentError, apply_callback};
use super::protocol::{Callback, ErrorBody, verifier};
use super::{CALLBACK_PATH, MAX_BODY, REPLAY_HEADER};
use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRef, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem_runtime::Outcome;
use idem_runtime::http::{CallbackError, CallbackRejection, CallbackVerifier, SignedCallback};
use sqlx::PgPool;

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
    verifier: CallbackVerifier,
}

impl FromRef<AppState> for CallbackVerifier {
    fn from_ref(app: &AppState) -> Self {
        app.verifier.clone()
    }
}

/// The service: `POST` [`CALLBACK_PATH`] (see the module's table of status
/// codes). `secret` is the HMAC key shared with the payment platform.
pub fn app(pool: PgPool, secret: impl Into<Vec<u8>>) -> Router {
    let state = AppState {
        pool,
        verifier: verifier(secret),
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
    /// 400, 401 or 422.
    pub status: StatusCode,
    /// `BAD_SIGNATURE`, `BAD_SERIAL`, `BAD_REQUEST` or `UNSUPPORTED_STATUS`.
    pub code: &'static str,
    /// What is wrong.
    pub message: String,
}

impl Rejection {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        let message = message.into();
        Rejection {
            status,
            code,
            message,
        }
    }

    /// The runtime verifier's refusal (400 or 401) with this service's codes.
    pub fn refused(e: &CallbackError) -> Self {
        let code = if matches!(e, CallbackError::BadSerial(_)) {
            "BAD_SERIAL"
        } else {
            "BAD_SIGNATURE"
        };
        Rejection::new(e.status(), code, e.to_string())
    }
}

/// The callback in a verified body: the JSON ([`Callback`]) and its status
/// (`SUCCESS`).
pub fn read_callback(body: &[u8]) -> Result<Callback, Rejection> {
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

async fn callback(
    State(app): State<AppState>,
    signed: Result<SignedCallback, CallbackRejection>,
) -> Response {
    // 1. The signature and timestamp over the raw bytes, then the serial's
    //    format (the runtime's extractor); the JSON; the status.
    let signed = match signed {
        Ok(signed) => signed,
        Err(CallbackRejection::Refused(e)) => {
            let r = Rejection::refused(&e);
            return error(r.status, r.code, r.message);
        }
        // Over the body limit: axum's 413.
        Err(other) => return other.into_response(),
    };
    let cb = match read_callback(&signed.body) {
        Ok(cb) => cb,
        Err(r) => return error(r.status, r.code, r.message),
    };
    // 2. The record and the order's state (the key's format checked again
    //    by `validate`).
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

//! HTTP entry points, on axum 0.8 (feature `axum`).
//!
//! Two sources of duplicate requests, two sets of pieces:
//!
//! - **`Idempotency-Key` requests** (IETF draft "The Idempotency-Key HTTP
//!   Header Field"): a client makes a `POST` retryable by sending a key of
//!   its own. [`Idempotency`] is a route's policy, [`IdempotentRequest`]
//!   the extractor, [`RequestCall`] the handler's transaction: its effects
//!   and the answer it stores commit together with the key's record
//!   (`idem_record`), so a response lost on the way and a client retry get
//!   the first answer, never a second effect.
//! - **Third-party callbacks** (a payment platform that pushes again
//!   after any non-200): [`CallbackVerifier`] and the [`SignedCallback`]
//!   extractor check the platform's HMAC-SHA256 signature over the raw body
//!   in constant time and the signed timestamp's age, and hand out its
//!   serial (event or transaction id), validated, to key an
//!   [`#[idempotent]`](macro@crate::idempotent) handler.
//!
//! ## An `Idempotency-Key` request, step by step
//!
//! | the key's record | answer |
//! |---|---|
//! | header missing (a required key) | 400 |
//! | header malformed, repeated, over [`MAX_IDEMPOTENCY_KEY_LEN`] bytes, not printable ASCII | 400 |
//! | none | the handler runs: the in-flight row is committed first, then the effects, the answer and the row's completion in one transaction |
//! | answered, same method, target and body | the stored status, headers and body, byte for byte, plus `Idempotent-Replayed: true` |
//! | answered or in flight, another method, target or body | 422 |
//! | in flight | 409 (the draft's choice: the client retries later, nothing waits on the server) |
//! | in flight past its lease (the process that ran it died) | taken over: the handler runs |
//!
//! Two identical requests at the same moment: the in-flight row's insert
//! is atomic, one of them writes it and runs, the other reads it and gets
//! 409. The handler's transaction locks the row and is fenced by the
//! request's lease: a request whose lease was taken over cannot commit.
//! Errors are problem details (`application/problem+json`) and link the
//! policy's documentation when the policy names one
//! ([`Idempotency::policy`]): the draft asks the server to publish how long
//! it keeps keys. A key is kept for at least its [`ttl`](Idempotency::ttl)
//! after the answer, until the archiver moves it to history with the other
//! expired records ([`archive`](crate::archive)); the same key after that
//! is a new request.
//!
//! ```
//! use axum::{Router, extract::State, http::StatusCode, routing::post};
//! use axum::response::Response;
//! use idem_runtime::http::{Idempotency, IdempotentRequest};
//! use sqlx::SqlitePool;
//!
//! #[derive(Clone)]
//! struct App { pool: SqlitePool, orders: Idempotency }
//!
//! async fn create_order(State(app): State<App>, req: IdempotentRequest) -> Response {
//!     let mut call = match app.orders.begin(&app.pool, &req).await {
//!         Ok(call) => call,
//!         Err(answer) => return answer, // replay, 400, 409, 422…
//!     };
//!     let n = sqlx::query("INSERT INTO orders (body) VALUES (?)")
//!         .bind(req.body().to_vec()).execute(&mut **call.tx()).await;
//!     match n {
//!         Ok(_) => call.finish((StatusCode::CREATED, "created")).await,
//!         Err(_) => call.abandon(StatusCode::SERVICE_UNAVAILABLE).await,
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let orders = Idempotency::new("orders", |parts| {
//!     // The caller a key belongs to: here an API key header.
//!     parts.headers.get("x-api-key")?.to_str().ok().map(str::to_owned)
//! });
//! # let pool = SqlitePool::connect_lazy("sqlite::memory:").unwrap();
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order))
//!     .with_state(App { pool, orders });
//! # let _ = app;
//! # }
//! ```
//!
//! ## A callback
//!
//! ```
//! use axum::{extract::FromRef, response::Response};
//! use idem_runtime::http::{CallbackVerifier, SerialFrom, SignedCallback};
//!
//! #[derive(Clone)]
//! struct App { verifier: CallbackVerifier }
//! impl FromRef<App> for CallbackVerifier {
//!     fn from_ref(a: &App) -> Self { a.verifier.clone() }
//! }
//!
//! // Only verified callbacks get here; `cb.serial()` keys the handler.
//! async fn paid(cb: SignedCallback) -> String {
//!     format!("booked {}", cb.serial())
//! }
//!
//! let verifier = CallbackVerifier::new(b"shared-secret".to_vec())
//!     .serial(SerialFrom::JsonField("event_id"), |s| {
//!         s.starts_with("evt_").then_some(()).ok_or_else(|| "not an event id".into())
//!     });
//! let app: axum::Router = axum::Router::new()
//!     .route("/callbacks", axum::routing::post(paid))
//!     .with_state(App { verifier });
//! # let _ = app;
//! ```

mod callback;
mod key;
mod problem;
mod request;
mod stored;

pub use callback::{
    CallbackError, CallbackRejection, CallbackVerifier, MAX_SERIAL_LEN, SerialFrom, SignedCallback,
};
pub use key::{IDEMPOTENCY_KEY, IdempotencyKey, KeyError, MAX_IDEMPOTENCY_KEY_LEN};
pub use problem::Problem;
pub use request::{Idempotency, IdempotentRequest, RequestCall};
pub use stored::IDEMPOTENT_REPLAYED;

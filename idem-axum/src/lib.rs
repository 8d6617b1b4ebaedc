//! HTTP entry points, on axum 0.8 (feature `axum`), over every backend:
//! PostgreSQL, MariaDB, SQLite, and `sqlx::Any` (feature `any`: the
//! futures are `Send` though `AnyConnection` is not `Sync`).
//!
//! Two sources of duplicate requests, two sets of pieces:
//!
//! - **`Idempotency-Key` requests** (IETF draft "The Idempotency-Key HTTP
//!   Header Field"): a client makes a `POST` retryable by sending a key of
//!   its own. [`Idempotency`] is a route's policy, [`IdempotentRequest`]
//!   the extractor, [`RequestCall`] the handler's transaction (a
//!   [`CallerTx`](idem_core::CallerTx): `#[idempotent]` handlers and outbox
//!   messages run inside it): its effects and the answer it stores commit
//!   together with the key's record (`idem_record`), so a response lost
//!   on the way and a client retry get the first answer, never a second
//!   effect. Or, written once for every route: [`Idempotency::layer`]
//!   runs all of it around a plain handler, which takes the transaction
//!   with the [`RequestTx`] extractor.
//! - **Third-party callbacks** (a payment platform that pushes again
//!   after any non-200): [`CallbackVerifier`] and the [`SignedCallback`]
//!   extractor check the platform's HMAC-SHA256 signature over the raw body
//!   in constant time and the signed timestamp's age, and hand out its
//!   serial (event or transaction id), validated, to key an
//!   [`#[idempotent]`](https://docs.rs/idem-runtime/latest/idem_runtime/attr.idempotent.html) handler. The serial is
//!   read from what the signature covers (a field of the body, or the
//!   body's digest), so the same signed bytes replayed are one key whatever
//!   headers come with them; a header the platform does not sign is a
//!   choice made by name ([`SerialFrom::UnsignedHeader`]). [`SerialFrom`]
//!   says what Stripe, GitHub, Shopify, Alipay, WeChat Pay and Adyen sign;
//!   [`scheme`] holds their formats as presets of a [`SignatureScheme`]
//!   (Stripe, Standard Webhooks, GitHub, Shopify, Paddle; Alipay and WeChat
//!   Pay, RSA; Adyen), with key rotation:
//!   `SignedCallback<Stripe>` checks Stripe's own header.
//!
//! ## An `Idempotency-Key` request, step by step
//!
//! In this order (behind [`IdempotencyLayer`]; by hand, the handler's
//! extractors come first, then [`Idempotency::begin`] does 2 to 5):
//!
//! 1. the body, read whole: over the layer's
//!    [`max_body`](IdempotencyLayer::max_body) → 413 (by hand: axum's
//!    `DefaultBodyLimit`);
//! 2. the key: missing or malformed → 400;
//! 3. the caller: none → 401;
//! 4. the record of `(caller, key)`: answered → replayed; another request
//!    under it → 422; in flight → 409; none → the in-flight row written;
//! 5. the handler's transaction begun, the record held (on PostgreSQL 4
//!    and 5 are one: the handler's transaction begins first and claims the
//!    key in one statement);
//! 6. the handler's extractors (`Json<T>`, [`RequestTx`]…), on the body
//!    read in 1: their rejections are answers like any other;
//! 7. the handler: its effects in the request's transaction;
//! 8. its answer stored and committed with the effects; behind the
//!    layer, an answer of 500 and over is not kept: rolled back, the key
//!    freed ([`RequestCall::abandon`]).
//!
//! | the key's record | answer |
//! |---|---|
//! | header missing (a required key) | 400 |
//! | header malformed, repeated, over [`MAX_IDEMPOTENCY_KEY_LEN`] bytes, not printable ASCII | 400 |
//! | none | the handler runs: the key claimed, the effects and the answered row in one transaction (PostgreSQL); elsewhere the in-flight row is committed first |
//! | answered, same method, target and body | the stored status, headers and body, byte for byte, plus `Idempotent-Replayed: true` |
//! | answered or in flight, another method, target or body | 422 |
//! | in flight | 409 (the draft's choice: the client retries later, nothing waits on the server) |
//! | in flight past its lease (the process that ran it died; on PostgreSQL only a row another protocol version left) | taken over: the handler runs |
//! | in flight past its lease, its handler still running (slower than the lease) | 409: its transaction holds the row, and a retry does not wait for it |
//!
//! Two identical requests at the same moment: one of them claims the key
//! and runs, the other gets 409.
//!
//! On PostgreSQL the claim is a statement of the handler's transaction: it
//! reads the key's row and, where there is none, takes the key's
//! transaction-scoped advisory lock, tried and never waited for. A
//! concurrent duplicate finds no row and the lock held, and answers 409 at
//! once. No row is written until the answer: the answered row is inserted
//! with the effects and commits with them, so a request that fails, is
//! cancelled or dies with its process leaves nothing behind: its retry
//! runs at once, and there is no lease to wait out. A new key costs two
//! statements more than the handler's own (the claim, the answered row),
//! one row written, and no commit of its own.
//!
//! Elsewhere the in-flight row is committed before the handler, which a
//! concurrent duplicate reads (409); the handler's transaction locks the
//! row and is fenced by the request's lease: a request whose lease was
//! taken over cannot commit; a request that dies leaves its row until its
//! lease runs out.
//! Errors are problem details (`application/problem+json`) and link the
//! policy's documentation when the policy names one
//! ([`Idempotency::policy`]): the draft asks the server to publish how long
//! it keeps keys. A key is kept for at least its [`ttl`](Idempotency::ttl)
//! after the answer, until the archiver moves it to history with the other
//! expired records (`idem_runtime::archive`); the same key after that
//! is a new request.
//!
//! ## Connections: the pool against retries
//!
//! A request holds one connection of the pool at a time: its handler's
//! transaction for as long as the handler runs (5 to 8), and elsewhere than
//! on PostgreSQL a few statements in autocommit before it to read and claim
//! its key (step 4). The handlers
//! running at once are what the pool must hold, plus headroom for the
//! claims: a pool of `n` runs `n - 1` handlers at once and still has a
//! connection to answer replays, 409s and 422s (a new key's handler waits
//! for a connection to come back).
//!
//! Retries of a key whose request is in flight cost a connection for a few
//! milliseconds each and never wait on the server: on PostgreSQL they find
//! the key's lock held, elsewhere they read the record without locking it,
//! and answer 409. Past the lease (elsewhere than on PostgreSQL), the take-over first
//! locks the row with `FOR UPDATE SKIP LOCKED` (PostgreSQL, MariaDB 10.6+,
//! MySQL 8.0) in a transaction of its own: a row that a running handler's
//! transaction holds is skipped, and the retry answers 409 at once, where
//! an `UPDATE` alone would wait for that transaction with its connection
//! checked out. So 20 concurrent retries of a handler slower than its lease,
//! on a pool of 5, leave the pool free for other requests
//! (`retries_past_a_slow_handlers_lease_answer_409_and_leave_the_pool_free`
//! in the repository's tests). On MariaDB/MySQL the handler's transaction
//! locks its row by primary key: a lock by the unique key would be a
//! next-key lock, whose gap made every new key sorting just before this
//! one wait for the handler. Keep the lease above the handlers' longest
//! run all the same: the lease is what frees the key of a process that
//! died.
//!
//! SQLite has no row locks: a handler's transaction holds the database's
//! write lock until it commits, and every writer waits for it (up to the
//! busy timeout), a request with a new key (its in-flight row) and a
//! retry's take-over alike, each with its connection checked out. On SQLite
//! size the pool above the requests that may wait at once, and keep
//! handlers short: the write lock, not the pool, is what they share.
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
//!     let n = async {
//!         sqlx::query("INSERT INTO orders (body) VALUES (?)")
//!             .bind(req.body().to_vec()).execute(call.tx().conn()?).await?;
//!         Ok::<_, idem_runtime::Error>(())
//!     }.await;
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
//! ## Behind the layer, with an `#[idempotent]` handler and the outbox
//!
//! The handler is plain: the layer has read the body, looked up the key
//! and begun the transaction; what the handler does in [`RequestTx`]
//! commits with its answer.
//!
//! ```
//! use axum::{Json, Router, http::StatusCode, routing::post};
//! use idem_runtime::http::{Idempotency, RequestTx};
//! use idem_runtime::outbox::enqueue;
//! use idem_runtime::{Error, idempotent};
//! use sqlx::{Sqlite, SqliteConnection, SqlitePool};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Order { id: i64 }
//!
//! #[idempotent(key = "order:{o.id}", strategy = record, biz_type = "order")]
//! async fn book(tx: &mut SqliteConnection, o: &Order) -> Result<(), sqlx::Error> {
//!     sqlx::query("INSERT INTO orders (id) VALUES (?)").bind(o.id).execute(&mut *tx).await?;
//!     Ok(())
//! }
//!
//! async fn create_order(mut tx: RequestTx<Sqlite>, Json(o): Json<Order>)
//!     -> Result<StatusCode, StatusCode> {
//!     let failed = |_: Error| StatusCode::SERVICE_UNAVAILABLE; // 5xx: rolled back, not kept
//!     book(&mut tx, &o).await.map_err(failed)?;
//!     let msg = serde_json::json!({ "order": o.id });
//!     enqueue(&mut tx, "orders", &o.id.to_string(), &msg)
//!         .await.map_err(failed)?;
//!     Ok(StatusCode::CREATED) // stored with the effects, replayed to retries
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! # let pool = SqlitePool::connect_lazy("sqlite::memory:").unwrap();
//! let orders = Idempotency::new("orders", |parts| {
//!     parts.headers.get("x-api-key")?.to_str().ok().map(str::to_owned)
//! });
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order).layer(orders.layer(&pool).max_body(64 << 10)));
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

mod call;
mod callback;
mod key;
mod layer;
mod policy;
mod problem;
mod refusal;
mod request;
pub mod scheme;
mod stored;

pub use call::RequestCall;
pub use callback::{CallbackRejection, CallbackVerifier, SignedCallback};
pub use key::{IDEMPOTENCY_KEY, IdempotencyKey, KeyError, MAX_IDEMPOTENCY_KEY_LEN};
pub use layer::{DEFAULT_MAX_BODY, IdempotencyLayer, IdempotencyService, RequestTx};
pub use policy::Idempotency;
pub use problem::Problem;
pub use refusal::{CallbackError, MAX_SERIAL_LEN, SerialFrom};
pub use request::IdempotentRequest;
pub use scheme::{Scheme, SignatureScheme, Verified};
pub use stored::IDEMPOTENT_REPLAYED;

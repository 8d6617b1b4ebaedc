//! README, "HTTP: Idempotency-Key requests and callbacks": a `POST` made
//! retryable by its client's key, and a signed platform callback keyed by
//! its event id; a sign-up whose `#[idempotent]` notice and outbox message
//! run in the request's transaction, by hand and behind the layer.

use super::record::{Notice, send_notice};
use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idem_runtime::http::{CallbackVerifier, Idempotency, IdempotentRequest, RequestTx, SerialFrom, SignedCallback};
use idem_runtime::outbox::enqueue;
use serde::Deserialize;
use sqlx::{PgPool, Postgres};
use std::time::Duration;

/// The router's state.
#[derive(Clone, Debug)]
pub struct App {
    /// The database.
    pub pool: PgPool,
    /// `POST /transfers`' policy.
    pub transfers: Idempotency,
    /// The notice platform's signature check.
    pub verifier: CallbackVerifier,
}

impl FromRef<App> for CallbackVerifier {
    fn from_ref(app: &App) -> Self {
        app.verifier.clone()
    }
}

/// The platform's event ids: `evt_` and digits.
fn event_id(s: &str) -> Result<(), String> {
    match s.strip_prefix("evt_") {
        Some(d) if !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()) => Ok(()),
        _ => Err("not evt_<digits>".into()),
    }
}

/// The service: `POST /transfers` and `POST /callbacks/notice`.
pub fn app(pool: PgPool, secret: &[u8]) -> Router {
// README: http
let transfers = Idempotency::new("transfers", |parts| {
    // The caller a key belongs to (here the API key; an authenticated user id in practice).
    parts.headers.get("x-api-key")?.to_str().ok().map(str::to_owned)
})
.ttl(Duration::from_secs(24 * 3600))            // the answer is replayed for 24 h
.lease(Duration::from_secs(60))                 // a request that died in flight holds its key 60 s
.policy("https://api.example.com/docs/idempotency"); // linked from every 400/409/422

async fn create_transfer(State(app): State<App>, req: IdempotentRequest) -> Response {
    let mut call = match app.transfers.begin(&app.pool, &req).await {
        Ok(call) => call,
        Err(answer) => return answer, // the stored answer (replay), or 400 / 409 / 422
    };
    let done = async {
        sqlx::query("INSERT INTO readme_transfer (body) VALUES ($1)")
            .bind(req.body().to_vec()).execute(call.tx().conn()?).await?;
        Ok::<_, idem_runtime::Error>(())
    }.await;
    match done {
        // The effect, the answer and the key's record commit together.
        Ok(_) => call.finish((StatusCode::CREATED, "transfer accepted")).await,
        // Rolled back, key freed: the client's retry runs again.
        Err(_) => call.abandon(StatusCode::SERVICE_UNAVAILABLE).await,
    }
}

// Callbacks: X-Signature = hex(HMAC-SHA256(secret, "{X-Timestamp}.{raw body}")),
// timestamps within 5 min, the event id from the body as the key.
let verifier = CallbackVerifier::new(secret.to_vec())
    .tolerance(Duration::from_secs(300))
    .serial(SerialFrom::JsonField("event_id"), event_id);

async fn notice_callback(State(app): State<App>, cb: SignedCallback) -> Response {
    // Only verified callbacks get here (else 400 / 401, before the database).
    let text = String::from_utf8_lossy(&cb.body).into_owned();
    let notice = Notice { msg_id: cb.serial().to_owned(), user_id: 1, text };
    match send_notice(&app.pool, &notice).await {   // #[idempotent(key = "notice:{msg.msg_id}", …)]
        Ok(_) => StatusCode::OK.into_response(),     // Executed or Duplicate: 200 either way
        Err(e) if e.is_retryable() => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        Err(_) => StatusCode::CONFLICT.into_response(),
    }
}

Router::new()
    .route("/transfers", post(create_transfer))
    .route("/callbacks/notice", post(notice_callback))
    .with_state(App { pool, transfers, verifier })
// README: end
}

/// A sign-up's body.
#[derive(Debug, Deserialize)]
pub struct Signup {
    /// The new user.
    pub user_id: i64,
}

/// The sign-up routes' state.
#[derive(Clone, Debug)]
pub struct Signups {
    /// The database.
    pub pool: PgPool,
    /// `POST /signups`' policy.
    pub signups: Idempotency,
}

/// The welcome notice of a sign-up.
fn welcome(user_id: i64) -> Notice {
    Notice { msg_id: format!("welcome-{user_id}"), user_id, text: "welcome".into() }
}

// README: http_compose
// The request's transaction is a CallerTx: #[idempotent] handlers and outbox messages run in it.
async fn create_signup(State(app): State<Signups>, req: IdempotentRequest) -> Response {
    let mut call = match app.signups.begin(&app.pool, &req).await {
        Ok(call) => call,
        Err(answer) => return answer,
    };
    let signup: Signup = match req.json() {
        Ok(signup) => signup,
        Err(answer) => return call.abandon(answer).await, // 400, the key freed
    };
    let done = async {
        let sent = send_notice(call.tx(), &welcome(signup.user_id)).await?; // under a savepoint
        let msg = serde_json::json!({ "user_id": signup.user_id, "notice": sent.into_value() });
        enqueue(call.tx(), "readme.signups", &signup.user_id.to_string(), &msg).await?;
        Ok::<_, idem_runtime::Error>(())
    }.await;
    match done {
        // The notice, its record, the outbox row, the answer and the key's record: one commit.
        Ok(()) => call.finish((StatusCode::CREATED, "signed up")).await,
        Err(_) => call.abandon(StatusCode::SERVICE_UNAVAILABLE).await,
    }
}
// README: end

/// `POST /signups`, the handler calling `begin` and `finish` itself.
pub fn signups_by_hand(pool: PgPool) -> Router {
    let signups = Idempotency::new("readme_signups", |parts| {
        parts.headers.get("x-api-key")?.to_str().ok().map(str::to_owned)
    });
    Router::new()
        .route("/signups", post(create_signup))
        .with_state(Signups { pool, signups })
}

/// `POST /signups`, behind `Idempotency::layer`.
pub fn signups_layered(pool: PgPool) -> Router {
// README: http_layer
// The same handler, plain: the layer reads the body (over max_body: 413), answers the
// replay / 400 / 401 / 409 / 422 itself, begins the transaction, and after the handler
// stores and commits its answer with its effects (a 5xx: rolled back, not kept, key freed).
async fn create_signup(mut tx: RequestTx<Postgres>, Json(signup): Json<Signup>) -> Response {
    let done = async {
        let sent = send_notice(&mut tx, &welcome(signup.user_id)).await?;
        let msg = serde_json::json!({ "user_id": signup.user_id, "notice": sent.into_value() });
        enqueue(&mut tx, "readme.signups", &signup.user_id.to_string(), &msg).await?;
        Ok::<_, idem_runtime::Error>(())
    }.await;
    match done {
        Ok(()) => (StatusCode::CREATED, "signed up").into_response(),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

let signups = Idempotency::new("readme_signups_layered", |parts| {
    parts.headers.get("x-api-key")?.to_str().ok().map(str::to_owned)
});
Router::new()
    .route("/signups", post(create_signup).layer(signups.layer(&pool).max_body(64 << 10)))
// README: end
}

//! The service's domain and routes: `POST /orders` behind the
//! Idempotency-Key layer places an order (an `#[idempotent]` record) and
//! enqueues its coupon's deduction in the request's transaction; the relay
//! delivers the deduction to an `#[idempotent]` state machine; `GET
//! /metrics` and `GET /healthz` are for the operator.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem_runtime::http::{Idempotency, RequestTx};
use idem_runtime::outbox::{Relay, RelayHandle, enqueue};
use idem_runtime::{Outcome, State as Lifecycle, idempotent};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::{Deserialize, Serialize};
use sqlx::{Sqlite, SqliteConnection, SqlitePool};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The outbox topic of a coupon's deduction.
pub(crate) const DEDUCT: &str = "coupon.deduct";

/// The service's own tables (idem's come from `idem_runtime::migrate`).
pub(crate) const TABLES: [&str; 3] = [
    "CREATE TABLE IF NOT EXISTS svc_coupon (id INTEGER PRIMARY KEY, status TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS svc_order (id INTEGER PRIMARY KEY, coupon_id INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS svc_deduction (coupon_id INTEGER NOT NULL, order_id INTEGER NOT NULL)",
];

/// A coupon's lifecycle, stored as `UNUSED` / `USED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Lifecycle)]
pub(crate) enum CouponState {
    /// Not deducted yet.
    Unused,
    /// Deducted by an order.
    Used,
}

/// `POST /orders`' body, and the deduction message it enqueues.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Order {
    /// The order's id, chosen by the client.
    pub(crate) order_id: i64,
    /// The coupon it uses.
    pub(crate) coupon_id: i64,
}

/// Places an order once per order id, whatever the request keys: the
/// record answers `Duplicate` to a second request for the same order (a
/// different client key, or a key whose answer expired).
#[idempotent(
    key = "order:{order.order_id}",
    strategy = record,
    biz_type = "svc_order",
    fingerprint = [order],
)]
pub(crate) async fn place_order(
    tx: &mut SqliteConnection,
    order: &Order,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO svc_coupon (id, status) VALUES (?, 'UNUSED') ON CONFLICT (id) DO NOTHING",
    )
    .bind(order.coupon_id)
    .execute(&mut *tx)
    .await?;
    sqlx::query("INSERT INTO svc_order (id, coupon_id) VALUES (?, ?)")
        .bind(order.order_id)
        .bind(order.coupon_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Deducts the coupon once: a second delivery (or another order of the
/// same coupon) finds it `USED` and answers `Duplicate`.
#[idempotent(
    key = "coupon-deduct:{msg.order_id}",
    strategy = state_machine,
    table = "svc_coupon",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
pub(crate) async fn deduct_coupon(
    tx: &mut SqliteConnection,
    msg: &Order,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO svc_deduction (coupon_id, order_id) VALUES (?, ?)")
        .bind(msg.coupon_id)
        .bind(msg.order_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// `POST /orders`: the order, its record, the deduction message, the
/// answer and the Idempotency-Key's record commit together (the layer
/// commits after the handler; a 5xx rolls everything back and frees the
/// key).
async fn create_order(mut tx: RequestTx<Sqlite>, Json(order): Json<Order>) -> Response {
    let placed = match place_order(&mut tx, &order).await {
        Ok(placed) => placed,
        Err(e) if e.is_retryable() => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
        Err(e) => return (StatusCode::CONFLICT, e.to_string()).into_response(),
    };
    if let Outcome::Duplicate(_) = placed {
        return (StatusCode::OK, "order already placed").into_response();
    }
    let msg = serde_json::to_value(&order).expect("an order is JSON");
    match enqueue(&mut tx, DEDUCT, &format!("order-{}", order.order_id), &msg).await {
        Ok(_) => (StatusCode::CREATED, "order placed").into_response(),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// What the routes share.
#[derive(Clone, Debug)]
pub(crate) struct App {
    /// The relay, for the readiness probe (taken at shutdown).
    pub(crate) relay: Arc<Mutex<Option<RelayHandle>>>,
    /// The Prometheus recorder's handle.
    pub(crate) prometheus: PrometheusHandle,
}

/// `GET /healthz`: 200 while the relay runs, else 503 with why it ended
/// (a panic, a refused schema, a stop).
async fn health(State(app): State<App>) -> Response {
    let status = match app.relay.lock().expect("relay").as_ref() {
        Some(relay) => relay.status(),
        None => return (StatusCode::SERVICE_UNAVAILABLE, "stopping").into_response(),
    };
    match status.is_running() {
        true => (StatusCode::OK, "ok").into_response(),
        false => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("relay: {status:?}"),
        )
            .into_response(),
    }
}

/// `GET /metrics`: the process's metrics, idem's among them.
async fn metrics(State(app): State<App>) -> String {
    app.prometheus.render()
}

/// The relay delivering the deductions; `work`: the simulated time the
/// downstream takes per deduction.
pub(crate) fn relay(pool: &SqlitePool, work: Duration) -> RelayHandle {
    Relay::new(pool.clone())
        .route(DEDUCT, move |d, msg: Order| async move {
            tokio::time::sleep(work).await;
            deduct_coupon(d.source(), &msg).await
        })
        .concurrency(4)
        .spawn()
}

/// The routes: the caller of an Idempotency-Key is its `x-api-key`.
pub(crate) fn router(pool: &SqlitePool, app: App) -> Router {
    let orders = Idempotency::new("svc_orders", |parts| {
        parts
            .headers
            .get("x-api-key")?
            .to_str()
            .ok()
            .map(str::to_owned)
    })
    .ttl(Duration::from_secs(24 * 3600));
    Router::new()
        .route("/orders", post(create_order).layer(orders.layer(pool)))
        .route("/healthz", get(health))
        .route("/metrics", get(metrics))
        .with_state(app)
}

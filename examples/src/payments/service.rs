//! The HTTP service: one route per platform, each checked by idem's preset
//! for that platform, and their answers.

use super::handler::{PaymentError, apply_payment};
use super::keys::{
    ALIPAY_PUBLIC_PEM, STRIPE_NEXT_SECRET, STRIPE_SECRET, WECHATPAY_APIV3_KEY, WECHATPAY_KEYS,
};
use super::protocol::{
    Payment, Receipt, Rejection, check_digits_serial, check_stripe_serial, error,
};
use super::read::{alipay_payment, stripe_payment, wechatpay_payment};
use super::{ALIPAY_PATH, MAX_BODY, REPLAY_HEADER, STRIPE_PATH, WECHATPAY_PATH};
use axum::extract::{DefaultBodyLimit, FromRef, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idem_runtime::Outcome;
use idem_runtime::http::scheme::{Alipay, Stripe, WeChatPay, WeChatPaySerial};
use idem_runtime::http::{SerialFrom, SignedCallback};
use sqlx::PgPool;

/// What the merchant holds to check each platform's callbacks: idem's
/// presets, configured.
#[derive(Debug, Clone)]
pub struct Merchant {
    /// Stripe's endpoint secrets.
    pub stripe: Stripe,
    /// Alipay's public key.
    pub alipay: Alipay,
    /// WeChat Pay's platform keys and the APIv3 key.
    pub wechatpay: WeChatPay,
}

impl Merchant {
    /// The presets with the demo's keys ([`keys`](super::keys)).
    pub fn demo() -> Self {
        let [(id1, _, public1), (id2, _, public2)] = WECHATPAY_KEYS;
        // README: payment_presets
        // Stripe: both endpoint secrets while one rolls; the serial is the event's id.
        let stripe = Stripe::new(STRIPE_SECRET)
            .secret(STRIPE_NEXT_SECRET)
            .serial(SerialFrom::JsonField("id"), check_stripe_serial);
        // Alipay: its public key (RSA2); the serial is the trade's `trade_no`,
        // one booking per trade whatever its notifications.
        let alipay = Alipay::new(ALIPAY_PUBLIC_PEM)
            .expect("an RSA public key")
            .serial("trade_no", check_digits_serial);
        // WeChat Pay: its platform keys by the name Wechatpay-Serial gives them
        // (two during a rotation), the APIv3 key that decrypts the resource;
        // the serial is the decrypted transaction_id.
        let wechatpay = WeChatPay::new(id1, public1, WECHATPAY_APIV3_KEY)
            .and_then(|w| w.key(id2, public2))
            .expect("RSA public keys and a 32-byte APIv3 key")
            .serial(
                WeChatPaySerial::Resource("transaction_id"),
                check_digits_serial,
            );
        // README: end
        Merchant {
            stripe,
            alipay,
            wechatpay,
        }
    }
}

#[derive(Clone)]
struct App {
    pool: PgPool,
    merchant: Merchant,
}

impl FromRef<App> for Stripe {
    fn from_ref(app: &App) -> Self {
        app.merchant.stripe.clone()
    }
}

impl FromRef<App> for Alipay {
    fn from_ref(app: &App) -> Self {
        app.merchant.alipay.clone()
    }
}

impl FromRef<App> for WeChatPay {
    fn from_ref(app: &App) -> Self {
        app.merchant.wechatpay.clone()
    }
}

/// The service: `POST` [`STRIPE_PATH`], [`ALIPAY_PATH`] and
/// [`WECHATPAY_PATH`] (see the module's table of answers).
pub fn app(pool: PgPool, merchant: Merchant) -> Router {
    Router::new()
        .route(STRIPE_PATH, post(stripe))
        .route(ALIPAY_PATH, post(alipay))
        .route(WECHATPAY_PATH, post(wechatpay))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(App { pool, merchant })
}

// README: payment_routes
// Each route's extractor checks its platform's signature before the handler (a refusal is
// answered in the platform's format, before the database) and reads its serial.
async fn stripe(State(app): State<App>, cb: SignedCallback<Stripe>) -> Response {
    match book(&app.pool, stripe_payment(cb.serial(), cb.payload())).await {
        Ok((receipt, replayed)) => answer(Json(receipt), replayed), // any 2xx stops Stripe
        Err(refused) => refused,
    }
}

async fn alipay(State(app): State<App>, cb: SignedCallback<Alipay>) -> Response {
    match book(&app.pool, alipay_payment(cb.serial(), cb.payload())).await {
        Ok((_, replayed)) => answer(cb.accepted(), replayed), // `success`, or Alipay retries
        Err(refused) => refused,
    }
}

async fn wechatpay(State(app): State<App>, cb: SignedCallback<WeChatPay>) -> Response {
    // The payload is the resource, decrypted with the APIv3 key.
    match book(&app.pool, wechatpay_payment(cb.serial(), cb.payload())).await {
        Ok((receipt, replayed)) => answer(Json(receipt), replayed), // 200 stops WeChat Pay
        Err(refused) => refused,
    }
}

/// The payment booked once (`#[idempotent(strategy = record)]`, the order's state checked in
/// the same transaction): its receipt, and whether it was stored by an earlier delivery.
async fn book(
    pool: &PgPool,
    read: Result<Payment, Rejection>,
) -> Result<(Receipt, bool), Response> {
    let payment = read.map_err(IntoResponse::into_response)?;
    match apply_payment(pool, &payment).await {
        Ok(Outcome::Executed(receipt)) => Ok((receipt, false)),
        Ok(Outcome::Duplicate(Some(receipt))) => Ok((receipt, true)),
        Ok(Outcome::Duplicate(None)) => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
            "no receipt",
        )),
        Err(e) => Err(error_response(&e)), // 409 / 422 / 503 (the platform retries)
    }
}
// README: end

/// `accepted`, marked `X-Idempotent-Replay: true` when an earlier delivery
/// booked the payment.
fn answer(accepted: impl IntoResponse, replayed: bool) -> Response {
    let mut response = accepted.into_response();
    if replayed {
        let true_ = HeaderValue::from_static("true");
        response.headers_mut().insert(REPLAY_HEADER, true_);
    }
    response
}

/// The HTTP answer for an error of [`apply_payment`].
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
                let (status, code) = payment_error_code(p);
                error(status, code, p.to_string())
            }
            None => error(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", msg),
        },
        _ => error(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", msg),
    }
}

fn payment_error_code(p: &PaymentError) -> (StatusCode, &'static str) {
    match p {
        PaymentError::UnknownOrder { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "UNKNOWN_ORDER"),
        PaymentError::AmountMismatch { .. } => {
            (StatusCode::UNPROCESSABLE_ENTITY, "AMOUNT_MISMATCH")
        }
        PaymentError::AlreadyPaid { .. } => (StatusCode::CONFLICT, "ORDER_ALREADY_PAID"),
        PaymentError::NotPayable { .. } => (StatusCode::CONFLICT, "ORDER_NOT_PAYABLE"),
        PaymentError::SerialReused { .. } => (StatusCode::CONFLICT, "SERIAL_REUSED"),
        PaymentError::Database(_) => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
    }
}

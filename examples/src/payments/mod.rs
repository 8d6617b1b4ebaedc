//! # Third-party payment callbacks
//!
//! A payment platform tells the merchant that an order was paid by calling
//! the merchant back, and its retry policy is its safety net: **any answer
//! other than 200, and any connection time-out, makes it push the same
//! callback again**, whether or not the merchant already acted on it
//! (*Async Idempotency in Practice*, 02.3). So the callback endpoint runs
//! more than once per payment — one after the other when a response is
//! lost, side by side when the platform's pushes overlap — and must pay the
//! order exactly once and answer every repetition with success.
//!
//! The article's recipe for this entry point (05.2): **the platform's
//! payment serial as the idempotency key, plus the order's business state
//! as secondary verification**; and, since the serial comes from outside,
//! **validated for legitimacy** (04, risk 1) so that a crafted ID cannot
//! bypass or poison the idempotency logic. Here:
//!
//! 1. **The platform's own signature first.** Each platform has its route,
//!    and each route's [`SignedCallback`](idem_runtime::http::SignedCallback)
//!    extractor is idem's preset for that platform
//!    ([`Merchant::demo`] configures them), which checks the platform's
//!    signature before the handler runs, and so before the database:
//!    - **Stripe** (`SignedCallback<Stripe>`): `Stripe-Signature: t=…,v1=…`,
//!      the hex HMAC-SHA256 of `"{t}.{body}"` under an endpoint secret
//!      (two are active while one rolls: Stripe sends a `v1` for each), `t`
//!      within 5 minutes.
//!    - **Alipay** (`SignedCallback<Alipay>`): the form's `sign`, SHA256withRSA
//!      (`sign_type=RSA2`) over the other parameters sorted by name, under
//!      Alipay's public key. Alipay signs no timestamp: its retries are the
//!      same form, told apart by their serial only.
//!    - **WeChat Pay v3** (`SignedCallback<WeChatPay>`): `Wechatpay-Signature`,
//!      SHA256withRSA over `"{Wechatpay-Timestamp}\n{Wechatpay-Nonce}\n{body}\n"`
//!      under the platform key `Wechatpay-Serial` names (two during a
//!      rotation), the timestamp within 5 minutes; then the body's `resource`
//!      is decrypted (AES-256-GCM under the merchant's APIv3 key) and is
//!      what the handler reads.
//!
//!    A forged, tampered, stale or malformed callback is refused in the
//!    platform's format (Stripe: a problem, 400 or 401; Alipay: `failure`;
//!    WeChat Pay: `{"code":"FAIL",…}`) and never reaches the idempotency
//!    table.
//! 2. **Serial format.** The presets read each platform's serial from what
//!    it signed and check its format before the handler: Stripe's event id
//!    (`evt_` and letters or digits, [`check_stripe_serial`]), Alipay's
//!    `trade_no` and WeChat Pay's `transaction_id` (16 to 32 digits,
//!    [`check_digits_serial`]); anything else (`../../x`, 300 digits) is
//!    refused, 400, nothing written. The `#[idempotent]` handler's
//!    `validate = validate_key` checks the derived key again
//!    ([`Error::InvalidKey`](idem_runtime::Error::InvalidKey)) before its
//!    transaction begins.
//! 3. **The payment.** The signed payload is read as one [`Payment`]
//!    (platform, serial, order, amount in fen) by the platform's own
//!    fields ([`stripe_payment`], [`alipay_payment`],
//!    [`wechatpay_payment`]): a success (`payment_intent.succeeded` or a
//!    paid `checkout.session.completed`, `TRADE_SUCCESS`, `SUCCESS`), of
//!    this merchant (Alipay's `app_id`, WeChat Pay's `mchid`), in CNY.
//! 4. **Key and record.** [`apply_payment`] is an
//!    `#[idempotent(strategy = record)]` handler keyed
//!    `pay-callback:{platform}:{serial}`. In one transaction it claims the
//!    record (`idem_record`, with the payment as its fingerprint), runs the
//!    body, and stores the body's [`Receipt`]; a repeated callback finds the
//!    record and gets the stored receipt back — Stripe and WeChat Pay get it
//!    as the 200's body, byte for byte, Alipay gets `success`, all with
//!    `X-Idempotent-Replay: true`. The same serial with another amount (or
//!    order) has another fingerprint:
//!    [`Error::KeyConflict`](idem_runtime::Error::KeyConflict), 409.
//! 5. **Secondary verification.** The body locks the order
//!    (`SELECT … FOR UPDATE`, same transaction), checks it against the
//!    payment (it exists, the amount matches, it is `PENDING_PAYMENT`),
//!    flips it `PENDING_PAYMENT → PAID` with a guarded `UPDATE` that must
//!    change exactly one row, and writes the payment ledger row. An order
//!    already `PAID` *by this payment* (possible only once the record has
//!    been archived) is answered from the ledger with the same receipt; an
//!    order paid by *another* serial or platform is a double payment the
//!    merchant must not book: 409. The `record` and `state_machine`
//!    strategies cannot be combined in one attribute, so this check is
//!    written by hand — on the record's own transaction, which is what
//!    makes it a verification and not a race.
//!
//! ## Answers
//!
//! | status | body | when |
//! |---|---|---|
//! | 200 | Stripe, WeChat Pay: the [`Receipt`]; Alipay: `success` | paid now, or a repetition (the stored receipt, byte for byte; `X-Idempotent-Replay: true`) |
//! | 400 / 401 | the preset's: a problem (Stripe), `failure` (Alipay), `{"code":"FAIL"}` (WeChat Pay) | a signature, timestamp or serial missing or malformed (400), a signature no active key made or a stale timestamp (401), a WeChat Pay resource that does not decrypt (400); nothing read from or written to the database |
//! | 400 | `BAD_REQUEST` | the signed payload lacks a field its platform documents, or its order number is not one |
//! | 409 | `SERIAL_REUSED` | the serial was used before with another payment ([`Error::KeyConflict`](idem_runtime::Error::KeyConflict)); nothing written |
//! | 409 | `ORDER_ALREADY_PAID` | the order is `PAID` by another serial or platform: a second payment for one order, for a human (refund); nothing written |
//! | 409 | `ORDER_NOT_PAYABLE` | the order is in another state (`CANCELLED`) |
//! | 413 | — (axum's plain-text rejection) | the body is over [`MAX_BODY`] bytes; nothing read |
//! | 422 | `UNKNOWN_ORDER`, `AMOUNT_MISMATCH`, `UNSUPPORTED_STATUS`, `OTHER_MERCHANT` | the payment contradicts the merchant's order, is not a success notification, or is another merchant's |
//! | 503 | `RETRY_LATER` | a retryable failure (lost connection, pool time-out, deadlock, commit outcome unknown): the platform's retry is safe |
//! | 500 | `INTERNAL` | anything else |
//!
//! The service's own refusals are JSON [`ErrorBody`] `{"code": …,
//! "message": …}` (WeChat Pay's documented shape). Every platform retries
//! whatever is not its success answer (that is its policy, not ours), so a
//! permanent 4xx only costs it its bounded retries; 409 for a double
//! payment deliberately keeps the conflict visible on the platform's side.
//!
//! ## The simulated platforms
//!
//! [`Platform`] builds each [`Charge`]'s notification as its platform does
//! ([`Notification`]: a Stripe event, an Alipay form, a WeChat Pay
//! notification with its encrypted resource) and signs it with
//! [`PlatformKeys`]: the demo keys of [`keys`], which are **demo keys
//! only** (RSA pairs shipped as files so that a debug build does not
//! generate them; their private halves are public).
//!
//! ## Tables (PostgreSQL, created by [`migrate`])
//!
//! - `merchant_orders (id, amount_cents, status, paid_by, …)`: status
//!   `PENDING_PAYMENT`, `PAID` or `CANCELLED`; `paid_by`
//!   (`<platform>:<serial>`) is set exactly when the order is `PAID` (a
//!   check constraint).
//! - `merchant_payments (platform, serial, order_id UNIQUE, amount_cents,
//!   paid_at)`, keyed by platform and serial: the payment ledger, one row
//!   per booked payment.
//! - idem's `idem_record` (`biz_type = 'payment_callback'`, `biz_no` = the
//!   order id).

mod faults;
mod handler;
pub mod keys;
mod notify;
mod platform;
mod protocol;
mod read;
mod schema;
mod service;

pub use faults::{Fault, Faults};
pub use handler::{PaymentError, apply_payment, paid_by};
pub use notify::{Charge, Notification, PlatformKeys};
pub use platform::{Attempt, Delivered, GaveUp, Platform, unix_now};
pub use protocol::{
    ALIPAY, ErrorBody, Payment, Receipt, Rejection, STRIPE, WECHATPAY, check_digits_serial,
    check_stripe_serial, error, serial, validate_key,
};
pub use read::{alipay_payment, stripe_payment, wechatpay_payment, yuan_to_cents};
pub use schema::{create_order, migrate};
pub use service::{Merchant, app, error_response};

/// Stripe's route.
pub const STRIPE_PATH: &str = "/callbacks/stripe";
/// Alipay's route (its `notify_url`).
pub const ALIPAY_PATH: &str = "/callbacks/alipay";
/// WeChat Pay's route (its `notify_url`).
pub const WECHATPAY_PATH: &str = "/callbacks/wechatpay";
/// The platforms, in the order the demo uses them.
pub const PLATFORMS: [&str; 3] = [STRIPE, ALIPAY, WECHATPAY];
/// Set (`true`) on a 200 that replays the stored receipt of an earlier call.
pub const REPLAY_HEADER: &str = "x-idempotent-replay";
/// The idempotency key's prefix (the key is `pay-callback:<platform>:<serial>`).
pub const KEY_PREFIX: &str = "pay-callback:";
/// The largest callback body accepted, in bytes.
pub const MAX_BODY: usize = 16 * 1024;

/// An order awaiting its payment.
pub const PENDING_PAYMENT: &str = "PENDING_PAYMENT";
/// A paid order.
pub const PAID: &str = "PAID";
/// A cancelled order (cannot be paid).
pub const CANCELLED: &str = "CANCELLED";

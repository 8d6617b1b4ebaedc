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
//! 1. **Signature first.** The platform signs the raw request body with
//!    HMAC-SHA256 under a secret shared with the merchant and sends
//!    `X-Timestamp: <unix seconds>` and `X-Signature:
//!    hex(hmac_sha256(secret, "{timestamp}.{body}"))`. The runtime's
//!    [`SignedCallback`](idem_runtime::http::SignedCallback) extractor,
//!    configured by [`verifier`], checks it over the *raw bytes* (before
//!    parsing, in constant time) and refuses a timestamp more than 5
//!    minutes from now (a captured callback sent again later): 400 for
//!    missing or malformed headers, 401 for a signature that does not
//!    match or a stale timestamp, before anything touches the database. A
//!    forged or tampered callback never reaches the idempotency table.
//! 2. **Serial format.** A serial is `PAY` followed by exactly 20 ASCII
//!    digits (see [`check_serial`]). The extractor reads it from the body
//!    and rejects anything else (`../../x`, a 10 KB string, lower case,
//!    control characters): 400, nothing written. The `#[idempotent]`
//!    handler's `validate = validate_serial` checks the derived key again
//!    ([`Error::InvalidKey`](idem_runtime::Error::InvalidKey)) before its
//!    transaction begins.
//! 3. **Key and record.** [`apply_callback`] is an
//!    `#[idempotent(strategy = record)]` handler keyed
//!    `pay-callback:{serial}`. In one transaction it claims the record
//!    (`idem_record`, with a fingerprint of the whole callback), runs the
//!    body, and stores the body's [`Receipt`]; a repeated callback finds the
//!    record and gets the stored receipt back — the HTTP answer is 200 with
//!    byte-identical JSON (plus `X-Idempotent-Replay: true`). The same serial
//!    with another amount (or order) has another fingerprint:
//!    [`Error::KeyConflict`](idem_runtime::Error::KeyConflict), 409.
//! 4. **Secondary verification.** The body locks the order
//!    (`SELECT … FOR UPDATE`, same transaction), checks it against the
//!    callback (it exists, the amount matches, it is `PENDING_PAYMENT`),
//!    flips it `PENDING_PAYMENT → PAID` with a guarded `UPDATE` that must
//!    change exactly one row, and writes the payment ledger row. An order
//!    already `PAID` *by this serial* (possible only once the record has
//!    been archived) is answered from the ledger with the same receipt; an
//!    order paid by *another* serial is a double payment the merchant must
//!    not book: 409. The `record` and `state_machine` strategies cannot be
//!    combined in one attribute, so this check is written by hand — on the
//!    record's own transaction, which is what makes it a verification and
//!    not a race.
//!
//! ## Status codes
//!
//! | status | `code` | when |
//! |---|---|---|
//! | 200 | — ([`Receipt`]) | paid now, or a repetition (the stored receipt, byte for byte; `X-Idempotent-Replay: true`) |
//! | 400 | `BAD_SIGNATURE` | `X-Signature` or `X-Timestamp` missing or malformed; nothing read from or written to the database |
//! | 401 | `BAD_SIGNATURE` | not the HMAC of the timestamp and raw body, or a timestamp more than 5 minutes from now; nothing read or written |
//! | 400 | `BAD_REQUEST` | the body is not a callback (JSON `{serial, order_id, amount_cents, status}`) though its serial is valid |
//! | 400 | `BAD_SERIAL` | the body is not JSON with a `serial`, or the serial is not `PAY` + 20 digits; nothing written |
//! | 409 | `SERIAL_REUSED` | the serial was used before with another payload ([`Error::KeyConflict`](idem_runtime::Error::KeyConflict)); nothing written |
//! | 409 | `ORDER_ALREADY_PAID` | the order is `PAID` by another serial: a second payment for one order, for a human (refund); nothing written |
//! | 409 | `ORDER_NOT_PAYABLE` | the order is in another state (`CANCELLED`) |
//! | 413 | — (axum's plain-text rejection) | the body is over [`MAX_BODY`] bytes; nothing read |
//! | 422 | `UNKNOWN_ORDER`, `AMOUNT_MISMATCH`, `UNSUPPORTED_STATUS` | the callback contradicts the merchant's order, or is not a success notification |
//! | 503 | `RETRY_LATER` | a retryable failure (lost connection, pool time-out, deadlock, commit outcome unknown): the platform's retry is safe |
//! | 500 | `INTERNAL` | anything else |
//!
//! Every error body but 413's is JSON [`ErrorBody`] `{"code": …, "message": …}`. The
//! platform retries every non-200 answer (that is its policy, not ours), so
//! a permanent 4xx only costs it its bounded retries; 409 for a double
//! payment deliberately keeps the conflict visible on the platform's side.
//!
//! ## Tables (PostgreSQL, created by [`migrate`])
//!
//! - `pay_orders (id, amount_cents, status, paid_serial, …)`: status
//!   `PENDING_PAYMENT`, `PAID` or `CANCELLED`; `paid_serial` is set exactly
//!   when the order is `PAID` (a check constraint).
//! - `pay_payments (serial PRIMARY KEY, order_id UNIQUE, amount_cents,
//!   paid_at)`: the payment ledger, one row per booked payment.
//! - idem's `idem_record` (`biz_type = 'payment_callback'`, `biz_no` = the
//!   order id).

mod faults;
mod handler;
mod platform;
mod protocol;
mod schema;
mod service;

pub use faults::{Fault, Faults};
pub use handler::{PaymentError, apply_callback};
pub use platform::{Attempt, Delivered, GaveUp, Platform};
pub use protocol::{Callback, ErrorBody, Receipt, check_serial, serial, validate_serial, verifier};
pub use schema::{create_order, migrate};
pub use service::{Rejection, app, error_response, read_callback};

/// The callback endpoint's path.
pub const CALLBACK_PATH: &str = "/callbacks/payment";
/// The header carrying `hex(hmac_sha256(secret, "{timestamp}.{raw_body}"))`.
pub const SIGNATURE_HEADER: &str = "x-signature";
/// The header carrying the signing time, Unix seconds.
pub const TIMESTAMP_HEADER: &str = "x-timestamp";
/// Set (`true`) on a 200 that replays the stored receipt of an earlier call.
pub const REPLAY_HEADER: &str = "x-idempotent-replay";
/// A serial's prefix.
pub const SERIAL_PREFIX: &str = "PAY";
/// The number of digits after the prefix.
pub const SERIAL_DIGITS: usize = 20;
/// The idempotency key's prefix (the key is `pay-callback:<serial>`).
pub const KEY_PREFIX: &str = "pay-callback:";
/// The largest callback body accepted, in bytes.
pub const MAX_BODY: usize = 16 * 1024;

/// An order awaiting its payment.
pub const PENDING_PAYMENT: &str = "PENDING_PAYMENT";
/// A paid order.
pub const PAID: &str = "PAID";
/// A cancelled order (cannot be paid).
pub const CANCELLED: &str = "CANCELLED";

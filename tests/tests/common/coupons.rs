//! The coupon of the tests' handlers: its state column (the state machine
//! strategy's `from` and `to`) and the message that takes it off an order.
//! Each test writes its own handler (key, table, effect) around them.

use idem_runtime::State;
use serde::{Deserialize, Serialize};

/// A coupon's state, stored as `UNUSED`, `USED`, `EXPIRED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
pub(crate) enum CouponState {
    Unused,
    Used,
    /// A state only the state machine tests' coupons are put in (a
    /// transition from a state the coupon is not in).
    Expired,
}

/// "Deduct coupon `coupon_id` for order `order_id`": the message of the
/// relay, broker and fault tests (the other binaries send none).
#[allow(dead_code)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Deduct {
    pub(crate) coupon_id: i64,
    pub(crate) order_id: i64,
}

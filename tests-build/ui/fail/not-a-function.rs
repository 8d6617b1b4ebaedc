#![allow(dead_code)]

use idem_runtime::idempotent;

#[idempotent(key = "coupon-deduct:{msg_id}", strategy = unique_insert, constraint = "deduction.msg_id")]
struct DeductCoupon {
    msg_id: String,
    coupon_id: i64,
}

fn main() {}

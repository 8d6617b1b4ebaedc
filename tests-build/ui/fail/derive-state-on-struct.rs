#![allow(dead_code)]

use idem_runtime::State;

#[derive(Debug, Clone, PartialEq, Eq, State)]
struct CouponState {
    used: bool,
}

fn main() {}

//! The strategies (`idem-runtime/src/strategy/`), keys (`key.rs`) and
//! fingerprints (`fingerprint.rs`), against the real servers: one test
//! binary, a module per file.

#[macro_use]
#[path = "../common"]
mod common {
    pub(crate) mod coupons;
    #[macro_use]
    pub(crate) mod strategies;
}

mod fingerprint;
mod keys;
mod record;
mod scoping;
mod state_machine;
mod unique_insert;

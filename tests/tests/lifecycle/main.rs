//! The lifecycle of the runtime's background tasks against the real
//! servers: a relay stopped by a cancellation token, by a future, within a
//! deadline (what it abandons is claimed again later and acts once), its
//! status while it runs and once it ended; a relay refusing a database
//! without idem's tables or with an older schema; failing claims logged
//! once per change of state and backed off; the archiver and a Redis
//! Streams consumer stopped by a token. Each test asserts in the database.
//! One test binary, a module per concern.

#[macro_use]
#[path = "../common"]
mod common {
    pub(crate) mod coupons;
    // Only `shared`: no test of this binary turns a switch on.
    #[allow(dead_code)]
    pub(crate) mod hooks;
    // The fixtures name more than these tests use.
    #[allow(unused_imports)]
    #[macro_use]
    pub(crate) mod relay;
    pub(crate) mod redis_streams;
}

mod archiver;
mod capture;
mod claims;
mod consumer;
mod refuse;
mod scratch;
mod stop;

//! HTTP (`idem-runtime/src/http/`) against the real servers: the
//! idempotency layer and extractor, signed callbacks (and the platforms'
//! presets, signed by the platforms' own SDKs), `sqlx::Any` behind them,
//! and the header parsers over drawn input. One test binary, a module per
//! file.

#[path = "../common"]
mod common {
    pub(crate) mod http;
}

mod any;
mod callbacks;
mod idempotency;
mod parsers;
mod platforms;

//! One file per command; all database work goes through idem-runtime.

pub(crate) mod actions;
pub(crate) mod archive;
pub(crate) mod migrate;
pub(crate) mod outbox;
pub(crate) mod record;
pub(crate) mod request;
pub(crate) mod serve;

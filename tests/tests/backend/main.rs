//! The backends (`idem-runtime/src/backend/`) against the real servers: how
//! their errors are classified (also those of a failover), commits through
//! the fault proxy, the record store's ttl bounds, and `migrate` upgrading
//! the previous release's tables (`schema.rs`). One test binary, a module
//! per file.

mod classification;
mod failover_errors;
mod proxy;
mod ttl;
mod upgrade;

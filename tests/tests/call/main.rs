//! A call (`idem-runtime/src/call/`) against the real servers: cancelled
//! mid-flight, composed with others in one transaction, its fencing of
//! versions under concurrent callers, its tracing span. One test binary, a
//! module per file.

#[path = "../common"]
mod common {
    pub(crate) mod coupons;
}

mod cancellation;
mod composition;
mod fault_version;
mod tracing_span;

//! idem's metrics through the `metrics` facade (`idem_runtime::metrics`),
//! against the real servers: the relay's histograms and counters checked
//! against the database on every backend, the topic label's limit, every
//! reported name described, and the database gauges exported once per
//! database by several consoles. One recorder for the binary
//! (`recorder.rs`); tests keep apart by their topics, and those that read
//! label-less counters or change the label limit hold
//! [`common::hooks::exclusive`].

#[macro_use]
#[path = "../common"]
mod common {
    pub(crate) mod coupons;
    pub(crate) mod hooks;
    #[macro_use]
    pub(crate) mod relay;
}

mod describe;
mod gauges;
mod recorder;
mod relay;

//! The RocketMQ client's runtime: `rocketmq-client-rust` runs its clients
//! on a [`ClientRuntime`] whose tasks live on a tokio runtime of its own
//! (it never borrows the caller's). One is made for the process on first
//! use, unless the application passes its own.

use idem_core::Error;
use rocketmq_client_rust::{ClientRuntime, ClientRuntimeConfig};
use rocketmq_observability::TelemetryHandle;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};
use std::sync::{Arc, OnceLock};

/// The process's runtime: kept for the life of the process (a tokio
/// runtime cannot be dropped from within another's task).
static SHARED: OnceLock<Result<(RuntimeOwner, Arc<ClientRuntime>), String>> = OnceLock::new();

/// The client runtime [`Consumer`](crate::Consumer) and
/// [`Publisher`](crate::Publisher) use unless given one: made on first
/// use, with two worker threads of its own and no telemetry, and kept
/// until the process exits.
pub fn shared() -> Result<Arc<ClientRuntime>, Error> {
    let made = SHARED.get_or_init(|| {
        let config = RuntimeConfig {
            worker_threads: 2,
            thread_name: "idem-rocketmq".to_owned(),
            ..RuntimeConfig::default()
        };
        let owner = RuntimeOwner::plan(config)
            .map_err(|e| e.to_string())?
            .build()
            .map_err(|e| e.to_string())?;
        let runtime = ClientRuntime::try_new(
            owner.root_context().component("idem-rocketmq"),
            ClientRuntimeConfig::default(),
            TelemetryHandle::noop(),
        )
        .map_err(|e| e.to_string())?;
        Ok((owner, runtime))
    });
    match made {
        Ok((_, runtime)) => Ok(runtime.clone()),
        Err(reason) => Err(Error::Config {
            reason: format!("could not start the RocketMQ client runtime: {reason}"),
        }),
    }
}

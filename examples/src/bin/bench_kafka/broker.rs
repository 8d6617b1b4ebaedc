//! The run's own Kafka-protocol broker: idem-testkit's nisshi
//! ([`KafkaBroker`]) on a free port of 127.0.0.1, in a temporary
//! directory, killed and the directory removed when dropped (also when
//! the benchmark fails).

use crate::BoxError;
use idem_testkit::cluster::kafka::KafkaBroker;

/// A running nisshi of the run's own.
#[derive(Debug)]
pub(crate) struct Broker(KafkaBroker);

impl Broker {
    /// Starts one; an error when nisshi is not installed (`.ci/run`
    /// installs it in /opt/idem-brokers/nisshi; `IDEM_NISSHI` names
    /// another).
    pub(crate) async fn start() -> Result<Broker, BoxError> {
        let started = tokio::task::spawn_blocking(KafkaBroker::start).await?;
        started
            .map(Broker)
            .ok_or_else(|| "nisshi is not installed: run .ci/run once, or set IDEM_NISSHI".into())
    }

    /// The bootstrap servers, `127.0.0.1:<port>`.
    pub(crate) fn bootstrap(&self) -> String {
        self.0.bootstrap()
    }

    /// Its process id, for its CPU time.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.0.pid()
    }
}

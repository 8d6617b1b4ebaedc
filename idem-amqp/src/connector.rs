//! The broker connection a [`Publisher`](super::Publisher) and a
//! [`Consumer`](super::Consumer) use, dialled again after it died.

use super::Topology;
use super::error::from_lapin;
use idem_core::Error;
use idem_core::backoff::Backoff;
use lapin::{Connection, ConnectionProperties};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// Where a [`Publisher`](super::Publisher) or a [`Consumer`](super::Consumer)
/// gets its connection: one that [reconnects](Connector::new) after the
/// broker restarts, or a fixed one (`From<Arc<Connection>>`), which does
/// not.
///
/// A reconnecting connector dials `uri` when first asked, and again when
/// its connection has died (the broker restarted, the network failed,
/// heartbeats were missed), at most once per back-off delay: after `n`
/// failed dials in a row the next waits `base · 2^(n-1)` capped at `max`,
/// jittered between half and all of it (default 100 ms to 5 s). Each
/// successful dial redeclares the [topologies](Connector::topology) given.
/// While the broker is down, a publish fails at once with
/// [`Error::broker_unavailable`] (an outage: the outbox relay does not
/// count the attempt) and a consumer waits for the next dial; neither
/// spins. [`reconnects`](Connector::reconnects) counts the dials that
/// replaced a dead connection; each is logged at `warn`.
///
/// ```no_run
/// use idem_runtime::amqp::{Connector, Publisher, Topology};
/// # async fn f() -> Result<(), idem_runtime::Error> {
/// let broker = Connector::new("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .topology(Topology::new("coupon.deduct").bind("orders", "coupon.deduct"));
/// broker.connection().await?; // dial now (and declare) rather than at first use
/// let publisher = Publisher::new(broker.clone(), "orders");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Connector {
    inner: Arc<Inner>,
}

struct Inner {
    uri: Option<String>,
    backoff: Backoff,
    topologies: Vec<Topology>,
    state: Mutex<Dial>,
    reconnects: AtomicU64,
}

#[derive(Default)]
struct Dial {
    connection: Option<Arc<Connection>>,
    failures: u32,
    next_try: Option<Instant>,
    dialled: bool,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("reconnecting", &self.inner.uri.is_some())
            .field("backoff", &self.inner.backoff)
            .field("reconnects", &self.reconnects())
            .finish_non_exhaustive()
    }
}

impl From<Arc<Connection>> for Connector {
    /// A fixed connection: never dialled again (a publisher on it fails
    /// every publish once it died, a consumer stops).
    fn from(connection: Arc<Connection>) -> Self {
        Connector::with(None, Some(connection))
    }
}

impl Connector {
    /// A connector that dials `uri` (`amqp://user:pass@host:5672/%2f`)
    /// and dials it again whenever its connection died.
    pub fn new(uri: impl Into<String>) -> Self {
        Connector::with(Some(uri.into()), None)
    }

    fn with(uri: Option<String>, connection: Option<Arc<Connection>>) -> Self {
        Connector {
            inner: Arc::new(Inner {
                uri,
                backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(5)),
                topologies: Vec::new(),
                state: Mutex::new(Dial {
                    dialled: connection.is_some(),
                    connection,
                    ..Dial::default()
                }),
                reconnects: AtomicU64::new(0),
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Inner)) -> Self {
        let inner = Arc::get_mut(&mut self.inner)
            .expect("configure a Connector before cloning or using it");
        f(inner);
        self
    }

    /// The wait between failed dials: from `base`, doubling up to `max`,
    /// jittered (default 100 ms to 5 s).
    ///
    /// # Panics
    /// On a connector already cloned or used.
    pub fn backoff(self, base: Duration, max: Duration) -> Self {
        self.edit(|i| i.backoff = Backoff::new(base, max))
    }

    /// A topology to declare on every connection dialled (queues and
    /// exchanges a restarted broker without persistence lost).
    ///
    /// # Panics
    /// On a connector already cloned or used.
    pub fn topology(self, topology: Topology) -> Self {
        self.edit(|i| i.topologies.push(topology))
    }

    /// Whether this connector dials again after its connection died.
    pub fn reconnects_on_failure(&self) -> bool {
        self.inner.uri.is_some()
    }

    /// The dials that replaced a dead connection, since it was made.
    pub fn reconnects(&self) -> u64 {
        self.inner.reconnects.load(Ordering::Relaxed)
    }

    /// The live connection: the current one, or a new one dialled now if
    /// it died and the back-off allows. An [`Error::broker_unavailable`]
    /// while the broker cannot be reached (or a fixed connection died).
    pub async fn connection(&self) -> Result<Arc<Connection>, Error> {
        self.try_connection().await.map_err(|(e, _)| e)
    }

    /// [`connection`](Self::connection), and on failure when to try again.
    pub(crate) async fn try_connection(&self) -> Result<Arc<Connection>, (Error, Instant)> {
        let i = &*self.inner;
        let mut dial = i.state.lock().await;
        if let Some(c) = &dial.connection
            && c.status().connected()
        {
            return Ok(c.clone());
        }
        let now = Instant::now();
        let Some(uri) = &i.uri else {
            let e = Error::broker_unavailable(
                "amqp",
                "the connection closed (a fixed connection: no URI to dial again)",
            );
            return Err((e, now + i.backoff.max));
        };
        if let Some(at) = dial.next_try
            && now < at
        {
            let e = Error::broker_unavailable(
                "amqp",
                "the broker is unreachable; waiting to dial again",
            );
            return Err((e, at));
        }
        match self.dial(uri).await {
            Ok(c) => {
                if dial.dialled {
                    i.reconnects.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        failed_dials = dial.failures,
                        "AMQP connection re-established; topology redeclared"
                    );
                }
                *dial = Dial {
                    connection: Some(c.clone()),
                    dialled: true,
                    ..Dial::default()
                };
                Ok(c)
            }
            Err(e) => {
                dial.failures = dial.failures.saturating_add(1);
                let at = Instant::now() + i.backoff.jittered(dial.failures, 0);
                dial.next_try = Some(at);
                tracing::debug!(failures = dial.failures, error = %format_args!("{e:#}"), "AMQP dial failed");
                Err((e, at))
            }
        }
    }

    async fn dial(&self, uri: &str) -> Result<Arc<Connection>, Error> {
        let c = Connection::connect(uri, ConnectionProperties::default())
            .await
            .map_err(|e| from_lapin("connect", e))?;
        for t in &self.inner.topologies {
            t.declare(&c).await?;
        }
        Ok(Arc::new(c))
    }

    /// Waits for a live connection (each failed dial followed by its
    /// back-off), or `None` when `stop` fires first, or at once for a
    /// fixed connection that died.
    pub(crate) async fn wait(
        &self,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Option<Arc<Connection>> {
        loop {
            match self.try_connection().await {
                Ok(c) => return Some(c),
                Err(_) if !self.reconnects_on_failure() => return None,
                Err((_, at)) => tokio::select! {
                    _ = stop.changed() => return None,
                    _ = tokio::time::sleep_until(at) => {}
                },
            }
        }
    }
}

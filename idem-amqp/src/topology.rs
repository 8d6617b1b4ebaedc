//! The queues and exchanges a consumed queue needs, declared idempotently.

use super::error::from_lapin;
use super::fields::{long, short};
use idem_core::Error;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};

/// The queues and exchanges of one consumed queue: the queue itself (its
/// rejected messages dead-letter to `dead_letter_exchange`), a retry queue
/// whose expired messages dead-letter back to the queue, and a
/// dead-letter exchange with its dead-letter queue. All durable.
///
/// Declaring is idempotent: the same declaration twice is a no-op, from
/// any number of processes. A queue that already exists with *other*
/// arguments (for example declared earlier without a dead-letter exchange)
/// makes the broker answer `PRECONDITION_FAILED`, a permanent [`Error`]:
/// delete it, or set the dead-letter exchange through a policy.
///
/// ```no_run
/// # async fn f() -> Result<(), idem_runtime::Error> {
/// use idem_runtime::amqp::{self, Topology};
/// let conn = amqp::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
/// let t = Topology::new("coupon.deduct").bind("orders", "coupon.deduct");
/// assert_eq!(t.retry_queue, "coupon.deduct.retry");
/// assert_eq!(t.dead_letter_queue, "coupon.deduct.dlq");
/// t.declare(&conn).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// The consumed queue.
    pub queue: String,
    /// Where failed attempts wait for their back-off (`{queue}.retry`).
    pub retry_queue: String,
    /// The queue's dead-letter exchange (`{queue}.dlx`, direct).
    pub dead_letter_exchange: String,
    /// The queue that keeps dead letters (`{queue}.dlq`), bound to the
    /// dead-letter exchange with its own name as routing key.
    pub dead_letter_queue: String,
    /// `(exchange, routing key)` bindings of the queue; each exchange is
    /// declared durable, of type `topic`.
    pub bindings: Vec<(String, String)>,
}

impl Topology {
    /// The topology of `queue`, with the default names.
    pub fn new(queue: impl Into<String>) -> Self {
        let queue = queue.into();
        Topology {
            retry_queue: format!("{queue}.retry"),
            dead_letter_exchange: format!("{queue}.dlx"),
            dead_letter_queue: format!("{queue}.dlq"),
            queue,
            bindings: Vec::new(),
        }
    }

    /// Binds the queue to `exchange` (declared durable, type `topic`) with
    /// `routing_key`.
    pub fn bind(mut self, exchange: impl Into<String>, routing_key: impl Into<String>) -> Self {
        self.bindings.push((exchange.into(), routing_key.into()));
        self
    }

    /// Declares everything on a channel of its own, then closes it.
    pub async fn declare(&self, connection: &Connection) -> Result<(), Error> {
        let ch = connection
            .create_channel()
            .await
            .map_err(|e| from_lapin("channel.open", e))?;
        let result = self.declare_on(&ch).await;
        if ch.status().connected() {
            let _ = ch.close(200, "OK".into()).await;
        }
        result
    }

    async fn declare_on(&self, ch: &Channel) -> Result<(), Error> {
        let durable_exchange = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        let queue = short("queue", &self.queue)?;
        let retry = short("queue", &self.retry_queue)?;
        let dlx = short("exchange", &self.dead_letter_exchange)?;
        let dlq = short("queue", &self.dead_letter_queue)?;

        ch.exchange_declare(
            dlx.clone(),
            lapin::ExchangeKind::Direct,
            durable_exchange,
            FieldTable::default(),
        )
        .await
        .map_err(|e| from_lapin("exchange.declare (dead-letter exchange)", e))?;
        ch.queue_declare(
            dlq.clone(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| from_lapin("queue.declare (dead-letter queue)", e))?;
        ch.queue_bind(
            dlq.clone(),
            dlx.clone(),
            dlq.clone(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| from_lapin("queue.bind (dead-letter queue)", e))?;

        let mut args = FieldTable::default();
        args.insert(
            "x-dead-letter-exchange".into(),
            long(&self.dead_letter_exchange),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            long(&self.dead_letter_queue),
        );
        ch.queue_declare(queue.clone(), QueueDeclareOptions::durable(), args)
            .await
            .map_err(|e| from_lapin("queue.declare", e))?;

        // Expired retries go back through the default exchange, which
        // routes by queue name.
        let mut args = FieldTable::default();
        args.insert("x-dead-letter-exchange".into(), long(""));
        args.insert("x-dead-letter-routing-key".into(), long(&self.queue));
        ch.queue_declare(retry, QueueDeclareOptions::durable(), args)
            .await
            .map_err(|e| from_lapin("queue.declare (retry queue)", e))?;

        for (exchange, routing_key) in &self.bindings {
            let ex = short("exchange", exchange)?;
            ch.exchange_declare(
                ex.clone(),
                lapin::ExchangeKind::Topic,
                durable_exchange,
                FieldTable::default(),
            )
            .await
            .map_err(|e| from_lapin("exchange.declare", e))?;
            ch.queue_bind(
                queue.clone(),
                ex,
                short("routing key", routing_key)?,
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| from_lapin("queue.bind", e))?;
        }
        Ok(())
    }
}

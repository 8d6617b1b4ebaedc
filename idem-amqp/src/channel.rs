//! A publishing channel in confirm mode, reopened after a failure: what
//! the [`Publisher`](super::Publisher) and the consumer's retries publish on.

use super::Connector;
use super::error::from_lapin;
use super::fields::short;
use idem_core::Error;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation};
use std::time::Duration;
use tokio::sync::Mutex;

/// How long a publish may take, the channel's opening and the broker's
/// confirm included, by default (see `Publisher::confirm_timeout`).
pub(super) const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// A publishing channel in confirm mode, opened lazily and reopened when it
/// was closed (a channel-level error such as publishing to a missing
/// exchange closes it).
pub(super) struct ConfirmChannel {
    connector: Connector,
    channel: Mutex<Option<Channel>>,
}

impl ConfirmChannel {
    pub(super) fn new(connector: Connector) -> Self {
        ConfirmChannel {
            connector,
            channel: Mutex::new(None),
        }
    }

    async fn get(&self) -> Result<Channel, Error> {
        let mut slot = self.channel.lock().await;
        if let Some(ch) = slot.as_ref()
            && ch.status().connected()
        {
            return Ok(ch.clone());
        }
        // The connector's live connection: dialled again after it died.
        let ch = self
            .connector
            .connection()
            .await?
            .create_channel()
            .await
            .map_err(|e| from_lapin("channel.open", e))?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| from_lapin("confirm.select", e))?;
        *slot = Some(ch.clone());
        Ok(ch)
    }

    /// Publishes and waits for the broker's confirm, at most `within` (the
    /// channel's opening included). `Ok` only when the broker acknowledged
    /// the message and (with `mandatory`) routed it to at least one queue.
    ///
    /// A confirm that never comes (a broker killed, or a network that lost
    /// the connection without closing it, before the heartbeats tell) ends
    /// in an [outage](Error::is_outage) after `within` (not an attempt
    /// the relay counts), and the channel is opened again at the next
    /// publish: the message is published again, which
    /// the consumer's `#[idempotent]` handler answers once.
    pub(super) async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        mandatory: bool,
        body: &[u8],
        properties: BasicProperties,
        within: Duration,
    ) -> Result<(), Error> {
        let sent = self.publish_confirmed(exchange, routing_key, mandatory, body, properties);
        match tokio::time::timeout(within, sent).await {
            Ok(done) => done,
            Err(_) => {
                // Cut short, the publish let go of the channel's lock.
                *self.channel.lock().await = None;
                Err(Error::broker_unavailable(
                    "amqp",
                    format!(
                        "no publisher confirm from the broker within {within:?} on exchange \
                         `{exchange}` (the connection may be lost without being closed): \
                         published again on a new channel"
                    ),
                ))
            }
        }
    }

    async fn publish_confirmed(
        &self,
        exchange: &str,
        routing_key: &str,
        mandatory: bool,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), Error> {
        let ex = short("exchange", exchange)?;
        let rk = short("routing key", routing_key)?;
        let ch = self.get().await?;
        let confirm = ch
            .basic_publish(
                ex,
                rk,
                BasicPublishOptions {
                    mandatory,
                    immediate: false,
                },
                body,
                properties,
            )
            .await
            .map_err(|e| from_lapin("basic.publish", e))?
            .await
            .map_err(|e| from_lapin("publisher confirm", e))?;
        match confirm {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => Err(Error::broker(
                "amqp",
                format!(
                    "unroutable: exchange `{exchange}` has no queue bound for routing key `{routing_key}` ({} {})",
                    returned.reply_code, returned.reply_text
                ),
                true,
            )),
            Confirmation::Nack(_) => Err(Error::broker(
                "amqp",
                format!("the broker refused the message (publisher nack) on exchange `{exchange}`"),
                true,
            )),
            Confirmation::NotRequested => Err(Error::broker(
                "amqp",
                "publisher confirms are not enabled on the channel",
                true,
            )),
        }
    }

    pub(super) async fn close(&self) {
        if let Some(ch) = self.channel.lock().await.take()
            && ch.status().connected()
        {
            let _ = ch.close(200, "OK".into()).await;
        }
    }
}

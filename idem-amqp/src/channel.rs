//! A publishing channel in confirm mode, reopened after a failure: what
//! the [`Publisher`](super::Publisher) and the consumer's retries publish on.

use super::Connector;
use super::error::from_lapin;
use super::fields::short;
use idem_core::Error;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation};
use tokio::sync::Mutex;

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

    /// Publishes and waits for the broker's confirm. `Ok` only when the
    /// broker acknowledged the message and (with `mandatory`) routed it to
    /// at least one queue.
    pub(super) async fn publish(
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

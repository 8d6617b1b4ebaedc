//! A topic with its retry and dead-letter topics, created on the broker.

use super::error::{self, from_kafka};
use idem_core::Error;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;

/// A topic and the two the [`Consumer`](crate::Consumer) uses beside it by
/// default: `{topic}.retry` (failed records waiting for their next
/// attempt) and `{topic}.dlt` (dead letters), each with the same number
/// of partitions.
///
/// ```no_run
/// # async fn f() -> Result<(), idem_runtime::Error> {
/// use idem_runtime::kafka::Topology;
/// let t = Topology::new("orders").partitions(6).replication(3);
/// t.declare("127.0.0.1:9092").await?;
/// assert_eq!(t.retry_topic, "orders.retry");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Topology {
    /// The topic.
    pub topic: String,
    /// Its retry topic.
    pub retry_topic: String,
    /// Its dead-letter topic.
    pub dead_letter_topic: String,
    /// Partitions of each (default 1).
    pub partitions: i32,
    /// Replicas of each partition (default 1).
    pub replication: i32,
}

impl Topology {
    /// `topic`, `{topic}.retry` and `{topic}.dlt`.
    pub fn new(topic: impl Into<String>) -> Self {
        let topic = topic.into();
        Topology {
            retry_topic: format!("{topic}.retry"),
            dead_letter_topic: format!("{topic}.dlt"),
            topic,
            partitions: 1,
            replication: 1,
        }
    }

    /// Partitions of each topic.
    pub fn partitions(mut self, n: i32) -> Self {
        self.partitions = n.max(1);
        self
    }

    /// Replicas of each partition.
    pub fn replication(mut self, n: i32) -> Self {
        self.replication = n.max(1);
        self
    }

    /// Creates the three topics on `brokers`; a topic that exists already
    /// is left as it is.
    pub async fn declare(&self, brokers: &str) -> Result<(), Error> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()
            .map_err(error::config)?;
        let names = [&self.topic, &self.retry_topic, &self.dead_letter_topic];
        let topics: Vec<NewTopic<'_>> = names
            .iter()
            .map(|t| {
                NewTopic::new(
                    t,
                    self.partitions,
                    TopicReplication::Fixed(self.replication),
                )
            })
            .collect();
        let created = admin
            .create_topics(&topics, &AdminOptions::new())
            .await
            .map_err(|e| from_kafka("create topics", e))?;
        for result in created {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => {
                    return Err(error::create_topic(&topic, code));
                }
            }
        }
        Ok(())
    }
}

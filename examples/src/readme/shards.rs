//! README, "Deployments": several databases, each customer's data, records
//! and messages in the customer's own.

use idem_runtime::outbox::{Delivery, Relay, RelayHandle, enqueue};
use idem_runtime::shard::Shards;
use idem_runtime::idempotent;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool, Postgres};

/// Points awarded for an order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Award {
    /// The order.
    pub order_id: i64,
    /// The customer: the shard key.
    pub customer: i64,
    /// How many points.
    pub points: i64,
}

/// The handler, keyed by the delivery (the relay's calls).
#[idempotent(key = "readme-award:{d.topic}:{d.msg_id}", strategy = record, biz_type = "readme_award")]
pub async fn award(tx: &mut PgConnection, d: &Delivery<Postgres>, a: &Award) -> Result<(), sqlx::Error> {
    let _ = d;
    sqlx::query("UPDATE readme_account SET points = points + $1 WHERE customer = $2")
        .bind(a.points).bind(a.customer).execute(&mut *tx).await?;
    Ok(())
}

/// The shard databases' own table (idem's come from `Shards::migrate`).
pub async fn create_tables(shards: &Shards<Postgres>) -> Result<(), idem_runtime::Error> {
    for pool in shards.pools() {
        sqlx::query("CREATE TABLE IF NOT EXISTS readme_account (customer BIGINT PRIMARY KEY, points BIGINT NOT NULL)")
            .execute(pool).await?;
    }
    Ok(())
}

/// Three pools, one per database (`orders_0` … on one server here).
pub async fn open(pools: Vec<PgPool>) -> Result<Shards<Postgres>, idem_runtime::Error> {
    // README: shards
    use idem_runtime::shard::Shards;

    let shards = Shards::new(pools)?;   // in shard order; the default shard function hashes the key
    shards.migrate().await?;            // idem's tables in every database
    // README: end
    create_tables(&shards).await?;
    Ok(shards)
}

/// Opens the customer's account and enqueues the points of `a`, in the
/// customer's shard; `relays` then delivers them.
pub async fn order_paid(shards: &Shards<Postgres>, a: &Award) -> Result<(), idem_runtime::Error> {
    // README: shards-produce
    // The business write and its message commit together, in the customer's database.
    let mut tx = shards.begin(&a.customer).await?;
    sqlx::query("INSERT INTO readme_account (customer, points) VALUES ($1, 0) ON CONFLICT DO NOTHING")
        .bind(a.customer).execute(tx.conn()?).await?;
    enqueue(&mut tx, "readme.award", &format!("order-{}", a.order_id), &serde_json::json!({ "order_id": a.order_id, "customer": a.customer, "points": a.points })).await?;
    tx.commit().await?;
    // README: end
    Ok(())
}

/// The relays of every shard.
pub fn relays(shards: &Shards<Postgres>) -> Vec<RelayHandle> {
    // README: shards-relay
    // One relay per database: each delivers its own messages into calls on its own
    // database, so the record lands beside the account it guards.
    shards
        .relays(|_, pool| Relay::new(pool).route("readme.award", |d, a: Award| async move { award(d.source(), &d, &a).await }))
        .into_iter().map(Relay::spawn).collect()
    // README: end
}

//! The test kit of idem: what the integration tests, the CLI's tests and the
//! examples share.
//!
//! - [Servers](servers): pools on the real PostgreSQL, MariaDB and SQLite
//!   of this machine ([`postgres`], [`mysql`], [`sqlite`], [`any`]), with
//!   idem's tables migrated, and the **skip rule**: a server that is down
//!   skips the test locally ([`unreachable()`] prints `SKIPPED: …` and the
//!   helper returns `None`) but fails it when `CI=true`. The SQLite files
//!   are removed when the test ends ([`scratch_file`]).
//! - [Names and ids](names): [`unique`] table names and [`ids`] ranges that
//!   never collide with another test or an earlier run on a shared server.
//! - [`for_each_backend!`]: a test file's suite, written once as a
//!   `macro_rules!` macro, run on PostgreSQL, MariaDB and SQLite (and
//!   through `sqlx::Any`), one module per backend.
//! - [`concurrently`]: a burst of calls released together by one barrier,
//!   the way redeliveries arrive.
//! - [`sql`]: a statement written once with `?` placeholders, renumbered to
//!   `$1, $2, …` for PostgreSQL.
//! - [`proxy::FaultProxy`]: a TCP proxy that loses `COMMIT`
//!   acknowledgements (and can hold `BEGIN` replies) on the way back from
//!   PostgreSQL or MariaDB.
//! - With the `redis` feature: [`redis_url`], [`redis_up`], [`redis_get`].
//! - [`cluster`]: servers a test starts for itself (clusters, poolers,
//!   proxies) on their own ports and directories, torn down on drop.
//! - With the `browser` feature: [`browser::Browser`], a headless
//!   Chromium on a `chromedriver` of its own (WebDriver, through the
//!   re-exported `fantoccini`), for tests of web pages.
//! - With the `kafka` feature: [`cluster::kafka::KafkaBroker`], a
//!   Kafka-protocol broker (nisshi) of the test's own, with the
//!   re-exported `rdkafka` client.
//! - With the `rocketmq` feature: [`cluster::rocketmq::RocketMq`], a
//!   RocketMQ name server, broker master and slave (rocketmq-rust) of the
//!   test's own, with the re-exported `rocketmq-client-rust` client.
//! - [`env_setting`]: an environment variable, where set-but-empty
//!   (`DATABASE_URL=`) means unset.
//!
//! The servers are found through `IDEM_TEST_POSTGRES_URL`,
//! `IDEM_TEST_MYSQL_URL` and `IDEM_TEST_REDIS_URL`, defaulting to the local
//! servers.
//!
//! ```no_run
//! # async fn run() {
//! let Some(pool) = idem_testkit::postgres(4).await else {
//!     return; // skipped: PostgreSQL is down (a failure when CI=true)
//! };
//! let table = idem_testkit::unique("coupon");
//! let id = idem_testkit::ids(1);
//! let stmt = idem_testkit::sql(
//!     idem_runtime::Dialect::Postgres,
//!     "SELECT 1 WHERE ? = ?",
//! );
//! assert_eq!(stmt.0, "SELECT 1 WHERE $1 = $2");
//! # let _ = (pool, table, id);
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "browser")]
pub mod browser;
mod burst;
pub mod cluster;
mod env;
mod matrix;
pub mod names;
#[cfg(feature = "redis")]
mod redis_server;
pub mod servers;
mod sql;
mod wait;

pub use burst::concurrently;
pub use env::env_setting;
/// The fault-injection proxy, published in `idem-test` (`idem_test::proxy`)
/// and re-exported here under its old path.
pub use idem_test::proxy;
pub use names::{id_base, ids, unique};
#[cfg(feature = "redis")]
pub use redis_server::{redis_get, redis_up, redis_url};
pub use servers::{
    any, database_url, mysql, mysql_database, mysql_url, postgres, postgres_database, postgres_url,
    scratch_file, sqlite, sqlite_url, unreachable,
};
pub use sql::sql;
pub use wait::{published, wait_for};

/// What [`for_each_backend!`] names in its expansion, so that a test
/// crate needs no dependency for it.
#[doc(hidden)]
pub mod __private {
    pub use idem_runtime::Dialect;
    pub use sqlx;
}

//! What a failover looks like to a call, against the real servers, and how
//! idem classifies it:
//!
//! - a server that refuses writes (a standby, or a primary demoted by a
//!   failover): PostgreSQL `25006`, MariaDB `1792`, retryable, nothing
//!   written;
//! - a session terminated while its `COMMIT` runs (an administrator, a
//!   server shutting down for a failover): PostgreSQL `57P01` at COMMIT is
//!   `CommitUnknown`, since the commit may or may not have happened.
//!
//! The read-only servers are sessions set read-only (`default_transaction_
//! read_only`, `SET SESSION TRANSACTION READ ONLY`), which answer exactly as
//! a standby does; the server configuration is never changed.

use idem_runtime::{Error, idempotent};
use idem_testkit::{ids, unique};
use serde::Serialize;
use std::str::FromStr;
use std::time::Duration;

#[derive(Debug, Clone, Serialize)]
struct Ship {
    parcel: i64,
}

mod postgres {
    use super::*;
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use sqlx::{Executor, PgConnection, PgPool};

    #[idempotent(key = "fo-ship:{s.parcel}", strategy = record, biz_type = "fo_ship")]
    async fn ship(tx: &mut PgConnection, s: &Ship) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO idem_t_fo_parcel (parcel) VALUES ($1)")
            .bind(s.parcel)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    async fn setup() -> Option<PgPool> {
        let pool = idem_testkit::postgres(4).await?;
        let mut tx = pool.begin().await.expect("begin");
        tx.execute("SELECT pg_advisory_xact_lock(77021)")
            .await
            .expect("lock");
        // Every insert waits 3 s at COMMIT, in a deferred constraint trigger:
        // time to terminate the session while its COMMIT runs.
        for ddl in [
            "CREATE TABLE IF NOT EXISTS idem_t_fo_parcel (parcel BIGINT NOT NULL)",
            "CREATE OR REPLACE FUNCTION idem_t_fo_slow_commit() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN IF NEW.parcel < 0 THEN PERFORM pg_sleep(3); END IF; RETURN NULL; END $$",
            "DROP TRIGGER IF EXISTS idem_t_fo_slow ON idem_t_fo_parcel",
            "CREATE CONSTRAINT TRIGGER idem_t_fo_slow AFTER INSERT ON idem_t_fo_parcel \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION idem_t_fo_slow_commit()",
        ] {
            tx.execute(ddl).await.expect("ddl");
        }
        tx.commit().await.expect("commit ddl");
        Some(pool)
    }

    async fn parcels(pool: &PgPool, parcel: i64) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM idem_t_fo_parcel WHERE parcel = $1")
            .bind(parcel)
            .fetch_one(pool)
            .await
            .expect("count")
    }

    #[tokio::test]
    async fn a_read_only_server_is_retryable_and_nothing_is_written() {
        let Some(pool) = setup().await else { return };
        let standby = PgPoolOptions::new()
            .max_connections(1)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute("SET default_transaction_read_only = on")
                        .await?;
                    Ok(())
                })
            })
            .connect_with((*pool.connect_options()).clone())
            .await
            .expect("read-only pool");
        let s = Ship { parcel: ids(1) };
        let err = ship(&standby, &s)
            .await
            .expect_err("a read-only server refuses the write");
        let code = match &err {
            Error::Database(sqlx::Error::Database(db)) => db.code().map(|c| c.into_owned()),
            _ => None,
        };
        assert_eq!(code.as_deref(), Some("25006"), "{err:?}");
        assert!(
            err.is_retryable(),
            "a failover's standby: retry on the promoted primary"
        );
        standby.close().await;
        assert_eq!(parcels(&pool, s.parcel).await, 0);
        // The retry, on a writable server, executes.
        assert!(ship(&pool, &s).await.expect("retry").is_executed());
        assert_eq!(parcels(&pool, s.parcel).await, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_terminated_during_commit_is_commit_unknown() {
        let Some(pool) = setup().await else { return };
        let app = unique("idem_fo");
        let opts = PgConnectOptions::from_str(&idem_testkit::postgres_url())
            .expect("url")
            .application_name(&app);
        let victim = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(opts)
            .await
            .expect("pool");
        // A negative parcel makes the COMMIT wait in the deferred trigger.
        let s = Ship { parcel: -ids(1) };
        let call = tokio::spawn({
            let (victim, s) = (victim.clone(), s.clone());
            async move { ship(&victim, &s).await }
        });
        // Wait until the session runs its COMMIT, then terminate it.
        let mut terminated = false;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM (SELECT pg_catalog.pg_terminate_backend(pid) \
                 FROM pg_catalog.pg_stat_activity \
                 WHERE application_name = $1 AND query = 'COMMIT' AND state = 'active') t",
            )
            .bind(&app)
            .fetch_one(&pool)
            .await
            .expect("terminate");
            if n > 0 {
                terminated = true;
                break;
            }
        }
        assert!(terminated, "the call never reached its COMMIT");
        let err = call
            .await
            .expect("join")
            .expect_err("the session was terminated");
        assert!(matches!(err, Error::CommitUnknown(_)), "{err:?}");
        assert!(err.is_retryable());
        victim.close().await;
        // Terminated inside the trigger: here the commit did not happen, and
        // the retry (the relay's, the broker's) executes.
        assert_eq!(parcels(&pool, s.parcel).await, 0);
    }
}

mod mariadb {
    use super::*;
    use sqlx::mysql::MySqlPoolOptions;
    use sqlx::{Executor, MySqlConnection, MySqlPool};

    #[idempotent(key = "fo-ship:{s.parcel}", strategy = record, biz_type = "fo_ship")]
    async fn ship(tx: &mut MySqlConnection, s: &Ship) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO idem_t_fo_parcel (parcel) VALUES (?)")
            .bind(s.parcel)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    #[tokio::test]
    async fn a_read_only_server_is_retryable_and_nothing_is_written() {
        let Some(pool) = idem_testkit::mysql(4).await else {
            return;
        };
        sqlx::query("CREATE TABLE IF NOT EXISTS idem_t_fo_parcel (parcel BIGINT NOT NULL)")
            .execute(&pool)
            .await
            .expect("create table");
        let replica: MySqlPool = MySqlPoolOptions::new()
            .max_connections(1)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute("SET SESSION TRANSACTION READ ONLY").await?;
                    Ok(())
                })
            })
            .connect_with((*pool.connect_options()).clone())
            .await
            .expect("read-only pool");
        let s = Ship { parcel: ids(1) };
        let err = ship(&replica, &s)
            .await
            .expect_err("a read-only server refuses the write");
        let code = match &err {
            Error::Database(sqlx::Error::Database(db)) => db.code().map(|c| c.into_owned()),
            _ => None,
        };
        assert!(
            err.is_retryable(),
            "a replica: retry on the primary ({code:?}: {err})"
        );
        replica.close().await;
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_t_fo_parcel WHERE parcel = ?")
            .bind(s.parcel)
            .fetch_one(&pool)
            .await
            .expect("count");
        assert_eq!(n, 0);
        assert!(ship(&pool, &s).await.expect("retry").is_executed());
    }
}

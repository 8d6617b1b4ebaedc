//! `sqlx::Any`: one handler for every database, the dialect chosen by the
//! URL the pool was opened with. No statements of its own: it runs the
//! chosen database's.

use super::{Backend, Dialect, NewRecord, sealed};
use sqlx::{Any, Pool, Transaction};

impl sealed::Sealed for Any {
    fn dialect_of_tx(tx: &Transaction<'_, Self>) -> Dialect {
        dialect_of(tx.backend_name())
    }

    fn dialect_of_pool(pool: &Pool<Self>) -> Dialect {
        dialect_of(pool.connect_options().database_url.scheme())
    }

    fn dialect_of_conn(conn: &Self::Connection) -> Dialect {
        dialect_of(conn.backend_name())
    }

    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }

    fn last_insert_id(done: &Self::QueryResult) -> Result<i64, sqlx::Error> {
        done.last_insert_id()
            .ok_or_else(|| sqlx::Error::Protocol("no insert id returned".into()))
    }
}

/// The dialect of a driver's name or a URL's scheme.
fn dialect_of(name: &str) -> Dialect {
    match name {
        "PostgreSQL" | "postgres" | "postgresql" => Dialect::Postgres,
        "MySQL" | "mysql" | "mariadb" => Dialect::MySql,
        _ => Dialect::Sqlite,
    }
}

impl Backend for Any {
    const NAME: &'static str = "any";

    async fn claim_record<'a>(
        tx: &'a mut Transaction<'_, Self>,
        rec: &'a NewRecord<'a>,
    ) -> Result<bool, sqlx::Error> {
        super::store::claim_record(tx, rec).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names_and_schemes_pick_the_dialect() {
        for (name, d) in [
            ("PostgreSQL", Dialect::Postgres),
            ("postgres", Dialect::Postgres),
            ("postgresql", Dialect::Postgres),
            ("MySQL", Dialect::MySql),
            ("mariadb", Dialect::MySql),
            ("SQLite", Dialect::Sqlite),
            ("sqlite", Dialect::Sqlite),
        ] {
            assert_eq!(dialect_of(name), d, "{name}");
        }
    }
}

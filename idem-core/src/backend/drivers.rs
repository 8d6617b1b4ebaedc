//! The native drivers as backends: what each one's sqlx driver exposes its
//! own way (its dialect, rows affected, the id of an inserted row). Their
//! statements and error codes live in each database's file; the code that
//! runs them, once for all, in `store/`.

#[allow(unused_imports)]
use super::{Backend, Dialect, NewRecord, sealed};
#[allow(unused_imports)]
use sqlx::{Pool, Transaction};

/// `impl Sealed` and `impl Backend` for one native driver; `$extra`: the
/// `Sealed` methods it overrides.
#[allow(unused_macros)]
macro_rules! native {
    ($db:ty, $name:literal, $dialect:expr $(, $extra:item)*) => {
        impl sealed::Sealed for $db {
            fn dialect_of_tx(_: &Transaction<'_, Self>) -> Dialect {
                $dialect
            }

            fn dialect_of_pool(_: &Pool<Self>) -> Dialect {
                $dialect
            }

            fn dialect_of_conn(_: &Self::Connection) -> Dialect {
                $dialect
            }

            fn rows_affected(done: &Self::QueryResult) -> u64 {
                done.rows_affected()
            }

            $($extra)*
        }

        impl Backend for $db {
            const NAME: &'static str = $name;

            async fn claim_record<'a>(
                tx: &'a mut Transaction<'_, Self>,
                rec: &'a NewRecord<'a>,
            ) -> Result<bool, sqlx::Error> {
                super::store::claim_record(tx, rec).await
            }
        }
    };
}

#[cfg(feature = "postgres")]
native!(sqlx::Postgres, "postgres", Dialect::Postgres);

#[cfg(feature = "mysql")]
native!(
    sqlx::MySql,
    "mysql",
    Dialect::MySql,
    fn last_insert_id(done: &Self::QueryResult) -> Result<i64, sqlx::Error> {
        i64::try_from(done.last_insert_id()).map_err(|e| sqlx::Error::Decode(Box::new(e)))
    }
);

#[cfg(feature = "sqlite")]
native!(sqlx::Sqlite, "sqlite", Dialect::Sqlite);

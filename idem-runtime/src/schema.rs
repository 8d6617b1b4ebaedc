//! The runtime's own tables, created with one call.

use crate::Error;
use crate::backend::Backend;
use sqlx::Pool;

/// Creates idem's tables (`idem_record`, `idem_outbox`, and their history
/// tables `idem_record_history`, `idem_outbox_history`, see
/// [`archive`](crate::archive)) and their indexes if they do not exist.
/// Safe to run twice, and concurrently with itself.
///
/// ```no_run
/// # async fn f() -> Result<(), idem_runtime::Error> {
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// idem_runtime::migrate(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn migrate<DB: Backend>(pool: &Pool<DB>) -> Result<(), Error> {
    let mut tx = DB::begin(pool).await?;
    for stmt in DB::dialect(&tx).schema() {
        DB::exec(&mut tx, stmt).await?;
    }
    tx.commit().await?;
    Ok(())
}

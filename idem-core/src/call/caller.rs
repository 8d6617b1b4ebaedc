//! A transaction the caller holds, that idempotent calls run inside.
//!
//! Why a type of its own rather than `&mut sqlx::Transaction`: a call runs
//! under a savepoint of the caller's transaction, and sqlx's nested
//! `Transaction::begin` is not safe to cancel or to fail. Its transaction
//! object is marked open before the `SAVEPOINT` is answered; dropped then
//! (a `tokio::time::timeout` around the call) or failing, it "rolls back"
//! at the depth it found: the *caller's* level, the whole transaction on
//! the first level. The caller's later statements then autocommit one by
//! one and its `commit()` succeeds without committing anything: its writes
//! before the call are silently lost (`tests/tests/call/composition.rs` shows
//! it on PostgreSQL and MariaDB).
//!
//! A [`CallerTx`] owns the transaction, so a call can take it for its
//! duration: the `SAVEPOINT` runs in a task of its own that always
//! completes; the release, the rollback to the savepoint, or (dropped
//! unfinished) the queued rollback to it, leave the caller's transaction
//! exactly as it was, and hand it back. Where that cannot be done (the call
//! is cancelled while its savepoint is being opened, or the savepoint
//! cannot be opened or closed), the whole transaction is rolled back and
//! every later use of the `CallerTx` fails with
//! [`Error::TransactionLost`]: never an `Ok` commit that committed part of
//! it, or nothing.

use crate::backend::Backend;
use crate::error::Error;
use sqlx::{Pool, Transaction};
use sqlx_core::transaction::TransactionManager as _;

/// A transaction the caller holds, which `#[idempotent]` handlers can run
/// inside: the call's guard, body and bookkeeping run under a savepoint
/// of it, and its effects commit — or roll back — with the caller's own
/// writes when the caller ends it.
///
/// ```
/// use idem_runtime::{idempotent, CallerTx, Outcome};
/// use sqlx::SqliteConnection;
///
/// #[derive(serde::Serialize)]
/// struct Welcome { user_id: i64 }
///
/// #[idempotent(key = "welcome:{w.user_id}", strategy = record, biz_type = "welcome")]
/// async fn send_welcome(tx: &mut SqliteConnection, w: &Welcome) -> Result<(), sqlx::Error> {
///     sqlx::query("INSERT INTO mail (user_id) VALUES (?)").bind(w.user_id).execute(&mut *tx).await?;
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// idem_runtime::migrate(&pool).await?;
/// sqlx::query("CREATE TABLE users (id INTEGER PRIMARY KEY)").execute(&pool).await?;
/// sqlx::query("CREATE TABLE mail (user_id INTEGER)").execute(&pool).await?;
///
/// // The caller's own write and the handler's effect commit together.
/// let mut tx = CallerTx::begin(&pool).await?;
/// sqlx::query("INSERT INTO users (id) VALUES (7)").execute(tx.conn()?).await?;
/// assert!(send_welcome(&mut tx, &Welcome { user_id: 7 }).await?.is_executed());
/// tx.commit().await?;
///
/// let mut tx = CallerTx::begin(&pool).await?;
/// assert_eq!(send_welcome(&mut tx, &Welcome { user_id: 7 }).await?, Outcome::Duplicate(Some(())));
/// tx.commit().await?;
/// let mails: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM mail").fetch_one(&pool).await?;
/// assert_eq!(mails, 1);
/// # Ok(()) }
/// ```
///
/// What a call answers is only as durable as the caller's commit:
/// `Executed` means "executed in this transaction". A call that fails (or
/// is cancelled mid-body) rolls back to its savepoint: the transaction is
/// as it was before the call and stays usable. The front cache, if given,
/// is read but never written (idem does not see the commit).
pub struct CallerTx<DB: Backend> {
    tx: Option<Transaction<'static, DB>>,
    /// Why the transaction is gone, once it is.
    lost: Option<String>,
    /// A relay batch's call was dropped unfinished: the transaction goes
    /// back to [`BATCH_SAVEPOINT`] before anything else runs on it.
    undo: bool,
    /// A relay batch's calls each run under a [`BATCH_SAVEPOINT`]. Off (a
    /// batch the relay trusts, see `Relay::commit_batch`): no savepoint,
    /// one round trip less per call, and a call that fails or is dropped
    /// takes the whole transaction down ([`BARE_BATCH_UNDONE`]).
    savepoints: bool,
}

/// Why a relay batch without savepoints is gone: one of its calls failed
/// (or was dropped), and nothing of the batch may commit.
pub(crate) const BARE_BATCH_UNDONE: &str =
    "a call of a relay batch without savepoints failed; the batch is undone";

/// The savepoint each call of a relay batch runs under. One name for all:
/// a call opens it (`SAVEPOINT` of a name in use makes a new one, which
/// `ROLLBACK TO` finds first) and never releases it, so that a call costs
/// one statement of savepoint bookkeeping, not two; a failed call rolls
/// back to its own. The batch commits them all at once.
const BATCH_SAVEPOINT: &str = "SAVEPOINT idem_batch_call";
/// Back to the last [`BATCH_SAVEPOINT`] (it stays open).
const BATCH_ROLLBACK: &str = "ROLLBACK TO SAVEPOINT idem_batch_call";

impl<DB: Backend> std::fmt::Debug for CallerTx<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerTx")
            .field("open", &self.tx.is_some())
            .field("lost", &self.lost)
            .finish()
    }
}

impl<DB: Backend> CallerTx<DB> {
    /// Begins a transaction on `pool`, as idem's own calls do: safe to
    /// cancel (see [`Backend::begin`]), and `BEGIN IMMEDIATE` on SQLite so
    /// that concurrent callers serialize instead of failing on lock
    /// upgrade.
    pub async fn begin(pool: &Pool<DB>) -> Result<Self, Error> {
        Ok(CallerTx::new(DB::begin(pool).await?))
    }

    /// Wraps a transaction begun elsewhere.
    pub fn new(tx: Transaction<'static, DB>) -> Self {
        CallerTx {
            tx: Some(tx),
            lost: None,
            undo: false,
            savepoints: true,
        }
    }

    /// The transaction's connection, to run the caller's own statements
    /// on: `.execute(tx.conn()?)`.
    pub fn conn(&mut self) -> Result<&mut DB::Connection, Error> {
        Ok(&mut **self.transaction()?)
    }

    /// The transaction itself (for code that takes a `&mut Transaction`).
    /// Do not commit it by other means than [`CallerTx::commit`].
    pub fn transaction(&mut self) -> Result<&mut Transaction<'static, DB>, Error> {
        match (&mut self.tx, &self.lost) {
            (Some(tx), None) => Ok(tx),
            (_, Some(reason)) => Err(Error::TransactionLost {
                reason: reason.clone(),
            }),
            (None, None) => Err(Error::TransactionLost {
                reason: "it is in use by a call".into(),
            }),
        }
    }

    /// Commits the caller's writes and the effects of the calls made in
    /// it. [`Error::TransactionLost`] if a call took it down (nothing
    /// commits then); a failure of the `COMMIT` itself is
    /// [`Error::CommitUnknown`].
    pub async fn commit(mut self) -> Result<(), Error> {
        self.undo_dropped_call().await?;
        self.transaction()?;
        let tx = self.tx.take().expect("checked above");
        tx.commit().await.map_err(|e| {
            if crate::backend::classify::commit_outcome_unknown(&e) {
                Error::CommitUnknown(e)
            } else {
                Error::database(e)
            }
        })
    }

    /// Rolls the whole transaction back (dropping it does too).
    pub async fn rollback(mut self) -> Result<(), Error> {
        match self.tx.take() {
            Some(tx) => Ok(tx.rollback().await?),
            None => Ok(()),
        }
    }

    /// Takes the transaction for a call and opens the call's savepoint in
    /// it, in a task of its own that always completes.
    pub(crate) async fn lend(&mut self) -> Result<Lent<'_, DB>, Error> {
        Lent::open(Home::Borrowed(self)).await
    }

    /// Rolls back to the savepoint of a relay batch's call that was
    /// dropped unfinished, if one was (see [`Lent`]'s drop).
    pub(crate) async fn undo_dropped_call(&mut self) -> Result<(), Error> {
        if !self.undo {
            return Ok(());
        }
        self.undo = false;
        let tx = self.transaction()?;
        if let Err(e) = DB::exec(tx, BATCH_ROLLBACK).await {
            let tx = self.tx.take().expect("checked above");
            self.lose(
                tx,
                format!("a dropped call could not roll back to its savepoint: {e}"),
            );
            return Err(Error::database(e));
        }
        Ok(())
    }

    fn lose(&mut self, tx: Transaction<'static, DB>, reason: String) {
        self.lost = Some(reason);
        tokio::spawn(discard(tx));
    }
}

/// A relay batch's transaction, shared by the calls of its messages: each
/// call locks it and runs under a savepoint of it (see
/// [`Conn::Shared`](super::source::Conn)); the relay commits it once.
pub(crate) struct SharedTx<DB: Backend> {
    pub(crate) tx: std::sync::Arc<tokio::sync::Mutex<CallerTx<DB>>>,
    /// The outbox messages whose calls ended well (executed or duplicate):
    /// the relay marks them `success` in one statement before the batch's
    /// commit.
    pub(crate) success_marks: std::sync::Arc<std::sync::Mutex<Vec<i64>>>,
    /// The cache markers of the calls that released their savepoint, to
    /// write after the batch's commit.
    pub(crate) cache_markers: super::front::BatchMarkers,
}

impl<DB: Backend> Clone for SharedTx<DB> {
    fn clone(&self) -> Self {
        SharedTx {
            tx: self.tx.clone(),
            success_marks: self.success_marks.clone(),
            cache_markers: self.cache_markers.clone(),
        }
    }
}

impl<DB: Backend> std::fmt::Debug for SharedTx<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedTx")
    }
}

impl<DB: Backend> SharedTx<DB> {
    /// Shares `tx`; `savepoints`: each call under a savepoint of its own
    /// (see [`CallerTx`]'s field).
    pub(crate) fn new(mut tx: CallerTx<DB>, savepoints: bool) -> Self {
        tx.savepoints = savepoints;
        SharedTx {
            tx: std::sync::Arc::new(tokio::sync::Mutex::new(tx)),
            success_marks: Default::default(),
            cache_markers: Default::default(),
        }
    }

    /// Why the transaction is gone, if it is: the reason as given (such as
    /// [`BARE_BATCH_UNDONE`]), not wrapped in an error's message.
    pub(crate) async fn lost(&self) -> Option<String> {
        let mut tx = self.tx.lock().await;
        match tx.transaction() {
            Ok(_) => None,
            Err(Error::TransactionLost { reason }) => Some(reason),
            Err(e) => Some(e.to_string()),
        }
    }

    /// The messages whose calls ended well, taken out.
    pub(crate) fn take_marks(&self) -> Vec<i64> {
        match self.success_marks.lock() {
            Ok(mut marks) => std::mem::take(&mut *marks),
            Err(_) => Vec::new(),
        }
    }

    /// Takes the transaction out (to commit it); later calls on this
    /// share fail with [`Error::TransactionLost`].
    pub(crate) async fn take(&self) -> CallerTx<DB> {
        let mut tx = self.tx.lock().await;
        std::mem::replace(
            &mut *tx,
            CallerTx {
                tx: None,
                lost: Some("the relay's batch has ended".into()),
                undo: false,
                savepoints: true,
            },
        )
    }
}

impl<DB: Backend> From<Transaction<'static, DB>> for CallerTx<DB> {
    fn from(tx: Transaction<'static, DB>) -> Self {
        CallerTx::new(tx)
    }
}

/// Rolls a transaction back down to no transaction at all, so its pooled
/// connection never returns to the pool inside one. Errors mean a broken
/// connection, which the pool drops.
async fn discard<DB: Backend>(mut tx: Transaction<'static, DB>) {
    while DB::TransactionManager::get_transaction_depth(&*tx) > 0 {
        if DB::TransactionManager::rollback(&mut *tx).await.is_err() {
            break;
        }
    }
}

/// A call's savepoint being opened: dropped before it is (the call was
/// cancelled), the caller's transaction is lost; the task that opens it
/// rolls it back.
struct Pending<'c, DB: Backend> {
    home: Option<Home<'c, DB>>,
}

/// Where a lent transaction goes back to: the caller's `&mut CallerTx`,
/// or a [`CallerTx`] shared by the calls of a relay's batch, locked for
/// the call.
pub(crate) enum Home<'c, DB: Backend> {
    /// The caller's, borrowed for the call.
    Borrowed(&'c mut CallerTx<DB>),
    /// A shared one, locked for the call.
    Shared(tokio::sync::OwnedMutexGuard<CallerTx<DB>>),
}

impl<DB: Backend> std::ops::Deref for Home<'_, DB> {
    type Target = CallerTx<DB>;
    fn deref(&self) -> &CallerTx<DB> {
        match self {
            Home::Borrowed(tx) => tx,
            Home::Shared(tx) => tx,
        }
    }
}

impl<DB: Backend> std::ops::DerefMut for Home<'_, DB> {
    fn deref_mut(&mut self) -> &mut CallerTx<DB> {
        match self {
            Home::Borrowed(tx) => tx,
            Home::Shared(tx) => tx,
        }
    }
}

impl<'c, DB: Backend> Pending<'c, DB> {
    fn defuse(mut self) -> Home<'c, DB> {
        self.home.take().expect("defused once")
    }

    fn into_lent(self, tx: Transaction<'static, DB>, batch: bool) -> Lent<'c, DB> {
        Lent {
            tx: Some(tx),
            home: self.defuse(),
            batch,
            bare: false,
        }
    }
}

impl<DB: Backend> Drop for Pending<'_, DB> {
    fn drop(&mut self) {
        if let Some(mut home) = self.home.take() {
            home.lost = Some("a call inside it was cancelled while it opened its savepoint".into());
        }
    }
}

/// The caller's transaction, lent to one call, one savepoint deeper.
/// Dropped unfinished (the call was cancelled, or failed before its
/// bookkeeping), it queues the rollback to the savepoint — it runs before
/// the caller's next statement — and goes back to the caller.
pub(crate) struct Lent<'c, DB: Backend> {
    tx: Option<Transaction<'static, DB>>,
    home: Home<'c, DB>,
    /// Under a relay batch's [`BATCH_SAVEPOINT`] rather than a savepoint
    /// level of sqlx's.
    batch: bool,
    /// In a relay batch without savepoints: a failure or a drop loses the
    /// batch's transaction ([`BARE_BATCH_UNDONE`]).
    bare: bool,
}

impl<'c, DB: Backend> Lent<'c, DB> {
    /// Takes `home`'s transaction for a call and opens the call's
    /// savepoint in it, in a task of its own that always completes.
    pub(crate) async fn open(mut home: Home<'c, DB>) -> Result<Self, Error> {
        let batch = matches!(home, Home::Shared(_));
        if batch && !home.savepoints {
            // Nothing to run, nothing in flight to cancel.
            home.transaction()?;
            let tx = home.tx.take().expect("checked above");
            return Ok(Lent {
                tx: Some(tx),
                home,
                batch,
                bare: true,
            });
        }
        let undo = std::mem::take(&mut home.undo);
        home.transaction()?;
        let mut tx = home.tx.take().expect("checked above");
        let depth = DB::TransactionManager::get_transaction_depth(&*tx);
        let (back, returned) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let opened = if batch {
                // A dropped call's rollback first, then this call's
                // savepoint.
                let undone = match undo {
                    true => DB::exec(&mut tx, BATCH_ROLLBACK).await,
                    false => Ok(()),
                };
                match undone {
                    Ok(()) => DB::exec(&mut tx, BATCH_SAVEPOINT).await,
                    Err(e) => Err(e),
                }
            } else {
                DB::TransactionManager::begin(&mut *tx, None).await
            };
            if let Err((tx, _)) = back.send((tx, opened)) {
                // The call was cancelled meanwhile: the caller's
                // transaction cannot be handed back; end it cleanly.
                discard(tx).await;
            }
        });
        // Until the task answers, a cancelled call leaves the transaction
        // lost (the task rolls it back).
        let pending = Pending { home: Some(home) };
        match returned.await {
            Ok((tx, Ok(()))) => Ok(pending.into_lent(tx, batch)),
            Ok((tx, Err(e))) => {
                let mut home = pending.defuse();
                if batch {
                    // Where a batch's transaction stands is unknown now.
                    home.lose(tx, format!("the call's savepoint could not be opened: {e}"));
                } else if DB::TransactionManager::get_transaction_depth(&*tx) == depth {
                    // Nothing was undone: the transaction is as it was.
                    home.tx = Some(tx);
                } else {
                    // The driver rolled the caller's level back.
                    home.lose(tx, format!("the call's savepoint could not be opened: {e}"));
                }
                Err(Error::database(e))
            }
            // The task panicked or the runtime is shutting down.
            Err(_) => Err(Error::Database(sqlx::Error::WorkerCrashed)),
        }
    }

    pub(crate) fn tx(&mut self) -> &mut Transaction<'static, DB> {
        self.tx
            .as_mut()
            .expect("a lent transaction is present until it is handed back")
    }

    pub(crate) fn tx_ref(&self) -> &Transaction<'static, DB> {
        self.tx
            .as_ref()
            .expect("a lent transaction is present until it is handed back")
    }

    /// Whether the transaction is a relay batch's (see [`SharedTx`]).
    pub(crate) fn shared(&self) -> bool {
        matches!(self.home, Home::Shared(_))
    }

    /// Releases the savepoint and hands the transaction back.
    pub(crate) async fn release(mut self) -> Result<(), sqlx::Error> {
        let mut tx = self.tx.take().expect("present");
        if self.batch {
            // Left open: the batch's commit ends it.
            self.home.tx = Some(tx);
            return Ok(());
        }
        match DB::TransactionManager::commit(&mut *tx).await {
            Ok(()) => {
                self.home.tx = Some(tx);
                Ok(())
            }
            Err(e) => {
                // The level is uncertain now: nothing of it may commit.
                self.home.lose(
                    tx,
                    format!("the call's savepoint could not be released: {e}"),
                );
                Err(e)
            }
        }
    }

    /// Rolls back to the savepoint and hands the transaction back.
    pub(crate) async fn roll_back(mut self) {
        let mut tx = self.tx.take().expect("present");
        if self.bare {
            self.home.lose(tx, BARE_BATCH_UNDONE.into());
            return;
        }
        let back = match self.batch {
            true => DB::exec(&mut tx, BATCH_ROLLBACK).await,
            false => DB::TransactionManager::rollback(&mut *tx).await,
        };
        match back {
            Ok(()) => self.home.tx = Some(tx),
            Err(e) => self.home.lose(
                tx,
                format!("the call could not roll back to its savepoint: {e}"),
            ),
        }
    }
}

impl<DB: Backend> Drop for Lent<'_, DB> {
    fn drop(&mut self) {
        if let Some(mut tx) = self.tx.take() {
            if self.bare {
                self.home.lose(tx, BARE_BATCH_UNDONE.into());
                return;
            }
            if self.batch {
                // Before the next statement of the batch.
                self.home.undo = true;
            } else {
                DB::TransactionManager::start_rollback(&mut *tx);
            }
            self.home.tx = Some(tx);
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Lent<'_, DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lent")
    }
}

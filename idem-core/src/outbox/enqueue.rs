//! The producer's side: [`enqueue`] a message in the caller's transaction,
//! idempotently.

use super::options::{EnqueueOptions, check_text};
use crate::Error;
use crate::backend::{Backend, NewMessage, OutboxInsert};
use sqlx::Transaction;
use std::sync::atomic::{AtomicBool, Ordering};

/// The PostgreSQL channel [`enqueue`] notifies on (`pg_notify`), with the
/// message's topic as the payload, and a PostgreSQL [`Relay`](crate::outbox::Relay)
/// listens on to wake up at once (its
/// [push wake-up](crate::outbox::Relay::push_wakeup)). A notification is
/// sent only for a new message ([`Enqueued::New`]) whose transaction
/// committed, never for one rolled back. Your own code may `LISTEN` on it
/// too.
///
/// Who sends it: where a relay of the same process pushes for the topic,
/// its *notifier* does, on a connection of its own, once the message is
/// visible (committed), coalescing the messages of any number of
/// producers into one statement (see [`NOTIFIER_APP`](crate::outbox::NOTIFIER_APP)).
/// Elsewhere (a producer-only process) the insert statement itself
/// notifies, delivered at the commit.
pub const NOTIFY_CHANNEL: &str = "idem_outbox";

static NOTIFY: AtomicBool = AtomicBool::new(true);

/// Whether [`enqueue`] on PostgreSQL notifies [`NOTIFY_CHANNEL`] (default:
/// yes), for the whole process. MariaDB and SQLite have no `NOTIFY`: their
/// relays poll, whatever this says.
///
/// PostgreSQL serializes the commits of transactions that issued
/// `NOTIFY` on one database-wide lock, so producers that notify in their
/// own transaction commit one at a time. With a pushing relay in the
/// process the producers' transactions do not notify (its notifier does,
/// after their commit, see [`NOTIFY_CHANNEL`]); a producer-only process
/// that enqueues at thousands of commits per second, with relays that poll
/// anyway (or run with [`push_wakeup(false)`](crate::outbox::Relay::push_wakeup)),
/// can turn notifying off. Relays then find the messages by polling:
/// nothing is lost either way.
///
/// ```
/// idem_runtime::outbox::notify_on_enqueue(false);
/// assert!(!idem_runtime::outbox::notify_on_enqueue_enabled());
/// # idem_runtime::outbox::notify_on_enqueue(true);
/// ```
pub fn notify_on_enqueue(on: bool) {
    NOTIFY.store(on, Ordering::Relaxed);
}

/// Whether [`enqueue`] notifies (see [`notify_on_enqueue`]).
pub fn notify_on_enqueue_enabled() -> bool {
    NOTIFY.load(Ordering::Relaxed)
}

/// The longest payload [`enqueue`] accepts, in bytes of its JSON text: what
/// MariaDB's `MEDIUMTEXT` column holds (16 MiB - 1), the same on every
/// backend.
pub const MAX_PAYLOAD_LEN: usize = 16 * 1024 * 1024 - 1;

/// What [`enqueue`] did: the message's id either way, and whether this call
/// wrote it.
///
/// ```
/// use idem_runtime::outbox::Enqueued;
/// assert_eq!(Enqueued::New(7).id(), 7);
/// assert!(!Enqueued::Already(7).is_new());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Enqueued {
    /// Written by this call (it commits with the caller's transaction).
    New(i64),
    /// `(topic, msg_id)` was already enqueued with the same payload (a
    /// producer retrying after a lost commit acknowledgement, or a
    /// redelivered command): nothing was written, this is its id.
    Already(i64),
}

impl Enqueued {
    /// The message's id, the value a relay passes to
    /// [`Source::outbox`](crate::Source::outbox).
    pub fn id(self) -> i64 {
        match self {
            Enqueued::New(id) | Enqueued::Already(id) => id,
        }
    }

    /// Whether this call wrote the message.
    pub fn is_new(self) -> bool {
        matches!(self, Enqueued::New(_))
    }
}

/// Enqueues a message in `tx`, the caller's business transaction, so the
/// message commits or rolls back with the business change.
///
/// On PostgreSQL (native or through `sqlx::Any`) a new message also
/// notifies [`NOTIFY_CHANNEL`] once committed: relays listening there wake
/// up at once instead of at their next poll (see [`NOTIFY_CHANNEL`] for
/// who sends it, and [`notify_on_enqueue`]).
///
/// Idempotent per `(topic, msg_id)`, so a producer can retry its whole
/// transaction after a lost commit acknowledgement:
///
/// - a new message: [`Enqueued::New`] with its id;
/// - the same `(topic, msg_id)` with the same payload (compared as JSON
///   values: key order and whitespace do not matter):
///   [`Enqueued::Already`] with the existing message's id, nothing written;
/// - the same `(topic, msg_id)` with another payload:
///   [`Error::MessageConflict`], nothing written.
///
/// Neither answer is a database error, so the caller's transaction stays
/// usable (on PostgreSQL a unique violation would abort it). An insert of
/// the same message by a concurrent, uncommitted transaction is waited for.
///
/// `topic` and `msg_id` must be non-empty, at most [`MAX_ID_LEN`](super::MAX_ID_LEN) bytes and
/// free of control characters, and the payload at most
/// [`MAX_PAYLOAD_LEN`] bytes: checked before any SQL
/// ([`Error::InvalidMessage`]), the same on every backend. The comparison
/// is exact, byte for byte: `"m-1 "` is another id than `"m-1"`.
///
/// "Already enqueued" is known while the message is in `idem_outbox`: a
/// finished message moved to `idem_outbox_history` by the archiver
/// (`idem_runtime::archive`, after its outbox retention) no longer
/// counts, and the same id would be enqueued again.
///
/// `tx` is the transaction the message commits with: a
/// `&mut Transaction`, a [`CallerTx`](crate::CallerTx), or, inside a
/// handler written on its connection (`tx: &mut SqliteConnection`, …), that
/// connection ([`InTransaction`]). A connection with no transaction open
/// is [`Error::Config`]: the message would commit on its own, whether or
/// not the business change does.
///
/// ```
/// use idem_runtime::outbox::{enqueue, Enqueued};
/// use idem_runtime::{idempotent, Error, Outcome, State};
/// use sqlx::{SqliteConnection, SqlitePool};
///
/// #[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
/// enum OrderState { Unpaid, Paid }
///
/// // A handler written on its connection, as ordinary sqlx code: its
/// // follow-up message commits with the transition, or not at all.
/// #[idempotent(key = "pay:{order}", strategy = state_machine, table = "orders", id = order,
///              from = OrderState::Unpaid, to = OrderState::Paid)]
/// async fn pay(tx: &mut SqliteConnection, order: i64) -> Result<(), Error> {
///     let msg = serde_json::json!({ "order": order });
///     enqueue(tx, "order.paid", &format!("paid-{order}"), &msg).await?;
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = SqlitePool::connect("sqlite::memory:").await?;
/// idem_runtime::migrate(&pool).await?;
/// sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL)").execute(&pool).await?;
/// sqlx::query("INSERT INTO orders VALUES (7, 'UNPAID')").execute(&pool).await?;
///
/// assert_eq!(pay(&pool, 7).await?, Outcome::Executed(()));
/// assert_eq!(pay(&pool, 7).await?, Outcome::Duplicate(None));
/// let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox WHERE topic = 'order.paid'")
///     .fetch_one(&pool).await?;
/// assert_eq!(n, 1);
///
/// // A connection with no transaction open is refused: nothing is written.
/// let mut conn = pool.acquire().await?;
/// let bare = enqueue(&mut *conn, "order.paid", "paid-8", &serde_json::json!({})).await;
/// assert!(matches!(bare, Err(Error::Config { .. })), "{bare:?}");
/// # Ok(()) }
/// ```
pub async fn enqueue<DB: Backend, T: InTransaction<DB> + ?Sized>(
    tx: &mut T,
    topic: &str,
    msg_id: &str,
    payload: &serde_json::Value,
) -> Result<Enqueued, Error> {
    enqueue_with(tx, topic, msg_id, payload, &EnqueueOptions::new()).await
}

/// [`enqueue`] with options: an **ordering key** (the key's messages
/// delivered one at a time, in enqueue order), a **delay** (not delivered
/// before it), **headers** (read by handlers, carried by the publishers to
/// the broker). See [`EnqueueOptions`].
///
/// A message enqueued again (the same `topic` and `msg_id`, the same
/// payload) is [`Enqueued::Already`] whatever its options: the first
/// enqueue's key, delay and headers stand.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # idem_runtime::migrate(&pool).await?;
/// use idem_runtime::outbox::{enqueue_with, EnqueueOptions};
/// use std::time::Duration;
///
/// let mut tx = pool.begin().await?;
/// // "Cancel the order if still unpaid in 30 minutes", after its other
/// // messages (same key), with the tenant for the handler.
/// let options = EnqueueOptions::new()
///     .ordering_key("order-42")
///     .delay(Duration::from_secs(30 * 60))
///     .header("tenant", "acme");
/// let payload = serde_json::json!({ "order_id": 42 });
/// enqueue_with(&mut tx, "order.cancel_unpaid", "cancel-42", &payload, &options).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn enqueue_with<DB: Backend, T: InTransaction<DB> + ?Sized>(
    tx: &mut T,
    topic: &str,
    msg_id: &str,
    payload: &serde_json::Value,
    options: &EnqueueOptions,
) -> Result<Enqueued, Error> {
    let answer = match tx.in_transaction() {
        Ok(conn) => enqueue_once::<DB>(conn, topic, msg_id, payload, options).await,
        Err(e) => Err(e),
    };
    match &answer {
        Ok(Enqueued::Already(_)) => crate::metrics::already_enqueued(),
        Ok(Enqueued::New(_)) => {}
        Err(e) => crate::metrics::error(e),
    }
    answer
}

async fn enqueue_once<DB: Backend>(
    conn: &mut DB::Connection,
    topic: &str,
    msg_id: &str,
    payload: &serde_json::Value,
    options: &EnqueueOptions,
) -> Result<Enqueued, Error> {
    check_message(topic, msg_id)?;
    options
        .check()
        .map_err(|reason| invalid(topic, msg_id, reason))?;
    let headers = options.headers_json();
    let text = serde_json::to_string(payload).map_err(Error::Serialization)?;
    if text.len() > MAX_PAYLOAD_LEN {
        return Err(invalid(
            topic,
            msg_id,
            format!(
                "the payload is {} bytes of JSON, at most {MAX_PAYLOAD_LEN} are allowed",
                text.len()
            ),
        ));
    }
    // A relay of this process with push wake-up runs a notifier for the
    // topic: it notifies after the commit, outside this transaction, so
    // producers do not serialize on the notification lock. Otherwise the
    // insert notifies itself (where the dialect can).
    let notify = notify_on_enqueue_enabled();
    let coalesced = notify && super::notifier::covers(topic);
    // Twice at most: a message found to exist, then gone before it could
    // be read (the archiver moved it), is inserted anew.
    let message = NewMessage {
        topic,
        msg_id,
        payload: &text,
        ordering_key: options.get_ordering_key(),
        headers: headers.as_deref(),
        // Whole milliseconds: SQLite reads the bound seconds as text.
        delay_secs: options.delay_now().as_millis() as f64 / 1000.0,
    };
    for _ in 0..2 {
        match DB::outbox_insert(conn, &message, notify && !coalesced).await? {
            OutboxInsert::New(id) => {
                if coalesced {
                    // `false`: the relay stopped meanwhile; polling finds
                    // the message.
                    super::notifier::hand_over(topic, id);
                }
                return Ok(Enqueued::New(id));
            }
            OutboxInsert::Existing {
                id,
                payload: stored,
            } => {
                return if same_json(&stored, &text) {
                    Ok(Enqueued::Already(id))
                } else {
                    Err(Error::MessageConflict {
                        topic: topic.to_string(),
                        msg_id: msg_id.to_string(),
                    })
                };
            }
            OutboxInsert::Missing => continue,
        }
    }
    Err(invalid(
        topic,
        msg_id,
        "the database neither stored the message nor holds one with this topic and id".into(),
    ))
}

/// Whether two JSON texts hold the same value (object key order and
/// whitespace aside). A stored text that is not JSON matches nothing.
fn same_json(stored: &str, new: &str) -> bool {
    match (
        serde_json::from_str::<serde_json::Value>(stored),
        serde_json::from_str::<serde_json::Value>(new),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The run-time checks of a message's `topic` and `msg_id`.
fn check_message(topic: &str, msg_id: &str) -> Result<(), Error> {
    check_text("topic", topic)
        .and_then(|()| check_text("msg_id", msg_id))
        .map_err(|reason| invalid(topic, msg_id, reason))
}

fn invalid(topic: &str, msg_id: &str, reason: String) -> Error {
    Error::InvalidMessage {
        topic: shown(topic),
        msg_id: shown(msg_id),
        reason,
    }
}

/// A value for an error message: escaped, at most 160 characters.
fn shown(value: &str) -> String {
    let mut s: String = value
        .chars()
        .take(160)
        .flat_map(char::escape_default)
        .collect();
    if value.chars().count() > 160 {
        s.push('…');
    }
    s
}

/// What a message can be enqueued in: a transaction, and nothing that
/// commits on its own (see [`enqueue`]).
pub trait InTransaction<DB: Backend>: Send {
    /// The connection of the open transaction, or why there is none.
    fn in_transaction(&mut self) -> Result<&mut DB::Connection, Error>;
}

impl<DB: Backend> InTransaction<DB> for Transaction<'_, DB> {
    fn in_transaction(&mut self) -> Result<&mut DB::Connection, Error> {
        Ok(&mut **self)
    }
}

impl<DB: Backend> InTransaction<DB> for crate::CallerTx<DB> {
    fn in_transaction(&mut self) -> Result<&mut DB::Connection, Error> {
        self.conn()
    }
}

/// A handler's connection (`tx: &mut PgConnection`): in the call's
/// transaction, as the expansion hands it; a bare connection is refused.
macro_rules! connection_in_transaction {
    ($($feature:literal => $db:ty, $conn:ty;)*) => {$(
        #[cfg(feature = $feature)]
        impl InTransaction<$db> for $conn {
            fn in_transaction(&mut self) -> Result<&mut $conn, Error> {
                use sqlx_core::transaction::TransactionManager as _;
                match <$db as sqlx::Database>::TransactionManager::get_transaction_depth(self) {
                    0 => Err(Error::config(
                        "enqueue on a connection with no transaction open: the message \
                         would commit on its own; enqueue in the transaction of the change \
                         it announces (a handler's `tx`, a Transaction, a CallerTx)",
                    )),
                    _ => Ok(self),
                }
            }
        }
    )*};
}

connection_in_transaction! {
    "sqlite" => sqlx::Sqlite, sqlx::SqliteConnection;
    "postgres" => sqlx::Postgres, sqlx::PgConnection;
    "mysql" => sqlx::MySql, sqlx::MySqlConnection;
    "any" => sqlx::Any, sqlx::AnyConnection;
}

#[cfg(test)]
mod tests {
    use super::super::options::MAX_ID_LEN;
    use super::*;

    #[test]
    fn ids_are_checked() {
        assert!(check_message("t", "m").is_ok());
        assert!(check_message(&"t".repeat(MAX_ID_LEN), &"é".repeat(MAX_ID_LEN / 2)).is_ok());
        for (t, m, why) in [
            ("", "m", "the topic is empty"),
            ("t", "", "the msg_id is empty"),
            (
                "t",
                "m\n",
                "the msg_id contains the control character '\\n'",
            ),
            ("t\0", "m", "the topic contains the control character '\\0'"),
        ] {
            let e = check_message(t, m).expect_err(why);
            assert!(e.to_string().contains(why), "{e}");
            assert_eq!(e.kind(), crate::ErrorKind::InvalidMessage);
            assert!(!e.is_retryable());
        }
        // Bytes, not characters: 65 two-byte characters are 130 bytes.
        let e = check_message("t", &"é".repeat(65)).expect_err("too long");
        assert!(e.to_string().contains("130 bytes long"), "{e}");
        let e = check_message(&"t".repeat(MAX_ID_LEN + 1), "m").expect_err("too long");
        assert!(e.to_string().contains("the topic is 129 bytes"), "{e}");
    }

    #[test]
    fn the_notifying_insert_uses_the_documented_channel() {
        let sql = crate::backend::Dialect::Postgres.sql();
        let notify = sql.outbox_insert_notify.expect("PostgreSQL notifies");
        assert!(
            notify.contains(&format!("pg_notify('{NOTIFY_CHANNEL}', ins.topic")),
            "{notify}"
        );
        for d in [
            crate::backend::Dialect::MySql,
            crate::backend::Dialect::Sqlite,
        ] {
            assert!(d.sql().outbox_insert_notify.is_none());
        }
    }

    #[test]
    fn payloads_compare_as_json_values() {
        assert!(same_json(
            r#"{"b": 2, "a": [1, {"c": null}]}"#,
            r#"{"a":[1,{"c":null}],"b":2}"#
        ));
        assert!(!same_json(r#"{"a": 1}"#, r#"{"a": 2}"#));
        assert!(!same_json(r#"{"a": 1}"#, r#"{"a": "1"}"#));
        assert!(!same_json("not json", "not json"));
    }
}

//! `idem`: the operator's tool for idem's tables — the data-repair scripts
//! prepared in advance, so an incident is a command, not an improvised
//! `UPDATE`.
//!
//! One binary serves PostgreSQL, MariaDB / MySQL and SQLite (through
//! `sqlx::Any`; the URL's scheme picks the database).
//!
//! Exit codes: 0 success, 1 not found (`record show`), 2 usage or
//! configuration error, 3 database error.

use clap::{Args, Parser, Subcommand, ValueEnum};
use idem_runtime::__private::Dialect;
use idem_runtime::archive::{ArchiveReport, Archiver, RecordInfo, find_record};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyConnection, AnyPool, Connection, Row};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const TABLES: [&str; 4] = [
    "idem_record",
    "idem_outbox",
    "idem_record_history",
    "idem_outbox_history",
];

/// Ids per `UPDATE … WHERE id IN (…)` statement.
const CHUNK: usize = 500;

#[derive(Parser, Debug)]
#[command(
    name = "idem",
    version,
    about = "Operate idem's tables: migrate, inspect and repair the outbox, archive, look up records",
    long_about = "Operate idem's tables: create them, inspect the outbox (local message table) and \
        requeue dead-lettered messages, move expired records and finished messages to the history \
        tables, and look up an idempotency record by key, online or archived.\n\n\
        One binary serves PostgreSQL (postgres://…), MariaDB / MySQL (mysql://…) and SQLite \
        (sqlite://path?mode=rwc).\n\n\
        Exit codes: 0 success, 1 not found (record show), 2 usage or configuration error, \
        3 database error.",
    propagate_version = true
)]
struct Cli {
    /// Database URL: postgres://user:pass@host/db, mysql://user:pass@host/db or
    /// sqlite://path.db (add ?mode=rwc to create the file).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,

    /// Print JSON (one document on stdout) instead of a table.
    #[arg(long, global = true)]
    json: bool,

    /// Give up connecting after this long (e.g. 10s).
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    connect_timeout: Duration,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create idem's tables and indexes if missing, upgrade older ones (safe to run twice, and concurrently).
    #[command(
        long_about = "Create idem's tables (idem_record, idem_outbox, idem_record_history, \
            idem_outbox_history) and their indexes if they do not exist, and upgrade tables an \
            earlier release created to the current schema version (kept in idem_schema_version), \
            keeping their rows. Safe to run twice, and concurrently with itself."
    )]
    Migrate,
    /// Inspect and repair the outbox (idem_outbox).
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// Move expired records and finished outbox messages to the history tables.
    #[command(
        long_about = "Move expired idempotency records (expire_time passed) to idem_record_history \
            and finished outbox messages (success / failed, last updated longer ago than \
            --outbox-retention) to idem_outbox_history, in short bounded batches, until nothing is \
            left to move. Pending messages never move. Safe under live traffic; an interrupted run \
            loses nothing and can simply be re-run."
    )]
    Archive(ArchiveArgs),
    /// Look up idempotency records.
    #[command(subcommand)]
    Record(RecordCommand),
}

#[derive(Subcommand, Debug)]
enum OutboxCommand {
    /// Messages per topic and status, and the age of each topic's oldest pending message.
    Stats {
        /// Only this topic.
        #[arg(long)]
        topic: Option<String>,
    },
    /// List messages of one status (default: failed, i.e. dead-lettered), oldest first.
    List {
        /// Which messages.
        #[arg(long, value_enum, default_value_t = StatusArg::Failed)]
        status: StatusArg,
        /// Only this topic.
        #[arg(long)]
        topic: Option<String>,
        /// At most this many messages.
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// Send dead-lettered (failed) messages back to pending, for the relay to deliver again.
    #[command(
        long_about = "Send dead-lettered (status = failed) messages back to pending: attempts reset \
            to 0, due now, lease cleared, last_error kept and prefixed with \"requeued: \". Only \
            failed messages change; pending and successful ones are never touched. Choose exactly \
            one of --id, --topic, --all-failed. With --dry-run, prints what would change and \
            changes nothing."
    )]
    Requeue(RequeueArgs),
}

#[derive(Args, Debug)]
struct RequeueArgs {
    #[command(flatten)]
    target: RequeueTarget,
    /// Print the messages that would be requeued; change nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
struct RequeueTarget {
    /// The failed message with this id.
    #[arg(long)]
    id: Option<i64>,
    /// Every failed message of this topic.
    #[arg(long)]
    topic: Option<String>,
    /// Every failed message.
    #[arg(long)]
    all_failed: bool,
}

#[derive(Args, Debug)]
struct ArchiveArgs {
    /// Rows per batch and table (1–10000); smaller batches hold locks for less time.
    #[arg(long, default_value_t = 1000)]
    batch: u32,
    /// Finished outbox messages last updated longer ago than this move (e.g. 7d, 12h, 30m, 0s).
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    outbox_retention: Duration,
    /// Sleep between batches, to stay gentle on a busy database (e.g. 50ms).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pause: Duration,
}

#[derive(Subcommand, Debug)]
enum RecordCommand {
    /// Show the records of an idempotency key: the online one, else the latest archived one.
    #[command(
        long_about = "Show the idempotency records of KEY, one per biz_type (records are unique per \
            (biz_type, key): handlers sharing a key template each have their own): the online one \
            (idem_record) if the key is live, else the latest archived one (idem_record_history). \
            --biz-type shows only that business type's record. With --json: one object when one \
            record matches, an array (ordered by biz_type) when several do. Exits with code 1 if \
            there is none."
    )]
    Show {
        /// The idempotency key, e.g. pay-callback:SN-123.
        key: String,
        /// Only the record of this business type (the handler's biz_type).
        #[arg(long)]
        biz_type: Option<String>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum StatusArg {
    Pending,
    Success,
    Failed,
}

impl StatusArg {
    fn as_str(self) -> &'static str {
        match self {
            StatusArg::Pending => "pending",
            StatusArg::Success => "success",
            StatusArg::Failed => "failed",
        }
    }
}

/// A failure: its message and exit code.
#[derive(Debug)]
struct Fail {
    code: u8,
    msg: String,
}

impl Fail {
    fn usage(msg: impl Into<String>) -> Self {
        Fail {
            code: 2,
            msg: msg.into(),
        }
    }
}

impl From<sqlx::Error> for Fail {
    fn from(e: sqlx::Error) -> Self {
        Fail {
            code: 3,
            msg: format!("database error: {e}"),
        }
    }
}

impl From<idem_runtime::Error> for Fail {
    fn from(e: idem_runtime::Error) -> Self {
        Fail {
            code: 3,
            msg: e.to_string(),
        }
    }
}

impl From<serde_json::Error> for Fail {
    fn from(e: serde_json::Error) -> Self {
        Fail {
            code: 3,
            msg: format!("cannot write JSON: {e}"),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("idem: cannot start the async runtime: {e}");
            return ExitCode::from(3);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("idem: {}", f.msg);
            ExitCode::from(f.code)
        }
    }
}

async fn run(cli: Cli) -> Result<(), Fail> {
    let Some(url) = cli.database_url.as_deref().filter(|u| !u.is_empty()) else {
        return Err(Fail::usage(
            "no database URL: pass --database-url or set DATABASE_URL",
        ));
    };
    let pool = connect(url, cli.connect_timeout).await?;
    let dialect = <sqlx::Any as idem_runtime::Backend>::pool_dialect(&pool);
    let out = Out { json: cli.json };
    let result = match cli.command {
        Command::Migrate => migrate(&pool, dialect, url, out).await,
        Command::Outbox(OutboxCommand::Stats { topic }) => {
            outbox_stats(&pool, dialect, topic.as_deref(), out).await
        }
        Command::Outbox(OutboxCommand::List {
            status,
            topic,
            limit,
        }) => outbox_list(&pool, dialect, status, topic.as_deref(), limit, out).await,
        Command::Outbox(OutboxCommand::Requeue(args)) => {
            outbox_requeue(&pool, dialect, args, out).await
        }
        Command::Archive(args) => archive(&pool, args, out).await,
        Command::Record(RecordCommand::Show { key, biz_type }) => {
            record_show(&pool, &key, biz_type.as_deref(), out).await
        }
    };
    pool.close().await;
    result
}

/// How results are printed.
#[derive(Clone, Copy)]
struct Out {
    json: bool,
}

impl Out {
    fn emit<T: Serialize>(self, value: &T, text: impl FnOnce() -> String) -> Result<(), Fail> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(value)?);
        } else {
            print!("{}", text());
        }
        Ok(())
    }
}

/// The URL with its password hidden, for messages.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (auth, host) = match rest.split_once('@') {
        Some((a, h)) if !a.contains('/') => (a, h),
        _ => return url.to_string(),
    };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => format!("{scheme}://{auth}@{host}"),
    }
}

async fn connect(url: &str, timeout: Duration) -> Result<AnyPool, Fail> {
    sqlx::any::install_default_drivers();
    let shown = redact(url);
    let cannot = |e: String| Fail {
        code: 3,
        msg: format!("cannot connect to {shown}: {e}"),
    };
    // One direct attempt first: a refused connection or a bad URL fails at
    // once, where a pool would keep retrying until its time-out.
    match tokio::time::timeout(timeout, AnyConnection::connect(url)).await {
        Err(_) => return Err(cannot(format!("no answer within {}", human(timeout)))),
        Ok(Err(e)) => return Err(cannot(e.to_string())),
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
        }
    }
    AnyPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(timeout)
        .after_connect(|conn, _| {
            Box::pin(async move {
                if conn.backend_name() == "SQLite" {
                    sqlx::query("PRAGMA busy_timeout = 30000")
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(())
            })
        })
        .connect(url)
        .await
        .map_err(|e| cannot(e.to_string()))
}

/// A statement written with `?` placeholders in `dialect` (PostgreSQL gets
/// `$1, $2, …`). Only for statements without `?` inside string literals.
fn sql(dialect: Dialect, text: &str) -> sqlx::AssertSqlSafe<String> {
    if dialect != Dialect::Postgres {
        return sqlx::AssertSqlSafe(text.to_string());
    }
    let mut out = String::with_capacity(text.len() + 8);
    let mut n = 0;
    for c in text.chars() {
        if c == '?' {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(c);
        }
    }
    sqlx::AssertSqlSafe(out)
}

fn dialect_name(d: Dialect) -> &'static str {
    match d {
        Dialect::Postgres => "postgres",
        Dialect::MySql => "mysql",
        Dialect::Sqlite => "sqlite",
    }
}

/// SQL for "now" in `d`, in the format its timestamp columns use (MariaDB:
/// UTC, whatever the session's time zone).
fn now_sql(d: Dialect) -> &'static str {
    match d {
        Dialect::Postgres => "now()",
        Dialect::MySql => "UTC_TIMESTAMP(6)",
        Dialect::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
    }
}

/// A timestamp column as text, `YYYY-MM-DD HH:MM:SS.ffffff` (UTC on
/// PostgreSQL; the stored value elsewhere, which idem writes in UTC).
fn ts_text(d: Dialect, col: &str) -> String {
    match d {
        Dialect::Postgres => {
            format!("to_char({col} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')")
        }
        Dialect::MySql => format!("DATE_FORMAT({col}, '%Y-%m-%d %H:%i:%s.%f')"),
        Dialect::Sqlite => format!("CAST({col} AS TEXT)"),
    }
}

// ---------------------------------------------------------------- migrate

#[derive(Serialize)]
struct MigrateReport {
    dialect: &'static str,
    database: String,
    created: Vec<&'static str>,
    already_present: Vec<&'static str>,
    /// The schema version the tables are at now.
    schema_version: i64,
}

async fn table_exists(pool: &AnyPool, table: &str) -> bool {
    let q = format!("SELECT COUNT(*) FROM {table} WHERE 1 = 0");
    sqlx::query(sqlx::AssertSqlSafe(q))
        .fetch_one(pool)
        .await
        .is_ok()
}

async fn migrate(pool: &AnyPool, dialect: Dialect, url: &str, out: Out) -> Result<(), Fail> {
    let mut before = Vec::new();
    for t in TABLES {
        before.push(table_exists(pool, t).await);
    }
    idem_runtime::migrate(pool).await?;
    let mut report = MigrateReport {
        dialect: dialect_name(dialect),
        database: redact(url),
        created: Vec::new(),
        already_present: Vec::new(),
        schema_version: idem_runtime::SCHEMA_VERSION,
    };
    for (t, existed) in TABLES.into_iter().zip(before) {
        if existed {
            report.already_present.push(t);
        } else {
            report.created.push(t);
        }
    }
    out.emit(&report, || {
        let mut s = format!("migrated {} ({})\n", report.database, report.dialect);
        let list = |v: &[&str]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        s += &format!("  created:         {}\n", list(&report.created));
        s += &format!("  already present: {}\n", list(&report.already_present));
        s += &format!(
            "  schema version:  {}\n  (missing indexes were created too; older tables were upgraded in place)\n",
            report.schema_version
        );
        s
    })
}

// ---------------------------------------------------------------- outbox stats

#[derive(Serialize, Default, Clone)]
struct TopicStats {
    topic: String,
    pending: i64,
    success: i64,
    failed: i64,
    total: i64,
    /// Seconds since the oldest pending message was enqueued (none pending: null).
    oldest_pending_age_secs: Option<f64>,
}

#[derive(Serialize)]
struct StatsReport {
    topics: Vec<TopicStats>,
    totals: TopicStats,
}

async fn outbox_stats(
    pool: &AnyPool,
    d: Dialect,
    topic: Option<&str>,
    out: Out,
) -> Result<(), Fail> {
    let filter = if topic.is_some() {
        " WHERE topic = ?"
    } else {
        ""
    };
    let q =
        format!("SELECT topic, status, COUNT(*) FROM idem_outbox{filter} GROUP BY topic, status");
    let mut query = sqlx::query(sql(d, &q));
    if let Some(t) = topic {
        query = query.bind(t);
    }
    let mut by_topic: BTreeMap<String, TopicStats> = BTreeMap::new();
    for row in query.fetch_all(pool).await? {
        let t: String = row.try_get(0)?;
        let status: String = row.try_get(1)?;
        let n: i64 = row.try_get(2)?;
        let e = by_topic.entry(t.clone()).or_insert_with(|| TopicStats {
            topic: t,
            ..TopicStats::default()
        });
        match status.as_str() {
            "pending" => e.pending += n,
            "success" => e.success += n,
            "failed" => e.failed += n,
            _ => {}
        }
        e.total += n;
    }
    let age = match d {
        Dialect::Postgres => {
            "CAST(EXTRACT(EPOCH FROM now() - MIN(created_at)) AS DOUBLE PRECISION)"
        }
        Dialect::MySql => "TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) / 1e6",
        Dialect::Sqlite => {
            "CAST((julianday('now') - julianday(MIN(created_at))) * 86400.0 AS REAL)"
        }
    };
    let and = if topic.is_some() {
        " AND topic = ?"
    } else {
        ""
    };
    let q = format!(
        "SELECT topic, {age} FROM idem_outbox WHERE status = 'pending'{and} GROUP BY topic"
    );
    let mut query = sqlx::query(sql(d, &q));
    if let Some(t) = topic {
        query = query.bind(t);
    }
    for row in query.fetch_all(pool).await? {
        let t: String = row.try_get(0)?;
        let secs: Option<f64> = row.try_get(1)?;
        if let Some(e) = by_topic.get_mut(&t) {
            e.oldest_pending_age_secs = secs.map(|s| s.max(0.0));
        }
    }
    let topics: Vec<TopicStats> = by_topic.into_values().collect();
    let mut totals = TopicStats {
        topic: "(all)".into(),
        ..TopicStats::default()
    };
    for t in &topics {
        totals.pending += t.pending;
        totals.success += t.success;
        totals.failed += t.failed;
        totals.total += t.total;
        totals.oldest_pending_age_secs =
            match (totals.oldest_pending_age_secs, t.oldest_pending_age_secs) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
    }
    let report = StatsReport { topics, totals };
    out.emit(&report, || {
        if report.topics.is_empty() {
            return "no outbox messages\n".into();
        }
        let row = |t: &TopicStats| {
            vec![
                t.topic.clone(),
                t.pending.to_string(),
                t.success.to_string(),
                t.failed.to_string(),
                t.total.to_string(),
                t.oldest_pending_age_secs
                    .map(|s| human(Duration::from_secs_f64(s)))
                    .unwrap_or_else(|| "-".into()),
            ]
        };
        let mut rows: Vec<Vec<String>> = report.topics.iter().map(row).collect();
        rows.push(row(&report.totals));
        table(
            &[
                "TOPIC",
                "PENDING",
                "SUCCESS",
                "FAILED",
                "TOTAL",
                "OLDEST PENDING",
            ],
            &rows,
        )
    })
}

// ---------------------------------------------------------------- outbox list

#[derive(Serialize)]
struct Message {
    id: i64,
    topic: String,
    msg_id: String,
    status: String,
    attempts: i64,
    last_error: Option<String>,
    updated_at: String,
}

fn message_columns(d: Dialect) -> String {
    format!(
        "id, topic, msg_id, status, attempts, last_error, {}",
        ts_text(d, "updated_at")
    )
}

fn message(row: &AnyRow) -> Result<Message, sqlx::Error> {
    Ok(Message {
        id: row.try_get(0)?,
        topic: row.try_get(1)?,
        msg_id: row.try_get(2)?,
        status: row.try_get(3)?,
        attempts: row.try_get(4)?,
        last_error: row.try_get(5)?,
        updated_at: row.try_get(6)?,
    })
}

fn messages_table(messages: &[Message]) -> String {
    let rows: Vec<Vec<String>> = messages
        .iter()
        .map(|m| {
            vec![
                m.id.to_string(),
                m.topic.clone(),
                m.msg_id.clone(),
                m.status.clone(),
                m.attempts.to_string(),
                m.updated_at.clone(),
                shorten(m.last_error.as_deref().unwrap_or("-"), 60),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "TOPIC",
            "MSG_ID",
            "STATUS",
            "ATTEMPTS",
            "UPDATED_AT",
            "LAST_ERROR",
        ],
        &rows,
    )
}

async fn outbox_list(
    pool: &AnyPool,
    d: Dialect,
    status: StatusArg,
    topic: Option<&str>,
    limit: i64,
    out: Out,
) -> Result<(), Fail> {
    if limit < 1 {
        return Err(Fail::usage("--limit must be at least 1"));
    }
    let and = if topic.is_some() {
        " AND topic = ?"
    } else {
        ""
    };
    let q = format!(
        "SELECT {} FROM idem_outbox WHERE status = ?{and} ORDER BY id LIMIT ?",
        message_columns(d)
    );
    let mut query = sqlx::query(sql(d, &q)).bind(status.as_str());
    if let Some(t) = topic {
        query = query.bind(t);
    }
    let rows = query.bind(limit).fetch_all(pool).await?;
    let messages = rows.iter().map(message).collect::<Result<Vec<_>, _>>()?;
    out.emit(&messages, || {
        if messages.is_empty() {
            format!("no {} messages\n", status.as_str())
        } else {
            let mut s = messages_table(&messages);
            if messages.len() as i64 == limit {
                s += &format!("(first {limit}; raise --limit to see more)\n");
            }
            s
        }
    })
}

// ---------------------------------------------------------------- outbox requeue

#[derive(Serialize)]
struct RequeueReport {
    dry_run: bool,
    /// Messages set back to pending (dry run: that would be).
    requeued: u64,
    messages: Vec<Message>,
}

async fn outbox_requeue(
    pool: &AnyPool,
    d: Dialect,
    args: RequeueArgs,
    out: Out,
) -> Result<(), Fail> {
    let t = &args.target;
    let filter = if t.id.is_some() {
        " AND id = ?"
    } else if t.topic.is_some() {
        " AND topic = ?"
    } else if t.all_failed {
        ""
    } else {
        return Err(Fail::usage(
            "choose what to requeue: --id, --topic or --all-failed",
        ));
    };
    let lock = if d == Dialect::Sqlite {
        ""
    } else {
        " FOR UPDATE"
    };
    let q = format!(
        "SELECT {} FROM idem_outbox WHERE status = 'failed'{filter} ORDER BY id{lock}",
        message_columns(d)
    );
    // SQLite: take the write lock up front (`Backend::begin` runs `BEGIN
    // IMMEDIATE` there), so the rows read are the rows changed; elsewhere
    // the SELECT … FOR UPDATE locks them. `Backend::begin` also leaves no
    // transaction open on the pool if this future is dropped mid-BEGIN.
    let mut tx = <sqlx::Any as idem_runtime::Backend>::begin(pool).await?;
    let mut query = sqlx::query(sql(d, &q));
    if let Some(id) = t.id {
        query = query.bind(id);
    } else if let Some(topic) = &t.topic {
        query = query.bind(topic.as_str());
    }
    let rows = query.fetch_all(&mut *tx).await?;
    let messages = rows.iter().map(message).collect::<Result<Vec<_>, _>>()?;
    let mut requeued = 0u64;
    if args.dry_run {
        requeued = messages.len() as u64;
        tx.rollback().await?;
    } else {
        let prefixed = match d {
            Dialect::MySql => "CONCAT('requeued: ', COALESCE(last_error, ''))",
            _ => "'requeued: ' || COALESCE(last_error, '')",
        };
        let now = now_sql(d);
        for chunk in messages.chunks(CHUNK) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let q = format!(
                "UPDATE idem_outbox SET status = 'pending', attempts = 0, next_attempt_at = {now}, \
                 lease_owner = NULL, locked_until = NULL, last_error = {prefixed}, updated_at = {now} \
                 WHERE status = 'failed' AND id IN ({marks})"
            );
            let mut query = sqlx::query(sql(d, &q));
            for m in chunk {
                query = query.bind(m.id);
            }
            requeued += query.execute(&mut *tx).await?.rows_affected();
        }
        tx.commit().await?;
    }
    if let (Some(id), true) = (t.id, messages.is_empty()) {
        // Say why nothing happened.
        let status: Option<String> =
            sqlx::query_scalar(sql(d, "SELECT status FROM idem_outbox WHERE id = ?"))
                .bind(id)
                .fetch_optional(pool)
                .await?;
        match status {
            Some(s) => eprintln!("idem: message {id} is {s}, not failed: nothing to requeue"),
            None => eprintln!("idem: no outbox message with id {id}"),
        }
    }
    let report = RequeueReport {
        dry_run: args.dry_run,
        requeued,
        messages,
    };
    out.emit(&report, || {
        let mut s = String::new();
        if !report.messages.is_empty() {
            s += &messages_table(&report.messages);
        }
        if report.dry_run {
            s += &format!(
                "dry run: {} failed message(s) would be requeued; nothing changed\n",
                report.requeued
            );
        } else {
            s += &format!(
                "requeued {} failed message(s) (now pending, attempts reset)\n",
                report.requeued
            );
        }
        s
    })
}

// ---------------------------------------------------------------- archive

#[derive(Serialize)]
struct ArchiveOutput {
    #[serde(flatten)]
    report: ArchiveReport,
    elapsed_secs: f64,
}

async fn archive(pool: &AnyPool, args: ArchiveArgs, out: Out) -> Result<(), Fail> {
    if args.batch == 0 || args.batch > 10_000 {
        return Err(Fail::usage("--batch must be between 1 and 10000"));
    }
    let archiver = Archiver::new(pool.clone())
        .batch_size(args.batch)
        .outbox_retention(args.outbox_retention)
        .pause(args.pause);
    let bar = if out.json || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{spinner} archiving [{elapsed}] {msg}") {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(100));
        bar
    };
    bar.set_message("records 0, outbox 0, batches 0");
    let start = Instant::now();
    let result = archiver
        .run_once(|r| {
            bar.set_message(format!(
                "records {}, outbox {}, batches {}",
                r.records, r.outbox, r.batches
            ));
        })
        .await;
    bar.finish_and_clear();
    let report = result?;
    let output = ArchiveOutput {
        report,
        elapsed_secs: start.elapsed().as_secs_f64(),
    };
    out.emit(&output, || {
        format!(
            "archived {} record(s) to idem_record_history and {} outbox message(s) to \
             idem_outbox_history in {} batch(es), {}\n",
            report.records,
            report.outbox,
            report.batches,
            human(start.elapsed())
        )
    })
}

// ---------------------------------------------------------------- record show

async fn record_show(
    pool: &AnyPool,
    key: &str,
    biz_type: Option<&str>,
    out: Out,
) -> Result<(), Fail> {
    let found: Vec<RecordInfo> = find_record(pool, key, biz_type).await?;
    if found.is_empty() {
        let of_type = biz_type
            .map(|t| format!(" and biz_type {t:?}"))
            .unwrap_or_default();
        return Err(Fail {
            code: 1,
            msg: format!(
                "no idempotency record with key {key:?}{of_type} (neither online nor archived)"
            ),
        });
    }
    let text = || {
        let mut s = String::new();
        if found.len() > 1 {
            s += &format!(
                "{} records of this key, one per biz_type (choose one with --biz-type):\n",
                found.len()
            );
        }
        for (i, r) in found.iter().enumerate() {
            if i > 0 {
                s += "\n";
            }
            s += &record_text(r);
        }
        s
    };
    match found.as_slice() {
        [one] => out.emit(one, text),
        several => out.emit(&several, text),
    }
}

fn record_text(r: &RecordInfo) -> String {
    let rows = [
        ("key", r.key.clone()),
        ("biz_type", r.biz_type.clone()),
        ("biz_no", r.biz_no.clone()),
        ("fingerprint", r.fingerprint.clone()),
        ("result", r.result.clone().unwrap_or_else(|| "-".into())),
        ("create_time", r.create_time.clone()),
        ("expire_time", r.expire_time.clone()),
        (
            "archived",
            if r.archived { "yes" } else { "no (online)" }.into(),
        ),
        (
            "archived_at",
            r.archived_at.clone().unwrap_or_else(|| "-".into()),
        ),
    ];
    rows.iter().map(|(k, v)| format!("{k:<12} {v}\n")).collect()
}

// ---------------------------------------------------------------- helpers

/// Columns padded to their widest cell, two spaces apart.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s += c;
            } else {
                s += &format!("{c:<w$}  ");
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut s = line(headers.to_vec());
    for row in rows {
        s += &line(row.iter().map(String::as_str).collect());
    }
    s
}

/// At most `max` characters, on one line.
fn shorten(s: &str, max: usize) -> String {
    let one_line = s.replace(['\n', '\r'], " ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        one_line.chars().take(max - 1).collect::<String>() + "…"
    }
}

/// A duration for people: `1d 2h`, `6m 42s`, `0s`.
fn human(d: Duration) -> String {
    let secs = d.as_secs();
    let parts = [
        (secs / 86_400, "d"),
        (secs / 3_600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    let out: Vec<String> = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    if out.is_empty() {
        format!("{}ms", d.subsec_millis())
    } else {
        out.join(" ")
    }
}

/// `7d`, `12h`, `30m`, `45s`, `500ms`, combinations like `1d12h`, or a plain
/// number of seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(n) = s.parse::<u64>() {
        return Ok(Duration::from_secs(n));
    }
    let bad = || format!("invalid duration {s:?}: use e.g. 7d, 12h, 30m, 45s, 500ms or 1d12h");
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let part = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3_600)),
            "d" => Duration::from_secs(n.saturating_mul(86_400)),
            _ => return Err(bad()),
        };
        total = total.saturating_add(part);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("1d12h"), Ok(Duration::from_secs(36 * 3_600)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("7x").is_err());
        assert!(parse_duration("d").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn placeholders_renumber_for_postgres_only() {
        assert_eq!(
            sql(Dialect::Postgres, "a = ? AND b IN (?, ?)").0,
            "a = $1 AND b IN ($2, $3)"
        );
        assert_eq!(sql(Dialect::MySql, "a = ?").0, "a = ?");
    }

    #[test]
    fn urls_hide_passwords() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("mysql://root@h/db"), "mysql://root@h/db");
        assert_eq!(redact("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

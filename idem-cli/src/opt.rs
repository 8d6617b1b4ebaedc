//! The command line: clap definitions only.

use clap::{Args, Parser, Subcommand, ValueEnum};
use idem_runtime::outbox::Status;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "idem",
    version,
    about = "Operate idem's tables: migrate, inspect and repair the outbox, archive, look up records",
    long_about = "Operate idem's tables: create them, inspect the outbox (local message table), \
        requeue, discard or retry its messages and pause its topics, list the relays and \
        consumers alive, move expired records and finished messages to the history tables, and \
        look up an idempotency record by key, or an HTTP request by its Idempotency-Key and \
        caller, online or archived.\n\n\
        One binary serves PostgreSQL (postgres://…), MariaDB / MySQL (mysql://…) and SQLite \
        (sqlite://path?mode=rwc).\n\n\
        Durations are numbers each with a unit (ms, s, m, h, d): 500ms, 30s, 7d, 1d12h or \
        \"1d 12h\"; a bare number is refused.\n\n\
        Exit codes: 0 success, 1 not found (record show, outbox show, request), 2 usage or \
        configuration error, 3 database error.",
    propagate_version = true
)]
pub(crate) struct Cli {
    /// Database URL: postgres://user:pass@host/db, mysql://user:pass@host/db or
    /// sqlite://path.db (add ?mode=rwc to create the file). An empty
    /// DATABASE_URL counts as unset.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub(crate) database_url: Option<String>,

    /// Print JSON (one document on stdout) instead of a table.
    #[arg(long, global = true)]
    pub(crate) json: bool,

    /// Give up connecting after this long (e.g. 10s).
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    pub(crate) connect_timeout: Duration,

    /// The database is reached through a connection pooler in transaction mode
    /// (pgbouncer pool_mode=transaction): prepare every statement unnamed and run
    /// each inside a transaction. Same as IDEM_TRANSACTION_POOLING=1.
    #[arg(long, global = true)]
    pub(crate) transaction_pooling: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
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
    /// Serve the operator's web console, /metrics and /health.
    #[command(
        long_about = "Serve the operator's web console over HTTP: the outbox by topic and status \
            with a live chart of the backlog and deliveries, the relays holding leases, dead \
            letters with their reasons and a requeue behind a preview and a confirmation, record \
            lookup (online or archived) and the archiving state; plus /metrics (Prometheus text \
            format: the outbox gauges per topic, read from the database at each scrape) and \
            /health. Read-only unless a write token is given (prefer IDEM_WRITE_TOKEN to the \
            flag, which other users can see in the process list). Stops on Ctrl-C or SIGTERM."
    )]
    Serve(ServeArgs),
    /// List the relays and consumers alive, with their last heartbeat.
    #[command(
        long_about = "List the processes registered in idem_process: the outbox relays (their id \
            is the lease owner their messages show) and the consumers, by kind, name and id, \
            with their host, pid, start and last heartbeat (its age by the database's clock: a \
            process that stopped without unregistering shows a growing age)."
    )]
    Processes,
    /// Show what the HTTP Idempotency-Key layer stored for one request.
    #[command(
        long_about = "Show the record the HTTP Idempotency-Key layer (idem_runtime::http) keeps for \
            the request CALLER sent with Idempotency-Key KEY: the record key it derives (http: \
            and a SHA-256 of the caller and the key), its scope, whether the request is in \
            flight or answered, the answer's status and body, when it was first seen and when \
            it expires; online, else archived. Exits with code 1 if there is none."
    )]
    Request(RequestArgs),
}

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// Address to listen on. The default serves this machine only; to serve others, put the
    /// console behind a TLS proxy.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub(crate) listen: std::net::SocketAddr,
    /// Allow requeues to whoever signs in with this token (at least 16 characters, not easy to
    /// guess: make one with `openssl rand -hex 16`). Without it the console is read-only.
    /// After 5 wrong tokens in a row from one address (an IPv6 client's /64), its attempts are
    /// refused (429) for a back-off that doubles with each further wrong one, up to 5 minutes.
    /// A flood of addresses locks no one else out: at most 4,096 clients are remembered, and
    /// when they are all taken the network holding the most of them (an IPv4 /24, then /16,
    /// /8; an IPv6 /56, then /48, /40, /32) becomes one client, whose back-off covers every
    /// address of it, so that a client of another network keeps its own, and its right token
    /// is checked; an address that signed in with the right token is never merged.
    #[arg(long, env = "IDEM_WRITE_TOKEN", hide_env_values = true)]
    pub(crate) write_token: Option<String>,
    /// The outbox retention the archiving page measures eligibility with (as `idem archive
    /// --outbox-retention`).
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    pub(crate) outbox_retention: Duration,
    /// Database connections the console may hold.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) connections: u32,
    /// Serve the pages under this path (such as /ops/idem), for a reverse proxy that forwards
    /// that path unchanged. Default: the root.
    #[arg(long, default_value = "/")]
    pub(crate) path_prefix: String,
    /// Also answer to this host name (repeatable): a name at any port, or name:port at that
    /// port only. By default the console answers to IP addresses and localhost only, and
    /// with 421 to any other Host, so that a page of another site cannot read it through a
    /// name of its own pointed at it (DNS rebinding): give the names users and scrapers
    /// reach it at.
    #[arg(long = "allowed-host", value_name = "HOST")]
    pub(crate) allowed_hosts: Vec<String>,
    /// The origin users reach the console at through a reverse proxy, such as
    /// https://console.example.com (repeatable): sign-ins and requeues from it are accepted
    /// although the proxy replaced Host (nginx's default), and its host is answered.
    #[arg(long = "public-origin", value_name = "ORIGIN")]
    pub(crate) public_origins: Vec<String>,
    /// How the console logs, on stderr, filtered by RUST_LOG (default: info): text, or json
    /// (one object per line, for a log collector). Each requeue is logged with what it asked
    /// for and how many messages it requeued.
    #[arg(long, env = "IDEM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
}

#[derive(Subcommand, Debug)]
pub(crate) enum OutboxCommand {
    /// Messages per topic and status, and the age of each topic's oldest pending message.
    Stats {
        /// Only this topic, exactly as stored: spaces are part of a topic ("pay " is not
        /// "pay"; the tables quote such a topic). Empty: every topic.
        #[arg(long)]
        topic: Option<String>,
    },
    /// List messages of one status (default: failed, i.e. dead-lettered), oldest first.
    List {
        /// Which messages.
        #[arg(long, value_enum, default_value_t = StatusArg::Failed)]
        status: StatusArg,
        /// Only this topic, exactly as stored: spaces are part of a topic ("pay " is not
        /// "pay"; the tables quote such a topic). Empty: every topic.
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
    /// Show one message in full (online or archived) and its attempt log.
    #[command(
        long_about = "Show outbox message ID with every column (payload and headers included), \
            online (idem_outbox) or, once archived or discarded, from idem_outbox_history, and \
            its attempt log: the failed attempts the relays recorded (retry, dead) and the \
            operator's actions (discarded, retry_now, requeued), oldest first, the last 32 at \
            most. With --json: {\"message\": …, \"attempts\": […]}. Exits with code 1 if there \
            is no such message."
    )]
    Show {
        /// The message's id.
        id: i64,
    },
    /// Give up on dead or pending messages: move them to the history as failed, never delivered.
    #[command(
        long_about = "Discard messages: each dead-lettered (failed) or pending message among IDs \
            moves to idem_outbox_history now, with status failed and last_error \"discarded: \
            REASON\", and its attempt log records who discarded it and why. A discarded message \
            is never delivered, and no requeue brings it back. A message a relay is delivering \
            right now (its lease is live) is refused; delivered and unknown ids are skipped. \
            Each message changes in a short transaction of its own. Exits with 0 when the \
            command ran, whatever it refused: the output lists what was done, refused and \
            skipped."
    )]
    Discard {
        /// The messages' ids (at most 1000).
        #[arg(required = true, num_args = 1..)]
        ids: Vec<i64>,
        /// Why (1 to 500 characters): the message's log and last error keep it.
        #[arg(long)]
        reason: String,
    },
    /// Make messages due now: dead ones back to pending (attempts reset), waiting ones at once.
    #[command(
        long_about = "Make messages due now: a dead-lettered (failed) message goes back to pending \
            with attempts 0 (as requeue does); a pending message waiting for its next attempt \
            becomes due at once, keeping its attempts. A message a relay is delivering right \
            now is refused; delivered and unknown ids are skipped. Each message's attempt log \
            records the action."
    )]
    RetryNow {
        /// The messages' ids (at most 1000).
        #[arg(required = true, num_args = 1..)]
        ids: Vec<i64>,
    },
    /// Pause a topic: relays stop claiming its messages until it is resumed.
    #[command(
        long_about = "Pause TOPIC: the relays stop claiming its pending messages (those they hold \
            already are finished) until `idem outbox resume TOPIC`. Producers go on enqueueing. \
            Pausing a paused topic changes nothing (its first reason stays). The topic is \
            matched exactly, spaces included."
    )]
    Pause {
        /// The topic, exactly as its messages have it.
        topic: String,
        /// Why (at most 500 characters), shown by `idem outbox paused`.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume a paused topic: relays claim its messages again.
    Resume {
        /// The topic, exactly as paused.
        topic: String,
    },
    /// List the paused topics, with who paused them, when and why.
    Paused,
}

#[derive(Args, Debug)]
pub(crate) struct RequestArgs {
    /// The Idempotency-Key the client sent, unquoted (e.g. 8e03978e-40d5).
    #[arg(long)]
    pub(crate) key: String,
    /// The caller, as the service's identity function names it (e.g. its API key's id).
    #[arg(long)]
    pub(crate) caller: String,
}

#[derive(Args, Debug)]
pub(crate) struct RequeueArgs {
    #[command(flatten)]
    pub(crate) target: RequeueTarget,
    /// Print the messages that would be requeued; change nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
pub(crate) struct RequeueTarget {
    /// The failed message with this id.
    #[arg(long)]
    pub(crate) id: Option<i64>,
    /// Every failed message of this topic, exactly as stored: spaces are part of a topic
    /// ("pay " is not "pay").
    #[arg(long)]
    pub(crate) topic: Option<String>,
    /// Every failed message.
    #[arg(long)]
    pub(crate) all_failed: bool,
}

#[derive(Args, Debug)]
pub(crate) struct ArchiveArgs {
    /// Rows per batch and table (1–10000); smaller batches hold locks for less time.
    #[arg(long, default_value_t = 1000)]
    pub(crate) batch: u32,
    /// Finished outbox messages last updated longer ago than this move (e.g. 7d, 12h, 30m, 0s).
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    pub(crate) outbox_retention: Duration,
    /// Sleep between batches, to stay gentle on a busy database (e.g. 50ms).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub(crate) pause: Duration,
}

#[derive(Subcommand, Debug)]
pub(crate) enum RecordCommand {
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

/// `idem serve --log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Lines for a person.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum StatusArg {
    Pending,
    Success,
    Failed,
}

impl StatusArg {
    /// The runtime's status.
    pub(crate) fn status(self) -> Status {
        match self {
            StatusArg::Pending => Status::Pending,
            StatusArg::Success => Status::Success,
            StatusArg::Failed => Status::Failed,
        }
    }
}

/// A flag's duration, in idem's one grammar (`idem_runtime::duration`):
/// `7d`, `12h`, `30m`, `45s`, `500ms`, combinations like `1d12h` or
/// `1d 12h`; a bare number is refused, saying which unit to add.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    idem_runtime::duration::parse(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("1d12h"), Ok(Duration::from_secs(36 * 3_600)));
        assert_eq!(
            parse_duration("1d 12h"),
            Ok(Duration::from_secs(36 * 3_600))
        );
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        // A bare number: which unit was meant is a guess, so it says which to add.
        let e = parse_duration("90").unwrap_err();
        assert!(e.contains("`90s`") && e.contains("`90ms`"), "{e}");
        assert!(parse_duration("7x").is_err());
        assert!(parse_duration("d").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

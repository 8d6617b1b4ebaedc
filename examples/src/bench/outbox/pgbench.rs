//! The pgbench side: the same statements as the relay and the handler,
//! run by `pgbench -M prepared` on copies of the tables, and checked.

use super::{BoxError, LEASE_SECS, ORDER_OFFSET, PGB_COUPON, PGB_LEDGER, PGB_OUTBOX, Setup};
use crate::bench::cpu::{Cpu, per_message_us};
use idem_runtime::Dialect;
use sqlx::PgPool;

// ---- the pgbench side ----------------------------------------------------------------

/// One pgbench run.
#[derive(Debug, Clone)]
pub struct PgbenchRun {
    /// Messages per second (script-1 transactions × messages in each).
    pub rate: f64,
    /// Messages deducted (script-1 transactions × messages in each).
    pub messages: i64,
    /// Script-2 transactions (claims).
    pub claims: i64,
    /// Mean latency of script 1 (one message) and script 2 (one claim).
    pub message_latency_ms: f64,
    pub claim_latency_ms: f64,
    /// CPU per message: pgbench's (the client) and the rest of the
    /// machine's (the server, on an otherwise idle machine), µs.
    pub client_us: f64,
    pub server_us: f64,
}

/// Replaces the numbered placeholders `$1`, `$2`, … of `sql` by pgbench
/// variables, highest number first (so `$1` does not eat into `$10`).
fn pgbench_vars(sql: &str, vars: &[&str]) -> String {
    let mut s = sql.to_string();
    for (i, v) in vars.iter().enumerate().rev() {
        s = s.replace(&format!("${}", i + 1), &format!(":{v}"));
    }
    s
}

/// The relay's and the handler's PostgreSQL statements, on the pgbench
/// tables, with pgbench variables for their parameters: script 1 deducts
/// `per_tx` coupons in one transaction (1: the per-message design; 64: a
/// `commit_batch(64)` relay's batch), script 2 is one claim of `:batch`
/// messages.
///
/// Client `c` of `n` deducts, in its `k`-th transaction, the coupons
/// `((k - 1) * n + c) * per_tx + 1 ..= + per_tx`: its own, never another
/// client's.
pub fn pgbench_scripts(per_tx: u32) -> (String, String) {
    let pg = Dialect::Postgres;
    let state = pg.state_sql(PGB_COUPON, "id", "status", None);
    let lock = pgbench_vars(&state.lock, &["id"]);
    let transition = pgbench_vars(&state.transition, &["to", "id", "from"]);
    // idem-runtime's `outbox_success` (not public), first in the handler's
    // transaction as there, on the pgbench outbox table. Its lease fence
    // (topic, owner, attempt) is left out: pgbench's rows are not claimed,
    // and the fence only adds filters on the row the id already found.
    let success = format!(
        "UPDATE {PGB_OUTBOX} SET status = 'success', \
         updated_at = now(), lease_owner = NULL, locked_until = NULL \
         WHERE id = :id AND status = 'pending'"
    );
    let mut message = format!(
        "-- {per_tx} message(s) in one transaction: the handlers' calls\n\
         \\set k :k + 1\n\
         \\set base ((:k - 1) * :nclients + :client_id) * {per_tx}\n\
         BEGIN;\n"
    );
    for j in 1..=per_tx {
        message.push_str(&format!(
            "\\set id :base + {j}\n\
             \\set order :id + {ORDER_OFFSET}\n\
             {success};\n\
             {lock};\n\
             INSERT INTO {PGB_LEDGER} (coupon_id, order_id, msg_id) VALUES (:id, :order, :id);\n\
             {transition};\n"
        ));
    }
    message.push_str("COMMIT;\n");
    let claim = pgbench_vars(
        &pg.claim_sql(1, false).claim,
        &["owner", "lease", "topic", "batch", "offset"],
    )
    .replace("idem_outbox", PGB_OUTBOX);
    let claim = format!(
        "-- one claim of up to :batch messages\nBEGIN;\nSET LOCAL synchronous_commit = off;\nSET LOCAL jit = off;\n{claim};\nCOMMIT;\n"
    );
    (message, claim)
}

/// Recreates the pgbench side's data: `rows` coupons and pending messages,
/// ids 1..=rows, due in id order.
async fn pgbench_fill(admin: &PgPool, rows: i64, topic: &str) -> Result<(), BoxError> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "TRUNCATE {PGB_LEDGER}, {PGB_COUPON}, {PGB_OUTBOX}"
    )))
    .execute(admin)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {PGB_COUPON} (id, status) SELECT g, 'UNUSED' FROM generate_series(1, $1::bigint) g"
    )))
    .bind(rows)
    .execute(admin)
    .await?;
    // Distinct due times in id order, as enqueue's `now()` gives them (equal
    // times would make every claim sort the whole queue on `id`).
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {PGB_OUTBOX} (id, topic, msg_id, payload, next_attempt_at, created_at) \
         SELECT g, $2, g::text, \
           format('{{\"msg_id\":\"%s\",\"coupon_id\":%s,\"order_id\":%s}}', g, g, g + {ORDER_OFFSET}), \
           now() - interval '1 hour' + g * interval '1 microsecond', now() \
         FROM generate_series(1, $1::bigint) g"
    )))
    .bind(rows)
    .bind(topic)
    .execute(admin)
    .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "VACUUM ANALYZE {PGB_COUPON}, {PGB_LEDGER}, {PGB_OUTBOX}"
    )))
    .execute(admin)
    .await?;
    Ok(())
}

/// Transactions, tps and mean latency (ms) of the `n`-th `SQL script`
/// section of pgbench's report:
///
/// ```text
///  - 12345 transactions (98.4% of total, tps = 1234.567890)
///  - number of failed transactions: 0 (0.000%)
///  - latency average = 9.876 ms
/// ```
fn script_stats(out: &str, n: usize) -> Option<(i64, f64, f64)> {
    let section = out.split("SQL script ").nth(n)?;
    let line = section.lines().find(|l| l.contains(" transactions ("))?;
    let count = line
        .trim()
        .trim_start_matches("- ")
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    let tps = line
        .split("tps = ")
        .nth(1)?
        .trim_end_matches(')')
        .trim()
        .parse()
        .ok()?;
    let latency = section
        .lines()
        .find_map(|l| l.split("latency average = ").nth(1))?
        .trim_end_matches("ms")
        .trim()
        .parse()
        .ok()?;
    Some((count, tps, latency))
}

/// One pgbench run of `seconds` on `rows` fresh coupons and messages,
/// `per_tx` messages per transaction, checked in the database afterwards;
/// `dir` holds its scripts. A run whose clients ran past the rows is void:
/// it says so and runs again on twice the rows (up to three times).
pub async fn pgbench_run(
    admin: &PgPool,
    url: &str,
    opts: &Setup,
    seconds: u32,
    rows: i64,
    per_tx: u32,
    dir: &std::path::Path,
) -> Result<PgbenchRun, BoxError> {
    let mut rows = rows;
    for _ in 0..3 {
        match run_once(admin, url, opts, seconds, rows, per_tx, dir).await? {
            Ok(run) => return Ok(run),
            Err(RanOut { beyond }) => {
                println!(
                    "  pgbench run void: a client ran past the {rows} coupons created for it \
                     ({beyond} ledger rows beyond them); run again with {}",
                    rows * 2
                );
                rows *= 2;
            }
        }
    }
    Err(format!("pgbench ran past its {rows} coupons three times").into())
}

/// A run whose clients ran past the coupons created for it: `beyond`
/// ledger rows name coupons that do not exist.
struct RanOut {
    beyond: i64,
}

async fn run_once(
    admin: &PgPool,
    url: &str,
    opts: &Setup,
    seconds: u32,
    rows: i64,
    per_tx: u32,
    dir: &std::path::Path,
) -> Result<Result<PgbenchRun, RanOut>, BoxError> {
    let c = opts.concurrency;
    // A batched relay claims what its handlers' batches take at once
    // (`batch_size` = handlers × batch), as `idem_run` sets it.
    let claim_batch = match per_tx {
        1 => opts.batch,
        k => c as u32 * k,
    };
    let topic = format!("bench-outbox.pgbench.{}", std::process::id());
    pgbench_fill(admin, rows, &topic).await?;
    let (message, claim) = pgbench_scripts(per_tx);
    let (mpath, cpath) = (dir.join("message.sql"), dir.join("claim.sql"));
    std::fs::write(&mpath, message)?;
    std::fs::write(&cpath, claim)?;
    let cpu = Cpu::now();
    let out = tokio::process::Command::new(&opts.pgbench)
        .args(["-n", "-M", "prepared"])
        .args(["-c", &c.to_string(), "-j", &c.min(2).to_string()])
        .args(["-T", &seconds.to_string()])
        .args(["-D", "k=0", "-D", &format!("nclients={c}")])
        .args(["-D", "from=UNUSED", "-D", "to=USED"])
        .args([
            "-D",
            "owner=pgbench-relay",
            "-D",
            &format!("lease={LEASE_SECS}"),
        ])
        .args([
            "-D",
            &format!("topic={topic}"),
            "-D",
            &format!("batch={claim_batch}"),
            "-D",
            "offset=0",
        ])
        .arg("-f")
        .arg(format!(
            "{}@{}",
            mpath.display(),
            (claim_batch / per_tx).max(1)
        ))
        .arg("-f")
        .arg(format!("{}@1", cpath.display()))
        .arg(url)
        .output()
        .await
        .map_err(|e| format!("cannot run {}: {e}", opts.pgbench))?;
    let cpu = Cpu::now().since(&cpu);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || stderr.contains("aborted") {
        return Err(format!("pgbench failed ({}):\n{stdout}\n{stderr}", out.status).into());
    }
    let (Some((txs, tps, message_latency_ms)), Some((claims, _, claim_latency_ms))) =
        (script_stats(&stdout, 1), script_stats(&stdout, 2))
    else {
        return Err(format!("cannot parse pgbench's output:\n{stdout}").into());
    };
    let (messages, rate) = (txs * i64::from(per_tx), tps * f64::from(per_tx));
    if !stdout.contains("(without initial connection time)") {
        return Err(format!("no tps line in pgbench's output:\n{stdout}").into());
    }

    // Verify: every script-1 transaction deducted its own coupons, once.
    let (used, ledger, twice, success, beyond): (i64, i64, i64, i64, i64) =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT \
               (SELECT COUNT(*) FROM {PGB_COUPON} WHERE status = 'USED'), \
               (SELECT COUNT(*) FROM {PGB_LEDGER}), \
               (SELECT COUNT(*) FROM (SELECT coupon_id FROM {PGB_LEDGER} \
                  GROUP BY coupon_id HAVING COUNT(*) > 1) d), \
               (SELECT COUNT(*) FROM {PGB_OUTBOX} WHERE status = 'success'), \
               (SELECT COUNT(*) FROM {PGB_LEDGER} WHERE coupon_id > $1)"
        )))
        .bind(rows)
        .fetch_one(admin)
        .await?;
    // Each client walks its own coupon ids, so one client running ahead of
    // the others (a busy machine schedules them unevenly) walks past the
    // rows created while the total is still below them: its ledger rows
    // then have no coupon to mark. The run is void, not failed.
    if beyond > 0 {
        return Ok(Err(RanOut { beyond }));
    }
    // A client's transaction in flight when `-T` runs out may commit without
    // pgbench counting it: at most one per client beyond the count.
    let consistent = used == ledger && ledger == success && twice == 0;
    let in_flight = c as i64 * i64::from(per_tx);
    if !consistent || used < messages || used > messages + in_flight {
        return Err(format!(
            "pgbench run: VERIFY FAILED: {messages} messages counted, but {used} coupons \
             USED, {ledger} ledger rows ({twice} coupons twice), {success} messages success"
        )
        .into());
    }
    Ok(Ok(PgbenchRun {
        rate,
        messages,
        claims,
        message_latency_ms,
        claim_latency_ms,
        client_us: per_message_us(cpu.children, messages),
        server_us: per_message_us(cpu.rest(), messages),
    }))
}

/// Rows to create for a pgbench run: what the rate seen so far needs, with
/// room to spare.
pub fn pgbench_rows(expected_rate: f64, seconds: u32, opts: &Setup) -> i64 {
    ((expected_rate * f64::from(seconds) * 1.6) as i64 + 2000).max(opts.messages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_pgbench_variables() {
        assert_eq!(
            pgbench_vars(
                "SELECT $1, $2, $10",
                &["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]
            ),
            "SELECT :a, :b, :j"
        );
    }

    #[test]
    fn reads_a_script_section() {
        let out = "SQL script 1: message.sql\n - weight: 16\n - 12345 transactions (98.4% of total, tps = 1234.567890)\n - latency average = 9.876 ms\nSQL script 2: claim.sql\n - 12 transactions (1.6% of total, tps = 20.5)\n - latency average = 1.5 ms\n";
        assert_eq!(script_stats(out, 1), Some((12345, 1234.56789, 9.876)));
        assert_eq!(script_stats(out, 2), Some((12, 20.5, 1.5)));
        assert_eq!(script_stats(out, 3), None);
    }
}

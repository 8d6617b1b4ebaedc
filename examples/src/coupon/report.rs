//! The output: the two handlers side by side, as text or one JSON object.

use super::drain::Report;
use serde::Serialize;
use std::collections::BTreeMap;

/// The fault-free reference drain: the same workload, no acknowledgement
/// lost.
#[derive(Serialize)]
pub(super) struct Reference {
    pub(super) fault_version_elapsed_s: f64,
    pub(super) idempotent_elapsed_s: f64,
}

/// The whole run, as printed and as the `--json` object.
#[derive(Serialize)]
pub(super) struct Summary {
    pub(super) database: String,
    pub(super) orders: i64,
    pub(super) relays: usize,
    pub(super) handlers_per_relay: usize,
    pub(super) lost_ack_rate: f64,
    pub(super) redelivery_rate: f64,
    /// `None` with `--no-reference` (or no faults).
    pub(super) reference: Option<Reference>,
    /// The `#[idempotent]` drain time under faults over the reference's.
    pub(super) drain_ratio: Option<f64>,
    /// The README's target for the `#[idempotent]` handler: the drain
    /// under faults at most 1.5× the fault-free one, no message over 2
    /// attempts without a handler failure, nothing left pending.
    pub(super) target_met: bool,
    /// SQLite: the `testing` hook's lost acknowledgements by kind of
    /// commit (call, claim, renew, settle, success), whole process.
    pub(super) lost_acks_by_kind: Option<BTreeMap<String, u64>>,
    pub(super) fault_version: Report,
    pub(super) idempotent: Report,
    /// The `#[idempotent]` handler neither double-deducted nor lost.
    pub(super) ok: bool,
}

pub(super) fn print_summary(s: &Summary, location: &str) {
    let (f, i) = (&s.fault_version, &s.idempotent);
    println!();
    println!("coupon deduction at peak on {} ({location})", s.database);
    println!(
        "{} orders and {} producer retries, {} relays x {} handlers, {:.0}% of COMMIT \
         acknowledgements lost",
        s.orders,
        f.messages - s.orders,
        s.relays,
        s.handlers_per_relay,
        s.lost_ack_rate * 100.0
    );
    println!();
    let row = |label: &str, a: String, b: String| println!("{label:<40}{a:>16}{b:>16}");
    row("", "fault version".into(), "#[idempotent]".into());
    let num = |label: &str, a: i64, b: i64| row(label, a.to_string(), b.to_string());
    let cnt = |label: &str, a: u64, b: u64| row(label, a.to_string(), b.to_string());
    num(
        "messages (orders + producer retries)",
        f.messages,
        i.messages,
    );
    num(
        "deliveries (attempts in the outbox)",
        f.deliveries,
        i.deliveries,
    );
    cnt("  handler runs", f.handler_runs, i.handler_runs);
    cnt("  executed", f.executed, i.executed);
    cnt("  duplicate (already deducted)", f.duplicates, i.duplicates);
    cnt("  failed, retried by the relay", f.retried, i.retried);
    cnt(
        "  failed after the commit landed",
        f.failed_after_commit,
        i.failed_after_commit,
    );
    cnt("lost acks (injected faults)", f.lost_acks, i.lost_acks);
    cnt(
        "  on the handler's COMMIT",
        f.lost_acks_on_handler_commit,
        i.lost_acks_on_handler_commit,
    );
    cnt(
        "  on the relays' claims of messages",
        f.lost_acks_on_claims,
        i.lost_acks_on_claims,
    );
    cnt(
        "  elsewhere (idle claims, bookkeeping)",
        f.lost_acks
            .saturating_sub(f.lost_acks_on_handler_commit + f.lost_acks_on_claims),
        i.lost_acks
            .saturating_sub(i.lost_acks_on_handler_commit + i.lost_acks_on_claims),
    );
    cnt(
        "messages of lost claims recovered",
        f.recovered,
        i.recovered,
    );
    cnt("re-claimed after a lease expired", f.reclaimed, i.reclaimed);
    num("ledger rows", f.ledger_rows, i.ledger_rows);
    num(
        "double deductions",
        f.double_deductions,
        i.double_deductions,
    );
    num("lost deductions", f.lost_deductions, i.lost_deductions);
    num("dead-lettered", f.dead_lettered, i.dead_lettered);
    if f.pending + i.pending > 0 {
        num("still pending (timed out)", f.pending, i.pending);
    }
    row(
        "throughput (messages/s)",
        format!("{:.0}", f.messages_per_s),
        format!("{:.0}", i.messages_per_s),
    );
    row(
        "elapsed",
        format!("{:.1} s", f.elapsed_s),
        format!("{:.1} s", i.elapsed_s),
    );
    if let Some(r) = &s.reference {
        row(
            "elapsed without lost acks (reference)",
            format!("{:.1} s", r.fault_version_elapsed_s),
            format!("{:.1} s", r.idempotent_elapsed_s),
        );
        row(
            "  ratio",
            format!("{:.2}x", f.elapsed_s / r.fault_version_elapsed_s),
            format!("{:.2}x", i.elapsed_s / r.idempotent_elapsed_s),
        );
    }
    println!();
    let histogram = |r: &Report| {
        r.attempts_histogram
            .iter()
            .map(|(a, n)| format!("{a}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("attempts (attempts: messages)");
    println!("  fault version   {}", histogram(f));
    println!("  #[idempotent]   {}", histogram(i));
    if let Some(kinds) = &s.lost_acks_by_kind {
        let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!(
            "testing hook, lost acks by commit (both handlers): {}",
            kinds.join(", ")
        );
    }
    println!();

    if f.double_deductions > 0 {
        println!(
            "fault version: {} of {} coupons deducted more than once. Two deliveries of one \
             order ran at the same time; both read UNUSED outside the transaction, and the \
             row lock only serialized the two deductions.",
            f.double_deductions, f.orders
        );
    } else {
        println!(
            "fault version: no double deduction this time. The race is still there (the \
             state is read outside the transaction); no two deliveries of an order overlapped."
        );
    }
    if f.lost_acks_on_handler_commit > 0 {
        println!(
            "               {} deductions committed and lost their acknowledgement. The \
             message was marked success in the same transaction, so the relay's bookkeeping \
             found it delivered and did not retry it.",
            f.lost_acks_on_handler_commit
        );
    }
    if s.ok {
        println!(
            "#[idempotent]: every coupon deducted exactly once under {} lost acknowledgements; \
             {} deliveries found the coupon already USED and answered Duplicate.",
            i.lost_acks, i.duplicates
        );
    } else {
        println!(
            "#[idempotent]: FAILED: {} double deductions, {} lost deductions.",
            i.double_deductions, i.lost_deductions
        );
    }
    let ratio = s
        .drain_ratio
        .map_or_else(|| "no reference run".to_owned(), |r| format!("{r:.2}x"));
    println!(
        "#[idempotent] target ({}): drain under lost acks at most 1.5x the fault-free one \
         ({ratio}); {} messages over 2 attempts without a handler failure.",
        if s.target_met { "met" } else { "MISSED" },
        i.over_two_attempts_without_failure
    );
    if f.pending + i.pending > 0 {
        println!(
            "The run stopped after --timeout with messages still pending: their coupons count \
             as lost deductions."
        );
    }
    // The database stays as the run left it, for the operator's console.
    let url = if location.starts_with('/') {
        format!("sqlite://{location}")
    } else {
        "$DATABASE_URL".to_string()
    };
    println!();
    println!(
        "Its outbox in the web console: cargo run -p idem-cli -- --database-url {url} serve, \
         then open http://127.0.0.1:8080/"
    );
}

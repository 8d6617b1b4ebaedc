//! idem through pgbouncer in transaction mode (`pool_mode = transaction`,
//! 3 server connections under a pool of 12), with
//! [`pooler::transaction_mode`] on: the three strategies raced with
//! duplicates, a relay drain, the archiver, the operator's queries and
//! `migrate` twice give double 0, lost 0, no errors and no dead letters,
//! counted in the database through a direct connection. The control, the
//! same workloads without the mode, is `clusters/pgbouncer_control.rs`.
//!
//! A test binary of its own: the mode is process-wide, turned on once for
//! this process, and every other test binary runs without it.

#[path = "common"]
mod common {
    pub(crate) mod coupons;
    pub(crate) mod pgbouncer;
}
use common::pgbouncer::*;

/// The mode, on for this whole process before any test's first statement.
fn mode_on() {
    pooler::transaction_mode(true);
    assert!(pooler::transaction_mode_enabled());
    assert!(!pooler::persistent());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strategies_raced_through_pgbouncer_one_effect_each() {
    mode_on();
    let Some(rig) = rig("pgbouncer strategies").await else {
        return;
    };
    let figures = race_strategies(&rig, 24, 4).await;
    for (strategy, f) in &figures {
        eprintln!(
            "pgbouncer (transaction mode, idem's mode on) {strategy}: calls={} double={} lost={} undone={} errors={:?} {:?}",
            f.calls, f.double, f.lost, f.undone, f.errors, f.samples
        );
    }
    for (strategy, f) in &figures {
        assert_eq!(f.calls, 24 * 4, "{strategy}");
        assert_eq!((f.double, f.lost, f.undone), (0, 0, 0), "{strategy}: {f:?}");
        assert!(
            f.errors.is_empty(),
            "{strategy}: {f:?}\n{}",
            rig.bouncer.log_tail(20)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_drains_through_pgbouncer_without_dead_letters() {
    mode_on();
    let Some(rig) = rig("pgbouncer relay").await else {
        return;
    };
    // Produced through pgbouncer too: enqueue in the producer's transaction.
    let d = relay_drain(&rig, &rig.pool, 250, Duration::from_secs(60)).await;
    eprintln!(
        "pgbouncer (transaction mode, idem's mode on) relay: messages={} success={} dead={} pending={} \
         double={} lost={} executed={} duplicates={} in {:.1} s",
        d.messages,
        d.success,
        d.dead,
        d.pending,
        d.double,
        d.lost,
        d.executed,
        d.duplicates,
        d.secs
    );
    assert_eq!(d.messages, 300);
    assert_eq!(d.ended, None, "the relay ended on its own");
    assert_eq!(
        (d.dead, d.pending),
        (0, 0),
        "{:?}\n{}",
        d.reason,
        rig.bouncer.log_tail(20)
    );
    assert_eq!(d.success, 300);
    assert_eq!((d.double, d.lost), (0, 0));
    assert_eq!((d.executed, d.duplicates), (250, 50));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_twice_archiver_and_admin_through_pgbouncer() {
    mode_on();
    let Some(rig) = rig("pgbouncer migrate").await else {
        return;
    };
    let errors = migrate_twice(&rig).await;
    assert!(errors.is_empty(), "migrate through pgbouncer: {errors:?}");
    let version: i64 = sqlx::query_scalar("SELECT MAX(version) FROM idem_schema_version")
        .fetch_one(&rig.direct)
        .await
        .unwrap();
    assert_eq!(version, idem_runtime::SCHEMA_VERSION);
    let tables = idem_runtime::existing_tables(&rig.pool).await.unwrap();
    assert!(tables.iter().all(|(_, there)| *there), "{tables:?}");

    // Records that expire at once, archived by an archiver through
    // pgbouncer, then found in the history through it.
    let base = ids(8);
    for n in 0..8 {
        let msg = Notice {
            msg_id: format!("bnc-a-{}", base + n),
            user_id: base + n,
        };
        assert!(notify_short(&rig.pool, &msg).await.unwrap().is_executed());
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let archived = idem_runtime::archive::Archiver::new(rig.pool.clone())
        .outbox_retention(Duration::from_secs(3650 * 86_400))
        .run_once(|_| {})
        .await
        .unwrap();
    let mut in_history = 0;
    for n in 0..8 {
        let key = format!("bnc-notice-short:bnc-a-{}", base + n);
        let online: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM idem_record WHERE idempotency_key = $1")
                .bind(&key)
                .fetch_one(&rig.direct)
                .await
                .unwrap();
        let history: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM idem_record_history WHERE idempotency_key = $1",
        )
        .bind(&key)
        .fetch_one(&rig.direct)
        .await
        .unwrap();
        assert_eq!((online, history), (0, 1), "{key}");
        in_history += history;
        let found = idem_runtime::archive::find_record(&rig.pool, &key, Some("bnc_notice_short"))
            .await
            .unwrap();
        assert!(found.len() == 1 && found[0].archived, "{key}: {found:?}");
    }

    // The operator's queries: a dead letter requeued, through pgbouncer.
    let topic = format!("bnc.admin.{}", ids(1));
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO idem_outbox (topic, msg_id, payload, status, attempts, last_error) \
         VALUES ($1, 'dead', '{}', 'failed', 3, 'boom') RETURNING id",
    )
    .bind(&topic)
    .fetch_one(&rig.direct)
    .await
    .unwrap();
    use idem_runtime::outbox::admin;
    let stats = admin::stats(&rig.pool, Some(&topic)).await.unwrap();
    assert_eq!(
        (stats.topics.len(), stats.totals.failed),
        (1, 1),
        "{stats:?}"
    );
    let listed = admin::list(
        &rig.pool,
        idem_runtime::outbox::Status::Failed,
        Some(&topic),
        10,
    )
    .await
    .unwrap();
    assert_eq!(listed.len(), 1);
    let what = admin::Requeue {
        target: admin::RequeueTarget::Id(id),
        max_id: None,
        dry_run: false,
    };
    let report = admin::requeue(&rig.pool, &what).await.unwrap();
    assert_eq!(report.requeued, 1, "{report:?}");
    assert_eq!(
        admin::status_of(&rig.pool, id).await.unwrap().as_deref(),
        Some("pending")
    );
    eprintln!(
        "pgbouncer (transaction mode, idem's mode on) migrate: 2 runs, 0 errors; archiver: {archived:?}, \
         {in_history}/8 of this test's records in history; admin: stats, list, requeue, status ok"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_statement_of_the_handlers_own_is_a_config_error_in_the_mode() {
    mode_on();
    let Some(rig) = rig("pgbouncer named statement").await else {
        return;
    };
    // One server connection, two clients: the second client's first named
    // statement (`sqlx_s_1`) meets the first client's there.
    let Some(one) = PgBouncer::start("pgbouncer named statement", PoolMode::Transaction, 1) else {
        return;
    };
    let url = one.url();
    let client = || {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
    };
    let (a, b) = (client().await.unwrap(), client().await.unwrap());
    let base = ids(2);
    let first = Notice {
        msg_id: format!("bnc-named-{base}"),
        user_id: base,
    };
    assert!(notify_named(&a, &first).await.unwrap().is_executed());
    let second = Notice {
        msg_id: format!("bnc-named-{}", base + 1),
        user_id: base + 1,
    };
    let err = notify_named(&b, &second).await.unwrap_err();
    eprintln!("pgbouncer, idem's mode on, a named statement in the body: {err}");
    let Error::Config { reason } = &err else {
        panic!("{err:?}")
    };
    assert!(!err.is_retryable());
    for part in ["42P05", "pgbouncer", "one of yours", ".persistent(false)"] {
        assert!(reason.contains(part), "{part} missing: {reason}");
    }
    // Nothing of the failed call was written: neither its effect nor its record.
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_t_bnc_notice WHERE msg_id = $1")
        .bind(&second.msg_id)
        .fetch_one(&rig.direct)
        .await
        .unwrap();
    let records: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM idem_record WHERE idempotency_key = $1")
            .bind(format!("bnc-notice-named:{}", second.msg_id))
            .fetch_one(&rig.direct)
            .await
            .unwrap();
    assert_eq!((rows, records), (0, 0));
}

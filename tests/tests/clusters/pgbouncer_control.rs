//! The control of `pgbouncer.rs`: the same workloads through pgbouncer in
//! transaction mode, with idem's transaction-pooling mode OFF (this
//! process never turns it on), show the failure the mode fixes: named
//! prepared statements collide across server connections (`42P05`,
//! `26000`, `08P01`), or another client's statement runs in place of
//! idem's. Each failure idem recognises is an `Error::Config` that names
//! the pooler and the option, on calls, on the relay's dead letters and on
//! `migrate`.

use crate::common::pgbouncer::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_mode_pgbouncer_in_transaction_mode_breaks_idem() {
    pooler::transaction_mode(false);
    assert!(pooler::persistent());
    let Some(rig) = rig("pgbouncer control").await else {
        return;
    };

    let figures = race_strategies(&rig, 24, 4).await;
    let mut calls = Figures::default();
    for (strategy, f) in figures {
        eprintln!(
            "pgbouncer (transaction mode) WITHOUT idem's mode {strategy}: calls={} double={} lost={} undone={} errors={:?}",
            f.calls, f.double, f.lost, f.undone, f.errors
        );
        calls.absorb(f);
    }
    for (kind, sample) in &calls.samples {
        eprintln!("  e.g. {kind}: {sample}");
    }

    // Produced directly (the producer is not under test), drained through
    // pgbouncer.
    let d = relay_drain(&rig, &rig.direct, 250, Duration::from_secs(10)).await;
    eprintln!(
        "pgbouncer (transaction mode) WITHOUT idem's mode relay: messages={} success={} dead={} pending={} \
         double={} lost={} in {:.1} s; {} dead letters name the pooler, by kind {:?}; first: {:?}; relay ended: {:?}",
        d.messages,
        d.success,
        d.dead,
        d.pending,
        d.double,
        d.lost,
        d.secs,
        d.config_dead,
        d.dead_by_kind,
        d.reason,
        d.ended
    );

    let migrate = migrate_twice(&rig).await;
    eprintln!(
        "pgbouncer (transaction mode) WITHOUT idem's mode migrate twice: {} of 2 runs failed: {:?}",
        migrate.len(),
        migrate.iter().map(ToString::to_string).collect::<Vec<_>>()
    );

    // The failure shows: errors, wrong answers, dead letters or effects
    // missing or doubled.
    let total = calls.failures() + d.failures() + migrate.len();
    assert!(
        total > 0,
        "pgbouncer in transaction mode broke nothing: is it in front of the pool?"
    );
    // And where idem can tell, it says so: a Config error naming the
    // pooler and the option, on calls, on the relay's dead letters, on
    // migrate.
    let named =
        |s: &str| s.contains("pgbouncer") && s.contains("idem_runtime::pooler::transaction_mode");
    let config_calls = calls.names_the_pooler();
    // The relay names it either on its dead letters or, when its schema
    // check before the first claim meets the collision, by refusing to
    // start (which of the two depends on which server connection
    // pgbouncer hands that check).
    let config_relay = d.config_dead > 0
        || d.ended
            .as_deref()
            .is_some_and(|e| e.starts_with("Failed(") && named(e));
    let config_migrate = migrate
        .iter()
        .any(|e| matches!(e, Error::Config { .. }) && named(&e.to_string()));
    eprintln!(
        "pgbouncer control: {total} failures; Config naming the pooler on calls={config_calls} \
         relay={config_relay} migrate={config_migrate}"
    );
    assert!(config_calls, "calls: {:?}", calls.samples);
    assert!(config_relay, "relay: {:?}, ended: {:?}", d.reason, d.ended);
    assert!(config_migrate, "migrate: {migrate:?}");
}

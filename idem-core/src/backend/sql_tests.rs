//! The renderers, on every dialect.

use super::*;
use crate::backend::Dialect;

#[test]
fn state_sql_binds_the_key_column_when_asked() {
    let pg = Dialect::Postgres.state_sql("coupon", "id", "status", Some("used_by"));
    assert_eq!(
        pg.lock,
        r#"SELECT "status"::text, "used_by"::text FROM "coupon" WHERE "id" = $1 FOR UPDATE"#
    );
    assert_eq!(
        pg.transition,
        r#"UPDATE "coupon" SET "status" = $1, "used_by" = $2 WHERE "id" = $3 AND "status" = $4"#
    );
    assert!(pg.with_key);
    let my = Dialect::MySql.state_sql("shop.coupon", "id", "status", None);
    assert_eq!(
        my.lock,
        "SELECT CAST(`status` AS CHAR), CAST(NULL AS CHAR) FROM `shop`.`coupon` WHERE `id` = ? FOR UPDATE"
    );
    assert_eq!(
        my.transition,
        "UPDATE `shop`.`coupon` SET `status` = ? WHERE `id` = ? AND `status` = ?"
    );
    let lite = Dialect::Sqlite.state_sql("coupon", "id", "status", None);
    assert!(!lite.lock.contains("FOR UPDATE"), "{}", lite.lock);
    assert!(!lite.with_key);
    assert_eq!(
        lite.lock,
        r#"SELECT CAST("status" AS TEXT), CAST(NULL AS TEXT) FROM "coupon" WHERE "id" = ?"#
    );
    let lite = Dialect::Sqlite.state_sql("coupon", "id", "status", Some("k"));
    assert_eq!(
        lite.transition,
        r#"UPDATE "coupon" SET "status" = ?, "k" = ? WHERE "id" = ? AND "status" = ?"#
    );
}

#[test]
#[should_panic(expected = "is not a valid SQL identifier")]
fn state_sql_refuses_a_bad_identifier() {
    Dialect::Postgres.state_sql("coupon; DROP TABLE x", "id", "status", None);
}

#[test]
fn quote_quotes_each_part() {
    assert_eq!(quote("coupon", '"'), r#""coupon""#);
    assert_eq!(quote("shop.coupon", '`'), "`shop`.`coupon`");
    assert!(std::panic::catch_unwind(|| quote("a.b.c", '"')).is_err());
    assert!(std::panic::catch_unwind(|| quote("", '"')).is_err());
}

#[test]
fn identifiers_are_idem_syntaxs() {
    assert!(idem_syntax::is_identifier("shop.coupon"));
    assert!(!idem_syntax::is_identifier("a-b"));
    assert!(!idem_syntax::is_identifier(&"x".repeat(64)));
}

#[test]
fn placeholder_lists() {
    let (pg, my) = (Dialect::Postgres.sql(), Dialect::MySql.sql());
    assert_eq!(marks(2), "?, ?");
    assert_eq!(
        pg.render("a = ? AND b IN (?, ?)"),
        "a = $1 AND b IN ($2, $3)"
    );
    assert_eq!(my.render("a = ?"), "a = ?");
}

#[test]
fn claim_sql_numbers_topics_after_owner_and_lease() {
    let pg = Dialect::Postgres.claim_sql(2, false).claim;
    assert!(pg.contains("SET lease_owner = $1"), "{pg}");
    assert!(pg.contains("make_interval(secs => $2::float8)"), "{pg}");
    assert!(pg.contains("topic IN ($3, $4)"), "{pg}");
    assert!(
        pg.contains("LIMIT $5 OFFSET $6 FOR UPDATE SKIP LOCKED"),
        "{pg}"
    );
    assert!(pg.contains("RETURNING o.id"), "{pg}");
    assert!(
        pg.ends_with("o.attempts, o.ordering_key, o.headers, EXTRACT(EPOCH FROM now() - o.created_at)::float8, c.prev"),
        "{pg}"
    );
    // No topics yet: one placeholder, so the statement still parses.
    assert!(
        Dialect::Postgres
            .claim_sql(0, false)
            .claim
            .contains("topic IN ($3)")
    );
    let my = Dialect::MySql.claim_sql(3, false).claim;
    // MariaDB picks without locking, then locks the picked rows by id.
    assert!(my.starts_with("SELECT id FROM"), "{my}");
    assert!(my.contains("topic IN (?, ?, ?)"), "{my}");
    assert!(my.ends_with("LIMIT ? OFFSET ?"), "{my}");
    let Claim::LockThenLease {
        lock: Some(lock), ..
    } = Dialect::MySql.sql().claim
    else {
        panic!("MariaDB locks the picked rows by id");
    };
    let lock = lock("?, ?");
    assert!(
        lock.contains("WHERE id IN (?, ?) AND status = 'pending'"),
        "{lock}"
    );
    assert!(lock.ends_with("FOR UPDATE SKIP LOCKED"), "{lock}");
    let lite = Dialect::Sqlite.claim_sql(1, false).claim;
    assert!(lite.contains("topic IN (?)"), "{lite}");
    assert!(
        lite.ends_with("ORDER BY next_attempt_at, id LIMIT ? OFFSET ?"),
        "{lite}"
    );
}

#[test]
fn every_claim_takes_only_the_heads_of_ordering_keys() {
    for d in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite] {
        let go_on = d.claim_sql(2, false).claim;
        assert!(!go_on.contains("/*order*/"), "{go_on}");
        assert!(
            go_on.contains("q.ordering_key IS NULL OR (NOT EXISTS"),
            "{go_on}"
        );
        assert!(go_on.contains("p.id < q.id OR p.locked_until >"), "{go_on}");
        assert!(!go_on.contains("d.status = 'failed'"), "{go_on}");
        let hold = d.claim_sql(2, true).claim;
        assert!(
            hold.contains("d.status = 'failed' AND d.id < q.id"),
            "{hold}"
        );
    }
}

#[test]
fn every_claim_passes_paused_topics_over() {
    for d in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite] {
        let claim = d.claim_sql(2, false).claim;
        assert!(!claim.contains(PAUSE_GUARD), "{claim}");
        assert_eq!(claim.matches(PAUSE_GUARD_SQL).count(), 1, "{claim}");
        // Without the ordering guard (the control `Unordered`) too.
        assert!(d.unordered_claim_sql(2).contains(PAUSE_GUARD_SQL));
    }
    // What wakes a pushed relay early is no paused message either.
    let next_due = Dialect::Postgres.claim_sql(2, false).next_due.unwrap();
    assert_eq!(next_due.matches(PAUSE_GUARD_SQL).count(), 2, "{next_due}");
}

#[test]
fn the_attempt_log_keeps_its_newest_rows() {
    for d in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite] {
        let sql = d.sql();
        assert!(
            sql.attempt_log
                .starts_with("INSERT INTO idem_outbox_attempt")
        );
        assert!(sql.attempt_trim.contains("ORDER BY id DESC LIMIT 1 OFFSET"));
        assert!(sql.process_beat.contains("heartbeat_at"));
    }
}

#[test]
fn claim_recovery_reads_back_the_claims_own_rows() {
    for d in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite] {
        let sql = d.sql();
        let text = sql.render(&(sql.claim_recover)("?, ?"));
        assert!(text.contains("status = 'pending'"), "{text}");
        assert!(text.contains("locked_until >"), "{text}");
        let owner = if sql.numbered {
            "lease_owner = $1"
        } else {
            "lease_owner = ?"
        };
        assert!(text.contains(owner), "{text}");
        let ids = if sql.numbered {
            "id IN ($2, $3)"
        } else {
            "id IN (?, ?)"
        };
        assert!(text.ends_with(ids), "{text}");
    }
}

#[test]
fn postgres_claims_in_one_statement() {
    assert!(matches!(
        Dialect::Postgres.sql().claim,
        Claim::Returning { .. }
    ));
    for d in [Dialect::Postgres, Dialect::Sqlite] {
        assert!(matches!(d.sql().renew, Renew::Update(_)), "{d:?}");
    }
    let Claim::LockThenLease { lease, .. } = Dialect::Sqlite.sql().claim else {
        panic!("SQLite's RETURNING cannot tell the previous lease owner");
    };
    assert!(lease("?").ends_with("WHERE id IN (?)"));
    let my = Dialect::MySql.sql();
    let Claim::LockThenLease { lease, .. } = my.claim else {
        panic!("MariaDB has no UPDATE … RETURNING");
    };
    assert!(lease("?, ?").ends_with("WHERE id IN (?, ?)"));
    assert!(my.micros && my.insert_id == InsertId::LastInsertId);
}

/// The claim's own `BEGIN` on PostgreSQL: its commit asynchronous, and no
/// JIT compilation, whose cost grows with the pending rows' estimate while
/// the claim itself stays a probe of the pending index.
#[test]
fn postgres_claims_without_jit_and_without_waiting_for_the_flush() {
    let Claim::Returning {
        begin: Some(begin), ..
    } = Dialect::Postgres.sql().claim
    else {
        panic!("PostgreSQL's claim opens its own transaction");
    };
    let settings: Vec<&str> = begin.split("; ").collect();
    assert_eq!(
        settings,
        [
            "BEGIN",
            "SET LOCAL synchronous_commit = off",
            "SET LOCAL jit = off"
        ]
    );
}

#[test]
fn every_dialect_knows_its_name_and_schema() {
    for (d, name) in [
        (Dialect::Postgres, "postgres"),
        (Dialect::MySql, "mysql"),
        (Dialect::Sqlite, "sqlite"),
    ] {
        assert_eq!(d.name(), name);
        assert_eq!(d.sql().dialect, d);
    }
}

#[test]
fn the_folded_fenced_update_is_the_fenced_update() {
    // PostgreSQL folds the fenced outbox update into the state machine's
    // locking read: the same update, its binds first, the entity id last.
    let pg = Dialect::Postgres.state_sql("coupon", "id", "status", Some("used_by"));
    let folded = pg.lock_marked.expect("PostgreSQL folds");
    let fenced = Dialect::Postgres.sql().outbox_success;
    let with = format!("WITH idem_mark AS ({fenced} RETURNING 1)");
    assert!(folded.starts_with(&with), "{folded}");
    assert!(
        folded.ends_with(
            r#"(SELECT "status"::text AS s, "used_by"::text AS k FROM "coupon" WHERE "id" = $5 FOR UPDATE) AS e ON true"#
        ),
        "{folded}"
    );
    for d in [Dialect::MySql, Dialect::Sqlite] {
        assert!(
            d.state_sql("coupon", "id", "status", None)
                .lock_marked
                .is_none()
        );
    }
}

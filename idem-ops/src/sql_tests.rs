//! The archiver's and the operator's statements, on every dialect.

use idem_core::Dialect;

#[test]
fn archive_counts_have_the_condition_of_their_batches() {
    for d in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite] {
        for stmts in [&super::of(d).archive_record, &super::of(d).archive_outbox] {
            let (_, select) = stmts.select.split_once(" WHERE ").expect("a condition");
            let (condition, _) = select.split_once(" ORDER BY ").expect("an order");
            let (head, counted) = stmts.count.split_once(" WHERE ").expect("a condition");
            assert!(
                head.starts_with("SELECT COUNT(*) FROM idem_"),
                "{d:?}: {head}"
            );
            assert_eq!(counted, condition, "{d:?}");
        }
    }
}

#[test]
fn admin_pieces_bind_like_the_archiver() {
    for d in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite] {
        let admin = &super::of(d).admin;
        assert_eq!(admin.ago.matches('?').count(), 1, "{d:?}");
        assert!(
            super::of(d)
                .archive_outbox
                .count
                .contains(&super::of(d).render(admin.ago)),
            "{d:?}"
        );
        assert!((admin.age_secs)("updated_at").contains("updated_at"));
        assert!((admin.floor_int)("x").contains('x'));
        assert!((admin.ts_text)("c").contains('c'));
    }
}

#[test]
fn placeholder_lists() {
    let (pg, my, lite) = (
        super::of(Dialect::Postgres),
        super::of(Dialect::MySql),
        super::of(Dialect::Sqlite),
    );
    assert_eq!(pg.placeholders(3, 3), "$3, $4, $5");
    assert_eq!(my.placeholders(3, 3), "?, ?, ?");
    assert_eq!(lite.placeholders(1, 1), "?");
    assert_eq!(pg.placeholders(1, 0), "");
    assert_eq!(super::marks(2), "?, ?");
    assert_eq!(pg.render("a = ?"), "a = $1");
}

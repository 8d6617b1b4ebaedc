//! SQL in two placeholder styles.

use super::handlers::Handler;
use idem_runtime::Dialect;
use sqlx::AssertSqlSafe;

/// The statement `text`, written with `?` placeholders (MariaDB, SQLite),
/// for `dialect`: PostgreSQL numbers its placeholders, `$1, $2, …`. No
/// statement here has a `?` inside a string literal, so renumbering every
/// `?` is safe. Only constant text goes in: the result is safe SQL.
pub fn sql(dialect: Dialect, text: &'static str) -> AssertSqlSafe<String> {
    AssertSqlSafe(placeholders(dialect, text))
}

/// [`sql`] for a statement on one handler's tables: `{t}` stands for the
/// table prefix (`example_fault` or `example_idem`).
pub fn table_sql(dialect: Dialect, h: Handler, text: &'static str) -> AssertSqlSafe<String> {
    AssertSqlSafe(placeholders(dialect, &text.replace("{t}", h.tables())))
}

/// `text` with its `?` placeholders renumbered `$1, $2, …` for
/// PostgreSQL, unchanged for the others.
pub fn placeholders(dialect: Dialect, text: &str) -> String {
    if dialect == Dialect::Postgres {
        idem_syntax::numbered_placeholders(text)
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_numbers_its_placeholders() {
        let q = "UPDATE t SET a = ? WHERE id = ? AND b = ?";
        assert_eq!(
            placeholders(Dialect::Postgres, q),
            "UPDATE t SET a = $1 WHERE id = $2 AND b = $3"
        );
        assert_eq!(placeholders(Dialect::MySql, q), q);
        assert_eq!(placeholders(Dialect::Sqlite, q), q);
    }

    #[test]
    fn table_prefix() {
        assert_eq!(
            table_sql(
                Dialect::Postgres,
                Handler::Idempotent,
                "SELECT id FROM {t}_coupon WHERE id = ?"
            )
            .0,
            "SELECT id FROM example_idem_coupon WHERE id = $1"
        );
    }
}

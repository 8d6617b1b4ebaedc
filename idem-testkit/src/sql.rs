//! One statement text for every dialect.

use idem_runtime::Dialect;

/// A statement written with `?` placeholders, in the given dialect
/// (PostgreSQL gets `$1, $2, …`, through [`idem_syntax::numbered_placeholders`],
/// the rule idem itself uses).
///
/// ```
/// use idem_runtime::Dialect;
/// let q = idem_testkit::sql(Dialect::Postgres, "UPDATE t SET a = ? WHERE id = ?");
/// assert_eq!(q.0, "UPDATE t SET a = $1 WHERE id = $2");
/// let q = idem_testkit::sql(Dialect::MySql, "UPDATE t SET a = ? WHERE id = ?");
/// assert_eq!(q.0, "UPDATE t SET a = ? WHERE id = ?");
/// ```
pub fn sql(dialect: Dialect, text: &'static str) -> sqlx::AssertSqlSafe<String> {
    if dialect != Dialect::Postgres {
        return sqlx::AssertSqlSafe(text.to_string());
    }
    sqlx::AssertSqlSafe(idem_syntax::numbered_placeholders(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_is_numbered_others_untouched() {
        let text = "INSERT INTO t (a, b) VALUES (?, ?)";
        assert_eq!(
            sql(Dialect::Postgres, text).0,
            "INSERT INTO t (a, b) VALUES ($1, $2)"
        );
        assert_eq!(sql(Dialect::Sqlite, text).0, text);
        assert_eq!(sql(Dialect::MySql, text).0, text);
    }
}

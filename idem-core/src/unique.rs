//! Which unique constraint a violation is of (`unique_insert`'s
//! `constraint = "…"`): only the constraint that identifies the action may
//! mean Duplicate; any other unique violation in the body is an error.
//!
//! Each database names the violated constraint differently:
//! - PostgreSQL reports the constraint (or unique index) name in the
//!   error's `constraint` field.
//! - MariaDB and MySQL end the message with `for key 'name'` (MySQL 8:
//!   `'table.name'`); `PRIMARY` for the primary key.
//! - SQLite names no constraint, only the columns: `UNIQUE constraint
//!   failed: table.a, table.b`. A `constraint` written `table.column[, …]`
//!   is compared with that list; a plain name is looked up as a unique
//!   index (`CREATE UNIQUE INDEX name …`) and compared by its columns.

use crate::backend::{Backend, Dialect};
use sqlx::Transaction;
use sqlx::error::DatabaseError;
use std::fmt;

/// The constraint a unique violation reports, as far as its database says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Violated {
    /// A constraint or index name (PostgreSQL, MariaDB/MySQL).
    Name(String),
    /// The columns, `table.column` each (SQLite).
    Columns(Vec<String>),
    /// The database did not say.
    Unknown,
}

impl fmt::Display for Violated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violated::Name(n) => write!(f, "`{n}`"),
            Violated::Columns(c) => write!(f, "the unique columns `{}`", c.join(", ")),
            Violated::Unknown => write!(f, "an unnamed unique constraint"),
        }
    }
}

/// What the violation says about its constraint.
pub(crate) fn violated(dialect: Dialect, err: &dyn DatabaseError) -> Violated {
    match dialect {
        Dialect::Postgres => err
            .constraint()
            .map_or(Violated::Unknown, |c| Violated::Name(c.to_string())),
        Dialect::MySql => mysql_key(err.message()).map_or(Violated::Unknown, Violated::Name),
        Dialect::Sqlite => {
            sqlite_columns(err.message()).map_or(Violated::Unknown, Violated::Columns)
        }
    }
}

/// `Duplicate entry 'v' for key 'name'` → `name`. Read from the end: the
/// duplicate value (the attacker's input, possibly) comes first and may
/// itself contain `for key '…'`.
fn mysql_key(message: &str) -> Option<String> {
    let rest = message.strip_suffix('\'')?;
    let at = rest.rfind(" for key '")?;
    let name = &rest[at + " for key '".len()..];
    (!name.is_empty()).then(|| name.to_string())
}

/// `UNIQUE constraint failed: t.a, t.b` → `["t.a", "t.b"]`.
fn sqlite_columns(message: &str) -> Option<Vec<String>> {
    let list = message.split_once("constraint failed: ")?.1;
    let cols: Vec<String> = list.split(',').map(|c| c.trim().to_string()).collect();
    cols.iter().all(|c| !c.is_empty()).then_some(cols)
}

/// Whether the violation is of `constraint`. On SQLite a plain name is
/// resolved to its unique index's columns on `tx` (after the savepoint
/// was rolled back, so the transaction is usable).
pub(crate) async fn matches<DB: Backend>(
    hit: &Violated,
    constraint: &str,
    tx: &mut Transaction<'_, DB>,
) -> Result<bool, sqlx::Error> {
    Ok(match hit {
        Violated::Unknown => false,
        // MySQL 8 qualifies the key with its table.
        Violated::Name(n) => {
            n == constraint
                || n.rsplit_once('.').is_some_and(|(_, k)| k == constraint)
                || constraint.rsplit_once('.').is_some_and(|(_, k)| k == n)
        }
        Violated::Columns(cols) => {
            let wanted: Vec<String> = if constraint.contains('.') {
                constraint
                    .split(',')
                    .map(|c| c.trim().to_string())
                    .collect()
            } else {
                DB::sqlite_index_columns(tx, constraint).await?
            };
            !wanted.is_empty() && same_columns(&wanted, cols)
        }
    })
}

fn same_columns(a: &[String], b: &[String]) -> bool {
    let norm = |v: &[String]| {
        let mut v: Vec<String> = v.iter().map(|c| c.to_ascii_lowercase()).collect();
        v.sort();
        v
    };
    norm(a) == norm(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_mariadb_key_from_the_end() {
        let m = "Duplicate entry 'x' for key 'uk_payment_serial'";
        assert_eq!(mysql_key(m).as_deref(), Some("uk_payment_serial"));
        let m = "Duplicate entry '42' for key 'payment.uk_payment_serial'";
        assert_eq!(mysql_key(m).as_deref(), Some("payment.uk_payment_serial"));
        // A crafted value that imitates the suffix does not fool it.
        let m = "Duplicate entry 'a' for key 'uk_payment_serial' for key 'uk_other'";
        assert_eq!(mysql_key(m).as_deref(), Some("uk_other"));
        assert_eq!(mysql_key("Duplicate entry 'a'"), None);
    }

    #[test]
    fn reads_the_sqlite_columns() {
        let m = "UNIQUE constraint failed: payment.serial";
        assert_eq!(sqlite_columns(m), Some(vec!["payment.serial".to_string()]));
        let m = "UNIQUE constraint failed: t.a, t.b";
        assert_eq!(
            sqlite_columns(m),
            Some(vec!["t.a".to_string(), "t.b".to_string()])
        );
        assert_eq!(sqlite_columns("database is locked"), None);
    }

    #[test]
    fn compares_column_sets() {
        let v = |s: &[&str]| s.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        assert!(same_columns(&v(&["t.a", "t.b"]), &v(&["t.b", "T.A"])));
        assert!(!same_columns(&v(&["t.a"]), &v(&["t.a", "t.b"])));
    }
}

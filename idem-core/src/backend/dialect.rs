//! The SQL dialects idem speaks. (Each one's statements: `Dialect::sql`,
//! beside them in the backend module.)

/// The SQL dialects idem speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// MariaDB and MySQL.
    MySql,
    /// SQLite.
    Sqlite,
}

impl Dialect {
    /// A short name: `postgres`, `mysql` or `sqlite`.
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::MySql => "mysql",
            Dialect::Sqlite => "sqlite",
        }
    }
}

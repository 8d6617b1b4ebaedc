//! The backend matrix: one test suite, run once per database.

/// Runs a test suite once per backend, each in a module of its own.
///
/// A test file writes its suite once, as a `macro_rules!` macro taking
/// `(module, database, dialect, pool)` that makes `mod module { … }`; this
/// macro invokes it once per backend. `pool` is an expression, its `.await`
/// included, of type `Option<sqlx::Pool<database>>`: `None` when the
/// server is down, and the test returns early (skipped locally, a failure
/// when `CI=true`, see [`unreachable()`](crate::unreachable())).
///
/// ```
/// use idem_runtime::Dialect;
///
/// macro_rules! ping_tests {
///     ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
///         mod $module {
///             use super::*;
///             const D: Dialect = $dialect;
///
///             #[tokio::test]
///             async fn the_database_answers() {
///                 let Some(pool): Option<sqlx::Pool<$db>> = $pool else {
///                     return; // skipped: the server is down
///                 };
///                 sqlx::query(idem_testkit::sql(D, "SELECT 1 WHERE 1 = ?"))
///                     .bind(1_i64)
///                     .execute(&pool)
///                     .await
///                     .expect("select");
///             }
///         }
///     };
/// }
///
/// // `postgres`, `mariadb` and `sqlite`: pools of 16, 16 and 8.
/// idem_testkit::for_each_backend!(ping_tests);
///
/// // Some backends, with pool sizes, a module renamed, `sqlx::Any`.
/// mod small {
///     use super::*;
///     idem_testkit::for_each_backend!(ping_tests; postgres(4), mariadb(4) as mysql, any_sqlite(2));
/// }
/// # fn main() {}
/// ```
///
/// # Backends
///
/// | backend        | module (default) | database         | dialect              | pool of `n` (default `n`)                                     |
/// |----------------|------------------|------------------|----------------------|---------------------------------------------------------------|
/// | `postgres`     | `postgres`       | `sqlx::Postgres` | `Dialect::Postgres`  | [`postgres(n)`](crate::postgres) (16)                         |
/// | `mariadb`      | `mariadb`        | `sqlx::MySql`    | `Dialect::MySql`     | [`mysql(n)`](crate::mysql) (16)                               |
/// | `sqlite`       | `sqlite`         | `sqlx::Sqlite`   | `Dialect::Sqlite`    | `Some(`[`sqlite(n)`](crate::sqlite)`)` (8)                    |
/// | `any_postgres` | `any_postgres`   | `sqlx::Any`      | `Dialect::Postgres`  | [`any`](crate::any)`(&`[`postgres_url()`](crate::postgres_url)`, n)` (16) |
/// | `any_mariadb`  | `any_mariadb`    | `sqlx::Any`      | `Dialect::MySql`     | [`any`](crate::any)`(&`[`mysql_url()`](crate::mysql_url)`, n)` (16)       |
/// | `any_sqlite`   | `any_sqlite`     | `sqlx::Any`      | `Dialect::Sqlite`    | [`any`](crate::any)`(&`[`sqlite_url()`](crate::sqlite_url)`, n)` (8)      |
///
/// `Dialect` is idem-runtime's (`idem_runtime::Dialect`).
///
/// # Forms
///
/// `for_each_backend!(suite)` is `for_each_backend!(suite; postgres,
/// mariadb, sqlite)`. After the `;`, each backend, comma-separated, is
/// written `backend [pool] [as module] [=> (extra, …)]`:
///
/// - `postgres`: the pool of the default size; `postgres(4)`: of 4
///   connections (any expression).
/// - `postgres(|max|)`: the suite sizes each pool itself. Its pool
///   argument is `|max| pool of max`, for a suite matching
///   `|$max:ident| $pool:expr` that writes `let $max = 8; … $pool …`.
/// - `postgres { tokens }`: the pool argument is `tokens`, whatever the
///   suite takes there (a pool per database it names, a URL): only the
///   module, database and dialect come from this macro.
/// - `as mysql`: the module's name, for a suite whose test paths
///   (`file::mysql::a_test`) predate this macro.
/// - `=> (a, b)`: arguments the suite takes after the pool, per backend:
///   `suite!(module, database, dialect, pool, a, b)`.
///
/// ```
/// macro_rules! sized_tests {
///     ($module:ident, $db:ty, $dialect:expr, |$max:ident| $pool:expr, $what:literal) => {
///         mod $module {
///             #[tokio::test]
///             async fn a_pool_of_two() {
///                 let $max = 2;
///                 let Some(pool): Option<sqlx::Pool<$db>> = $pool else { return };
///                 assert_eq!(pool.options().get_max_connections(), 2, $what);
///             }
///         }
///     };
/// }
///
/// idem_testkit::for_each_backend!(sized_tests;
///     postgres(|max|) => ("PostgreSQL"),
///     sqlite(|max|) => ("SQLite"),
/// );
/// # fn main() {}
/// ```
///
/// # The same code written by hand
///
/// `idem_testkit::for_each_backend!(ping_tests; postgres, sqlite(2) as lite)`
/// expands to (the paths going through `idem_testkit::__private`):
///
/// ```ignore
/// ping_tests!(postgres, sqlx::Postgres, Dialect::Postgres, idem_testkit::postgres(16).await);
/// ping_tests!(lite, sqlx::Sqlite, Dialect::Sqlite, Some(idem_testkit::sqlite(2).await));
/// ```
#[macro_export]
macro_rules! for_each_backend {
    ($suite:ident $(,)?) => {
        $crate::for_each_backend!($suite; postgres, mariadb, sqlite);
    };
    ($suite:ident; $(
        $backend:ident
        $(( $($size:tt)* ))?
        $({ $($pool:tt)* })?
        $(as $module:ident)?
        $(=> ( $($extra:tt)* ))?
    ),+ $(,)?) => {
        $(
            $crate::__for_each_backend!(
                $suite $backend
                module[$($module)?]
                size[$($($size)*)?]
                pool[$($($pool)*)?]
                extra[$($($extra)*)?]
            );
        )+
    };
}

/// The steps of [`for_each_backend!`], one backend at a time: its row of
/// the table, its module's name, its pool argument, the invocation.
#[doc(hidden)]
#[macro_export]
macro_rules! __for_each_backend {
    // The table: default module name, database, dialect, default pool size.
    ($s:ident postgres $($rest:tt)*) => {
        $crate::__for_each_backend!(@module $s postgres
            [$crate::__private::sqlx::Postgres] [$crate::__private::Dialect::Postgres] 16 $($rest)*);
    };
    ($s:ident mariadb $($rest:tt)*) => {
        $crate::__for_each_backend!(@module $s mariadb
            [$crate::__private::sqlx::MySql] [$crate::__private::Dialect::MySql] 16 $($rest)*);
    };
    ($s:ident sqlite $($rest:tt)*) => {
        $crate::__for_each_backend!(@module $s sqlite
            [$crate::__private::sqlx::Sqlite] [$crate::__private::Dialect::Sqlite] 8 $($rest)*);
    };
    ($s:ident any_postgres $($rest:tt)*) => {
        $crate::__for_each_backend!(@module $s any_postgres
            [$crate::__private::sqlx::Any] [$crate::__private::Dialect::Postgres] 16 $($rest)*);
    };
    ($s:ident any_mariadb $($rest:tt)*) => {
        $crate::__for_each_backend!(@module $s any_mariadb
            [$crate::__private::sqlx::Any] [$crate::__private::Dialect::MySql] 16 $($rest)*);
    };
    ($s:ident any_sqlite $($rest:tt)*) => {
        $crate::__for_each_backend!(@module $s any_sqlite
            [$crate::__private::sqlx::Any] [$crate::__private::Dialect::Sqlite] 8 $($rest)*);
    };

    // The module: the one named with `as`, or the backend's.
    (@module $s:ident $b:ident $db:tt $dialect:tt $n:tt module[$m:ident] $($rest:tt)*) => {
        $crate::__for_each_backend!(@pool $s $b $m $db $dialect $n $($rest)*);
    };
    (@module $s:ident $b:ident $db:tt $dialect:tt $n:tt module[] $($rest:tt)*) => {
        $crate::__for_each_backend!(@pool $s $b $b $db $dialect $n $($rest)*);
    };

    // The pool argument: of the default size, sized by the suite, of the
    // size given, or the tokens given.
    (@pool $s:ident $b:ident $m:ident $db:tt $dialect:tt $n:tt size[] pool[] extra $extra:tt) => {
        $crate::__for_each_backend!(@call $s $m $db $dialect
            [$crate::__for_each_backend!(@make $b $n)] extra $extra);
    };
    (@pool $s:ident $b:ident $m:ident $db:tt $dialect:tt $n:tt size[|$max:ident|] pool[] extra $extra:tt) => {
        $crate::__for_each_backend!(@call $s $m $db $dialect
            [|$max| $crate::__for_each_backend!(@make $b $max)] extra $extra);
    };
    (@pool $s:ident $b:ident $m:ident $db:tt $dialect:tt $n:tt size[$size:expr] pool[] extra $extra:tt) => {
        $crate::__for_each_backend!(@call $s $m $db $dialect
            [$crate::__for_each_backend!(@make $b $size)] extra $extra);
    };
    (@pool $s:ident $b:ident $m:ident $db:tt $dialect:tt $n:tt size[] pool[$($pool:tt)+] extra $extra:tt) => {
        $crate::__for_each_backend!(@call $s $m $db $dialect [$($pool)+] extra $extra);
    };
    (@pool $s:ident $b:ident $m:ident $db:tt $dialect:tt $n:tt size[$($size:tt)+] pool[$($pool:tt)+] extra $extra:tt) => {
        ::core::compile_error!(::core::concat!(
            "`", ::core::stringify!($b), "`: a pool size `(…)` or a pool `{ … }`, not both"
        ));
    };

    // The suite's invocation.
    (@call $s:ident $m:ident [$($db:tt)*] [$($dialect:tt)*] [$($pool:tt)*] extra[]) => {
        $s!($m, $($db)*, $($dialect)*, $($pool)*);
    };
    (@call $s:ident $m:ident [$($db:tt)*] [$($dialect:tt)*] [$($pool:tt)*] extra[$($extra:tt)+]) => {
        $s!($m, $($db)*, $($dialect)*, $($pool)*, $($extra)+);
    };

    // A pool of `n` connections on each backend.
    (@make postgres $n:expr) => { $crate::postgres($n).await };
    (@make mariadb $n:expr) => { $crate::mysql($n).await };
    (@make sqlite $n:expr) => { ::core::option::Option::Some($crate::sqlite($n).await) };
    (@make any_postgres $n:expr) => { $crate::any(&$crate::postgres_url(), $n).await };
    (@make any_mariadb $n:expr) => { $crate::any(&$crate::mysql_url(), $n).await };
    (@make any_sqlite $n:expr) => { $crate::any(&$crate::sqlite_url(), $n).await };

    ($s:ident $other:ident $($rest:tt)*) => {
        ::core::compile_error!(::core::concat!(
            "unknown backend `", ::core::stringify!($other),
            "`: expected one of `postgres`, `mariadb`, `sqlite`, `any_postgres`, `any_mariadb`, `any_sqlite`"
        ));
    };
}

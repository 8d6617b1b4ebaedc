//! PostgreSQL 15: a server of the test's own restarted under the service.

restart_suite!(
    sqlx::Postgres,
    Dialect::Postgres,
    Single::postgres,
    idem_testkit::postgres(10).await
);

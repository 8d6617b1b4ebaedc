//! MariaDB: a server of the test's own restarted under the service.

restart_suite!(
    sqlx::MySql,
    Dialect::MySql,
    Single::mariadb,
    idem_testkit::mysql(10).await
);

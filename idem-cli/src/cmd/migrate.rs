//! `idem migrate`.

use crate::Fail;
use crate::output::Out;
use crate::redact::redact;
use serde::Serialize;
use sqlx::AnyPool;

#[derive(Serialize)]
struct MigrateReport {
    dialect: &'static str,
    database: String,
    created: Vec<&'static str>,
    already_present: Vec<&'static str>,
    /// The schema version the tables are at now.
    schema_version: i64,
}

pub(crate) async fn run(pool: &AnyPool, url: &str, out: Out) -> Result<(), Fail> {
    let before = idem_runtime::existing_tables(pool).await?;
    idem_runtime::migrate(pool).await?;
    let dialect = <sqlx::Any as idem_runtime::Backend>::pool_dialect(pool);
    let mut report = MigrateReport {
        dialect: dialect.name(),
        database: redact(url),
        created: Vec::new(),
        already_present: Vec::new(),
        schema_version: idem_runtime::SCHEMA_VERSION,
    };
    for (t, existed) in before {
        if existed {
            report.already_present.push(t);
        } else {
            report.created.push(t);
        }
    }
    out.emit(&report, || {
        let mut s = format!("migrated {} ({})\n", report.database, report.dialect);
        let list = |v: &[&str]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        s += &format!("  created:         {}\n", list(&report.created));
        s += &format!("  already present: {}\n", list(&report.already_present));
        s += &format!(
            "  schema version:  {}\n  (missing indexes were created too; older tables were upgraded in place)\n",
            report.schema_version
        );
        s
    })
}

//! `idem request` and `idem processes`, through
//! [`idem_runtime::outbox::admin`].

use crate::Fail;
use crate::output::{Out, human, shorten, table};
use idem_runtime::outbox::admin::{self, RequestRecord};
use idem_runtime::timestamp::utc_text;
use sqlx::AnyPool;

/// `idem request --key K --caller C`.
pub(crate) async fn show(pool: &AnyPool, key: &str, caller: &str, out: Out) -> Result<(), Fail> {
    let Some(found) = admin::request(pool, key, caller).await? else {
        return Err(Fail::not_found(format!(
            "no stored request with Idempotency-Key {key:?} from caller {caller:?} (neither \
             online nor archived)"
        )));
    };
    out.emit(&found, || request_text(&found))
}

fn request_text(r: &RequestRecord) -> String {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let rows = [
        ("key", r.key.clone()),
        ("scope", r.scope.clone()),
        ("state", r.state.clone()),
        (
            "status",
            r.response_status.map_or("-".into(), |s| s.to_string()),
        ),
        ("body", shorten(&opt(&r.response_body), 200)),
        ("fingerprint", r.fingerprint.clone()),
        ("created_at", utc_text(&r.created_at)),
        ("expires_at", utc_text(&r.expires_at)),
        (
            "archived_at",
            r.archived_at.as_ref().map_or("- (online)".into(), utc_text),
        ),
        ("record_key", r.record_key.clone()),
    ];
    rows.iter().map(|(k, v)| format!("{k:<12} {v}\n")).collect()
}

/// `idem processes`.
pub(crate) async fn processes(pool: &AnyPool, out: Out) -> Result<(), Fail> {
    let all = admin::processes(pool).await?;
    out.emit(&all, || {
        if all.is_empty() {
            return "no relays or consumers registered\n".into();
        }
        let rows: Vec<Vec<String>> = all
            .iter()
            .map(|p| {
                vec![
                    p.kind.clone(),
                    shorten(&p.name, 40),
                    p.id.clone(),
                    p.host.clone().unwrap_or_else(|| "-".into()),
                    p.pid.map_or("-".into(), |n| n.to_string()),
                    utc_text(&p.started_at),
                    format!("{} ago", human(p.heartbeat_age)),
                ]
            })
            .collect();
        table(
            &[
                "KIND",
                "NAME",
                "ID",
                "HOST",
                "PID",
                "STARTED_AT",
                "HEARTBEAT",
            ],
            &rows,
        )
    })
}

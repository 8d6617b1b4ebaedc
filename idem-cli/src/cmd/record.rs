//! `idem record show`, through [`idem_runtime::archive::find_record`].

use crate::Fail;
use crate::output::Out;
use idem_runtime::archive::{RecordInfo, find_record};
use idem_runtime::timestamp::utc_text;
use sqlx::AnyPool;

pub(crate) async fn show(
    pool: &AnyPool,
    key: &str,
    biz_type: Option<&str>,
    out: Out,
) -> Result<(), Fail> {
    let found: Vec<RecordInfo> = find_record(pool, key, biz_type).await?;
    if found.is_empty() {
        let of_type = biz_type
            .map(|t| format!(" and biz_type {t:?}"))
            .unwrap_or_default();
        return Err(Fail::not_found(format!(
            "no idempotency record with key {key:?}{of_type} (neither online nor archived)"
        )));
    }
    let text = || {
        let mut s = String::new();
        if found.len() > 1 {
            s += &format!(
                "{} records of this key, one per biz_type (choose one with --biz-type):\n",
                found.len()
            );
        }
        for (i, r) in found.iter().enumerate() {
            if i > 0 {
                s += "\n";
            }
            s += &record_text(r);
        }
        s
    };
    match found.as_slice() {
        [one] => out.emit(one, text),
        several => out.emit(&several, text),
    }
}

fn record_text(r: &RecordInfo) -> String {
    let rows = [
        ("key", r.key.clone()),
        ("biz_type", r.biz_type.clone()),
        ("biz_no", r.biz_no.clone()),
        ("fingerprint", r.fingerprint.clone()),
        ("result", r.result.clone().unwrap_or_else(|| "-".into())),
        ("create_time", utc_text(&r.create_time)),
        ("expire_time", utc_text(&r.expire_time)),
        (
            "archived",
            if r.archived { "yes" } else { "no (online)" }.into(),
        ),
        (
            "archived_at",
            r.archived_at.as_ref().map_or("-".into(), utc_text),
        ),
    ];
    rows.iter().map(|(k, v)| format!("{k:<12} {v}\n")).collect()
}

//! `/archive`: what the archiver would move now, when it last ran, and
//! how large the history tables are.

use crate::error::PageError;
use crate::read::{SCAN_TIMEOUT, answering, bounded};
use crate::{Shared, fmt, layout};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Html;
use idem_runtime::Operable;
use idem_runtime::timestamp::utc_text;
use maud::html;

pub(crate) async fn page<DB: Operable>(
    State(c): State<Shared<DB>>,
    headers: HeaderMap,
) -> Result<Html<String>, PageError> {
    let viewer = c.auth.viewer(&headers);
    answering(&c.pool).await?;
    let s = bounded(
        SCAN_TIMEOUT,
        idem_runtime::archive::status(&c.pool, c.outbox_retention),
    )
    .await?;
    let body = html! {
        h1 { "Archiving" }
        p.note { "Expired idempotency records and finished outbox messages (delivered or dead-lettered, last changed more than "
            (fmt::age(s.outbox_retention_secs)) " ago) move to the history tables with "
            code { "idem archive" } " or an " code { "Archiver" } "; pending messages never move." }
        table #archive {
            thead { tr { th { "" } th.num { "Eligible now" } th.num { "In history" } th { "Last archived (UTC)" } } }
            tbody {
                tr #archive-records { th { "Idempotency records" } td.num.eligible { (s.records_eligible) } td.num.history { (s.record_history) } td.last { (s.last_record_archived_at.as_ref().map_or("never".into(), utc_text)) } }
                tr #archive-outbox { th { "Outbox messages" } td.num.eligible { (s.outbox_eligible) } td.num.history { (s.outbox_history) } td.last { (s.last_outbox_archived_at.as_ref().map_or("never".into(), utc_text)) } }
            }
        }
    };
    Ok(layout::page(
        &c.mount,
        "Archiving",
        "/archive",
        &viewer,
        body,
    ))
}

//! `/records`: an idempotency record by key, online or archived.

use crate::error::PageError;
use crate::fmt;
use crate::params::Params;
use crate::read::{READ_TIMEOUT, answering, bounded};
use crate::{Shared, layout};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use idem_runtime::archive::find_record;
use idem_runtime::timestamp::utc_text;
use idem_runtime::{MAX_KEY_LEN, Operable};
use maud::html;

pub(crate) async fn page<DB: Operable>(
    State(c): State<Shared<DB>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Result<Response, PageError> {
    let viewer = c.auth.viewer(&headers);
    let p = Params::query(q.as_deref());
    let key = p.filter("key", MAX_KEY_LEN)?;
    // The column's width.
    let biz_type = p.filter("biz_type", 64)?;
    let found = match key {
        Some(k) => {
            answering(&c.pool).await?;
            Some(bounded(READ_TIMEOUT, find_record(&c.pool, k, biz_type)).await?)
        }
        None => None,
    };
    let form = html! {
        form.filter method="get" action=(c.mount.url("/records")) #lookup {
            label { "Key " input type="text" name="key" #key size="48" value=(key.unwrap_or("")) required; }
            label { " biz_type " input type="text" name="biz_type" #biz-type size="16" value=(biz_type.unwrap_or("")) placeholder="(any)"; }
            " " button type="submit" #look-up { "Look up" }
        }
    };
    let body = html! {
        h1 { "Idempotency records" }
        (form)
        @match &found {
            None => p.note { "Look up a record by its key (and, when several business types share it, its biz_type); archived records are found too." },
            Some(rs) if rs.is_empty() => p.note #not-found { "No record with this key" @if let Some(t) = biz_type { " and biz_type " code { (fmt::name(t)) } } ", neither online nor archived." },
            Some(rs) => {
                @for r in rs {
                    table.record data-biz-type=(r.biz_type) {
                        tr { th { "Key" } td.key { code { (fmt::name(&r.key)) } } }
                        tr { th { "biz_type" } td.biz-type { (fmt::name(&r.biz_type)) } }
                        tr { th { "biz_no" } td { (r.biz_no) } }
                        tr { th { "Fingerprint" } td.fingerprint { code { (r.fingerprint) } } }
                        tr { th { "Stored result" } td.result { @if let Some(res) = &r.result { pre { (res) } } @else { "-" } } }
                        tr { th { "Created (UTC)" } td.created { (utc_text(&r.create_time)) } }
                        tr { th { "Expires (UTC)" } td.expires { (utc_text(&r.expire_time)) } }
                        tr { th { "Where" } td.where {
                            @if r.archived { span.badge.archived { "archived" } " at " (r.archived_at.as_ref().map_or("-".into(), utc_text)) }
                            @else { span.badge.online { "online" } }
                        } }
                    }
                }
            }
        }
    };
    let status = match &found {
        Some(rs) if rs.is_empty() => StatusCode::NOT_FOUND,
        _ => StatusCode::OK,
    };
    let html: Html<String> = layout::page(&c.mount, "Records", "/records", &viewer, body);
    Ok((status, html).into_response())
}

//! Each strategy's options: required ones, defaults, and checks.

use super::Strategy;
use super::ttl::{DEFAULT_TTL_SECS, parse_ttl};
use super::value::{Errors, field_path, ident_str, lit_str, state_path};
use proc_macro2::Span;
use syn::Expr;

/// Looks an argument up by name.
pub(super) type Take<'a> = dyn Fn(&str) -> Option<(Span, Expr)> + 'a;

/// `strategy = state_machine`: `table`, `id`, `from`, `to` required.
pub(super) fn state_machine(take: &Take, errors: &mut Errors) -> Option<Strategy> {
    let mut required = |name: &str, example: &str| {
        let got = take(name);
        if got.is_none() {
            errors.at(
                Span::call_site(),
                format!("`strategy = state_machine` needs `{name} = {example}`"),
            );
        }
        got
    };
    let table = required("table", "\"coupon\"");
    let id = required("id", "msg.coupon_id");
    let from = required("from", "CouponState::Unused");
    let to = required("to", "CouponState::Used");
    let table = table.and_then(|(_, e)| ident_str(&e, "table", errors));
    let id = id.and_then(|(_, e)| field_path(&e, "id", errors));
    let id_column = take("id_column").and_then(|(_, e)| ident_str(&e, "id_column", errors));
    let state_column =
        take("state_column").and_then(|(_, e)| ident_str(&e, "state_column", errors));
    let key_column = take("key_column").and_then(|(_, e)| ident_str(&e, "key_column", errors));
    let from = from.and_then(|(_, e)| state_path(&e, "from", errors));
    let to = to.and_then(|(_, e)| state_path(&e, "to", errors));
    if let (Some(f), Some(t)) = (&from, &to)
        && quote::quote!(#f).to_string() == quote::quote!(#t).to_string()
    {
        errors.spanned(
            t,
            "`from` and `to` are the same state: the transition would never change anything",
        );
    }
    match (table, id, from, to) {
        (Some(table), Some(id), Some(from), Some(to)) => Some(Strategy::StateMachine {
            table,
            id,
            id_column,
            state_column,
            key_column,
            from,
            to,
        }),
        _ => None,
    }
}

/// `strategy = record`: `biz_type` required.
pub(super) fn record(take: &Take, errors: &mut Errors) -> Option<Strategy> {
    let biz_type = match take("biz_type") {
        Some((_, e)) => lit_str(&e, "biz_type", errors).and_then(|s| {
            let v = s.value();
            if v.is_empty() || v.len() > 64 {
                errors.at(
                    s.span(),
                    format!("`biz_type` must be 1 to 64 bytes, `{v}` is {}", v.len()),
                );
                None
            } else if let Some(c) = v
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
            {
                errors.at(
                    s.span(),
                    format!(
                        "`biz_type = \"{v}\"` contains {c:?}: use letters, digits, \
                         `_`, `.` and `-`, e.g. `biz_type = \"notice.sms\"`"
                    ),
                );
                None
            } else {
                Some(s)
            }
        }),
        None => {
            errors.at(
                Span::call_site(),
                "`strategy = record` needs `biz_type = \"...\"`, e.g. \
                 `biz_type = \"notice\"`: the record table is unique on \
                 (biz_type, key), so it names the scope in which keys are \
                 deduplicated. It has no default: the function's name would change \
                 when the function is renamed, and messages already processed would \
                 then run again",
            );
            None
        }
    };
    let biz_no = take("biz_no").and_then(|(_, e)| field_path(&e, "biz_no", errors));
    let ttl_secs = match take("ttl") {
        Some((_, e)) => lit_str(&e, "ttl", errors)
            .and_then(|s| match parse_ttl(&s.value()) {
                Ok(secs) => Some(secs),
                Err(msg) => {
                    errors.at(s.span(), msg);
                    None
                }
            })
            .unwrap_or(DEFAULT_TTL_SECS),
        None => DEFAULT_TTL_SECS,
    };
    let fingerprint = take("fingerprint").map(|(_, e)| {
        let items: Vec<Expr> = match e {
            Expr::Array(a) => a.elems.into_iter().collect(),
            other => vec![other],
        };
        items
            .iter()
            .filter_map(|e| field_path(e, "fingerprint", errors))
            .collect()
    });
    biz_type.map(|biz_type| Strategy::Record {
        biz_type,
        biz_no,
        ttl_secs,
        fingerprint,
    })
}

/// `strategy = unique_insert`: `constraint` required.
pub(super) fn unique_insert(take: &Take, errors: &mut Errors) -> Option<Strategy> {
    match take("constraint") {
        Some((_, e)) => ident_str(&e, "constraint", errors)
            .map(|constraint| Strategy::UniqueInsert { constraint }),
        None => {
            errors.at(
                Span::call_site(),
                "`strategy = unique_insert` needs `constraint = \"...\"`, the name of the \
             unique constraint or index whose violation means the action was already \
             done, e.g. `constraint = \"payment_serial_key\"` (on SQLite, whose inline \
             constraints have no name, `table.column`, e.g. `\"payment.serial\"`): a \
             violation of any other unique constraint is an error, not a duplicate",
            );
            None
        }
    }
}

//! The attribute's arguments, parsed into a typed struct that keeps each
//! keyword's span. Unknown, repeated and misplaced arguments are rejected
//! with the list of valid ones.

mod strategy;
mod ttl;
mod value;

pub(crate) use value::Errors;
use value::lit_str;

use proc_macro2::{Span, TokenStream};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, Ident, LitStr, MetaNameValue, Path, Token};

/// Every argument name, in the order they are listed in errors.
pub(crate) const ALL: &[&str] = &[
    "key",
    "strategy",
    "validate",
    "table",
    "id",
    "id_column",
    "state_column",
    "key_column",
    "from",
    "to",
    "biz_type",
    "biz_no",
    "ttl",
    "fingerprint",
    "constraint",
];
const COMMON: &[&str] = &["key", "strategy", "validate"];
const STATE_MACHINE: &[&str] = &[
    "table",
    "id",
    "id_column",
    "state_column",
    "key_column",
    "from",
    "to",
];
const RECORD: &[&str] = &["biz_type", "biz_no", "ttl", "fingerprint"];
const UNIQUE_INSERT: &[&str] = &["constraint"];
/// The strategies, as listed in errors.
pub(crate) const STRATEGIES: &[&str] = &["state_machine", "record", "unique_insert"];

/// A parameter path such as `msg.coupon_id`: a parameter and its fields.
#[derive(Debug, Clone)]
pub(crate) struct FieldPath {
    /// The parameter.
    pub root: Ident,
    /// The expression as written.
    pub expr: Expr,
}

/// Which strategy, with its options.
#[derive(Debug)]
pub(crate) enum Strategy {
    /// `strategy = state_machine`.
    StateMachine {
        table: LitStr,
        id: FieldPath,
        id_column: Option<LitStr>,
        state_column: Option<LitStr>,
        key_column: Option<LitStr>,
        from: Path,
        to: Path,
    },
    /// `strategy = record`.
    Record {
        biz_type: LitStr,
        biz_no: Option<FieldPath>,
        ttl_secs: u64,
        fingerprint: Option<Vec<FieldPath>>,
    },
    /// `strategy = unique_insert`.
    UniqueInsert {
        /// The unique constraint (or index) whose violation means Duplicate.
        constraint: LitStr,
    },
}

impl Strategy {
    /// The strategy's name.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Strategy::StateMachine { .. } => "state_machine",
            Strategy::Record { .. } => "record",
            Strategy::UniqueInsert { .. } => "unique_insert",
        }
    }
}

/// The parsed attribute.
#[derive(Debug)]
pub(crate) struct Args {
    /// `key = "..."`.
    pub key: LitStr,
    /// `validate = path::to::fn`.
    pub validate: Option<Path>,
    /// The strategy and its options.
    pub strategy: Strategy,
}

fn list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One argument as written: its name, the name's span, its value.
type Seen = (String, Span, Expr);

/// Parses the attribute's arguments.
pub(crate) fn parse(attr: TokenStream) -> Result<Args, syn::Error> {
    let mut errors = Errors::default();
    let seen = arguments(attr, &mut errors)?;
    let take = |name: &str| -> Option<(Span, Expr)> {
        seen.iter()
            .find(|(n, ..)| n == name)
            .map(|(_, s, e)| (*s, e.clone()))
    };

    let key = match take("key") {
        Some((_, e)) => lit_str(&e, "key", &mut errors),
        None => {
            errors.at(
                Span::call_site(),
                "missing `key = \"...\"`: the key template that identifies the action, \
                 e.g. `key = \"coupon:{msg.id}\"`",
            );
            None
        }
    };
    let validate = take("validate").and_then(|(_, e)| match e {
        Expr::Path(p) => Some(p.path),
        other => {
            errors.spanned(
                other,
                "`validate` takes the path of a function `fn(&str) -> Result<(), E>`",
            );
            None
        }
    });

    let strategy_name = strategy_name(take("strategy"), &mut errors);
    if let Some(strategy) = &strategy_name {
        foreign_options(strategy, &seen, &mut errors);
    }
    let strategy = match strategy_name.as_deref() {
        Some("state_machine") => strategy::state_machine(&take, &mut errors),
        Some("record") => strategy::record(&take, &mut errors),
        Some(_) => strategy::unique_insert(&take, &mut errors),
        None => None,
    };

    errors.finish()?;
    Ok(Args {
        key: key.expect("no errors"),
        validate,
        strategy: strategy.expect("no errors"),
    })
}

/// The `name = value` arguments, each known name once (unknown and
/// repeated names are errors).
fn arguments(attr: TokenStream, errors: &mut Errors) -> Result<Vec<Seen>, syn::Error> {
    let items = Punctuated::<MetaNameValue, Token![,]>::parse_terminated
        .parse2(attr)
        .map_err(|e| {
            syn::Error::new(
                e.span(),
                format!(
                    "{e}; expected `name = value` arguments, e.g. \
                     `#[idempotent(key = \"coupon:{{msg.id}}\", strategy = state_machine, ...)]`"
                ),
            )
        })?;
    let mut seen: Vec<Seen> = Vec::new();
    for item in items {
        let Some(name) = item.path.get_ident().map(Ident::to_string) else {
            errors.spanned(
                &item.path,
                format!("unknown argument; expected one of: {}", list(ALL)),
            );
            continue;
        };
        let span = item.path.span();
        if !ALL.contains(&name.as_str()) {
            errors.at(
                span,
                format!("unknown argument `{name}`; expected one of: {}", list(ALL)),
            );
        } else if seen.iter().any(|(n, ..)| *n == name) {
            errors.at(span, format!("duplicate argument `{name}`"));
        } else {
            seen.push((name, span, item.value));
        }
    }
    Ok(seen)
}

/// The strategy named by `strategy = …`, if it is one idem has.
fn strategy_name(arg: Option<(Span, Expr)>, errors: &mut Errors) -> Option<String> {
    match arg {
        Some((_, Expr::Path(p))) if p.path.get_ident().is_some() => {
            let ident = p.path.get_ident().expect("checked").clone();
            let name = ident.to_string();
            if name == "token" {
                errors.at(
                    ident.span(),
                    "`strategy = token` is not supported: one-time tokens protect synchronous \
                     front-end calls only; MQ redeliveries, payment callbacks and outbox retries \
                     carry no token, so it gives an async handler no protection. \
                     Use `state_machine`, `record` or `unique_insert`",
                );
                None
            } else if STRATEGIES.contains(&name.as_str()) {
                Some(name)
            } else {
                errors.at(
                    ident.span(),
                    format!(
                        "unknown strategy `{name}`; expected one of: {}",
                        list(STRATEGIES)
                    ),
                );
                None
            }
        }
        Some((_, other)) => {
            errors.spanned(
                other,
                format!("`strategy` takes one of: {}", list(STRATEGIES)),
            );
            None
        }
        None => {
            errors.at(
                Span::call_site(),
                format!(
                    "missing `strategy = ...`; expected one of: {}",
                    list(STRATEGIES)
                ),
            );
            None
        }
    }
}

/// Errors for the options given that belong to another strategy than
/// `strategy`.
fn foreign_options(strategy: &str, seen: &[Seen], errors: &mut Errors) {
    let own: &[&str] = match strategy {
        "state_machine" => STATE_MACHINE,
        "record" => RECORD,
        _ => UNIQUE_INSERT,
    };
    for (name, span, _) in seen {
        if COMMON.contains(&name.as_str()) || own.contains(&name.as_str()) {
            continue;
        }
        let owner = if STATE_MACHINE.contains(&name.as_str()) {
            "state_machine"
        } else if RECORD.contains(&name.as_str()) {
            "record"
        } else {
            "unique_insert"
        };
        let valid = format!("its options are: {}", list(own));
        errors.at(
            *span,
            format!(
                "`{name}` is an option of `strategy = {owner}`, not of \
                 `strategy = {strategy}`; {valid}"
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn err(ts: TokenStream) -> String {
        parse(ts).unwrap_err().to_string()
    }

    #[test]
    fn parses_state_machine() {
        let a = parse(quote!(
            key = "c:{m.id}",
            strategy = state_machine,
            table = "coupon",
            id = m.coupon_id,
            from = S::A,
            to = S::B
        ))
        .unwrap();
        assert!(matches!(a.strategy, Strategy::StateMachine { .. }));
    }

    #[test]
    fn rejects_unknown_and_duplicate() {
        assert!(
            err(quote!(key = "a{b}", strategy = record, colour = "x"))
                .contains("expected one of: `key`")
        );
        assert!(
            err(quote!(key = "a{b}", key = "c{d}", strategy = record))
                .contains("duplicate argument `key`")
        );
        assert!(err(quote!(key = "a{b}", strategy = tokens)).contains("unknown strategy `tokens`"));
        assert!(err(quote!(key = "a{b}", strategy = token)).contains("synchronous"));
        assert!(
            err(quote!(key = "a{b}", strategy = record, table = "t"))
                .contains("option of `strategy = state_machine`")
        );
        assert!(err(quote!(strategy = record)).contains("missing `key"));
    }

    #[test]
    fn record_needs_a_valid_biz_type() {
        assert!(err(quote!(key = "a:{b}", strategy = record)).contains("needs `biz_type"));
        assert!(
            err(quote!(
                key = "a:{b}",
                strategy = record,
                biz_type = "no tice"
            ))
            .contains("contains ' '")
        );
        assert!(err(quote!(key = "a:{b}", strategy = record, biz_type = "")).contains("1 to 64"));
        let a = parse(quote!(
            key = "a:{b}",
            strategy = record,
            biz_type = "notice.sms-2_x"
        ))
        .unwrap();
        assert!(
            matches!(a.strategy, Strategy::Record { biz_type, .. } if biz_type.value() == "notice.sms-2_x")
        );
    }

    #[test]
    fn unique_insert_needs_a_constraint() {
        assert!(err(quote!(key = "a:{b}", strategy = unique_insert)).contains("needs `constraint"));
        assert!(
            err(quote!(
                key = "a:{b}",
                strategy = unique_insert,
                constraint = "a.b.c"
            ))
            .contains("not a valid SQL identifier")
        );
        for ok in ["payment_serial_key", "payment.serial"] {
            let a =
                parse(quote!(key = "a:{b}", strategy = unique_insert, constraint = #ok)).unwrap();
            assert!(
                matches!(a.strategy, Strategy::UniqueInsert { constraint } if constraint.value() == ok)
            );
        }
        assert!(
            err(quote!(
                key = "a:{b}",
                strategy = record,
                biz_type = "n",
                constraint = "c"
            ))
            .contains("`constraint` is an option of `strategy = unique_insert`")
        );
    }

    #[test]
    fn state_machine_takes_a_key_column() {
        let a = parse(quote!(
            key = "c:{m.id}",
            strategy = state_machine,
            table = "coupon",
            id = m.coupon_id,
            key_column = "last_key",
            from = S::A,
            to = S::B
        ))
        .unwrap();
        assert!(
            matches!(a.strategy, Strategy::StateMachine { key_column: Some(k), .. } if k.value() == "last_key")
        );
        assert!(
            err(quote!(
                key = "c:{m.id}",
                strategy = state_machine,
                table = "coupon",
                id = m.coupon_id,
                key_column = "last key",
                from = S::A,
                to = S::B
            ))
            .contains("not a valid SQL identifier")
        );
        assert!(
            err(quote!(
                key = "a:{b}",
                strategy = unique_insert,
                constraint = "c",
                key_column = "k"
            ))
            .contains("option of `strategy = state_machine`")
        );
    }

    #[test]
    fn ttl_is_bounded() {
        assert!(
            err(quote!(
                key = "a:{b}",
                strategy = record,
                biz_type = "n",
                ttl = "3000000d"
            ))
            .contains("too long")
        );
    }

    #[test]
    fn checks_identifiers() {
        use idem_syntax::is_identifier;
        assert!(is_identifier("coupon"));
        assert!(is_identifier("shop.coupon"));
        assert!(!is_identifier("coupon; DROP TABLE x"));
        assert!(!is_identifier("1coupon"));
        assert!(!is_identifier(""));
    }
}

//! The attribute's arguments, parsed into a typed struct that keeps each
//! keyword's span. Unknown, repeated and misplaced arguments are rejected
//! with the list of valid ones.

use proc_macro2::{Span, TokenStream};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, Ident, LitStr, MetaNameValue, Path, Token};

/// Every argument name, in the order they are listed in errors.
pub const ALL: &[&str] = &[
    "key",
    "strategy",
    "validate",
    "table",
    "id",
    "id_column",
    "state_column",
    "from",
    "to",
    "biz_type",
    "biz_no",
    "ttl",
    "fingerprint",
];
const COMMON: &[&str] = &["key", "strategy", "validate"];
const STATE_MACHINE: &[&str] = &["table", "id", "id_column", "state_column", "from", "to"];
const RECORD: &[&str] = &["biz_type", "biz_no", "ttl", "fingerprint"];
/// The strategies, as listed in errors.
pub const STRATEGIES: &[&str] = &["state_machine", "record", "unique_insert"];

/// A parameter path such as `msg.coupon_id`: a parameter and its fields.
#[derive(Debug, Clone)]
pub struct FieldPath {
    /// The parameter.
    pub root: Ident,
    /// The expression as written.
    pub expr: Expr,
}

/// Which strategy, with its options.
#[derive(Debug)]
pub enum Strategy {
    /// `strategy = state_machine`.
    StateMachine {
        table: LitStr,
        id: FieldPath,
        id_column: Option<LitStr>,
        state_column: Option<LitStr>,
        from: Path,
        to: Path,
    },
    /// `strategy = record`.
    Record {
        biz_type: Option<LitStr>,
        biz_no: Option<FieldPath>,
        ttl_secs: u64,
        fingerprint: Option<Vec<FieldPath>>,
    },
    /// `strategy = unique_insert`.
    UniqueInsert,
}

impl Strategy {
    /// The strategy's name.
    pub fn name(&self) -> &'static str {
        match self {
            Strategy::StateMachine { .. } => "state_machine",
            Strategy::Record { .. } => "record",
            Strategy::UniqueInsert => "unique_insert",
        }
    }
}

/// The parsed attribute.
#[derive(Debug)]
pub struct Args {
    /// `key = "..."`.
    pub key: LitStr,
    /// `validate = path::to::fn`.
    pub validate: Option<Path>,
    /// The strategy and its options.
    pub strategy: Strategy,
}

/// Default record time-to-live: seven days.
pub const DEFAULT_TTL_SECS: u64 = 7 * 24 * 3600;

fn list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Collects errors so the user sees them all at once.
#[derive(Default)]
pub struct Errors(Option<syn::Error>);

impl Errors {
    /// Adds an error.
    pub fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }
    /// Adds an error at `span`.
    pub fn at(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.push(syn::Error::new(span, msg));
    }
    /// Adds an error covering all of `tokens` (a path, a type, an
    /// expression), not only their first token as `at(x.span())` does on
    /// stable Rust.
    pub fn spanned(&mut self, tokens: impl quote::ToTokens, msg: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, msg));
    }
    /// The collected errors, if any.
    pub fn finish(self) -> Result<(), syn::Error> {
        self.0.map_or(Ok(()), Err)
    }
}

/// Parses the attribute's arguments.
pub fn parse(attr: TokenStream) -> Result<Args, syn::Error> {
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
    let mut errors = Errors::default();
    let mut seen: Vec<(String, Span, Expr)> = Vec::new();
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

    let strategy_name = match take("strategy") {
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
    };

    // Options that belong to another strategy.
    if let Some(strategy) = &strategy_name {
        let own: &[&str] = match strategy.as_str() {
            "state_machine" => STATE_MACHINE,
            "record" => RECORD,
            _ => &[],
        };
        for (name, span, _) in &seen {
            if COMMON.contains(&name.as_str()) || own.contains(&name.as_str()) {
                continue;
            }
            let owner = if STATE_MACHINE.contains(&name.as_str()) {
                "state_machine"
            } else {
                "record"
            };
            let valid = if own.is_empty() {
                "it takes no options besides `key` and `validate`".to_string()
            } else {
                format!("its options are: {}", list(own))
            };
            errors.at(
                *span,
                format!(
                    "`{name}` is an option of `strategy = {owner}`, not of \
                     `strategy = {strategy}`; {valid}"
                ),
            );
        }
    }

    let strategy = match strategy_name.as_deref() {
        Some("state_machine") => {
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
            let table = table.and_then(|(_, e)| ident_str(&e, "table", &mut errors));
            let id = id.and_then(|(_, e)| field_path(&e, "id", &mut errors));
            let id_column =
                take("id_column").and_then(|(_, e)| ident_str(&e, "id_column", &mut errors));
            let state_column =
                take("state_column").and_then(|(_, e)| ident_str(&e, "state_column", &mut errors));
            let from = from.and_then(|(_, e)| state_path(&e, "from", &mut errors));
            let to = to.and_then(|(_, e)| state_path(&e, "to", &mut errors));
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
                    from,
                    to,
                }),
                _ => None,
            }
        }
        Some("record") => {
            let biz_type = take("biz_type").and_then(|(_, e)| {
                let s = lit_str(&e, "biz_type", &mut errors)?;
                if s.value().is_empty() || s.value().len() > 64 {
                    errors.at(s.span(), "`biz_type` must be 1 to 64 bytes");
                }
                Some(s)
            });
            let biz_no = take("biz_no").and_then(|(_, e)| field_path(&e, "biz_no", &mut errors));
            let ttl_secs = match take("ttl") {
                Some((_, e)) => lit_str(&e, "ttl", &mut errors)
                    .and_then(|s| match parse_ttl(&s.value()) {
                        Some(secs) => Some(secs),
                        None => {
                            errors.at(
                                s.span(),
                                format!(
                                    "invalid ttl `{}`: expected a positive duration such as \
                                     `30s`, `15m`, `24h`, `7d` or `1d12h`",
                                    s.value()
                                ),
                            );
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
                    .filter_map(|e| field_path(e, "fingerprint", &mut errors))
                    .collect()
            });
            Some(Strategy::Record {
                biz_type,
                biz_no,
                ttl_secs,
                fingerprint,
            })
        }
        Some(_) => Some(Strategy::UniqueInsert),
        None => None,
    };

    errors.finish()?;
    Ok(Args {
        key: key.expect("no errors"),
        validate,
        strategy: strategy.expect("no errors"),
    })
}

fn lit_str(e: &Expr, name: &str, errors: &mut Errors) -> Option<LitStr> {
    match e {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(s),
            ..
        }) => Some(s.clone()),
        other => {
            errors.spanned(other, format!("`{name}` takes a string literal"));
            None
        }
    }
}

/// A string literal that must be a plain SQL identifier (or `schema.table`).
fn ident_str(e: &Expr, name: &str, errors: &mut Errors) -> Option<LitStr> {
    let s = lit_str(e, name, errors)?;
    if is_identifier(&s.value()) {
        Some(s)
    } else {
        errors.at(
            s.span(),
            format!(
                "`{name} = \"{}\"` is not a valid SQL identifier: use letters, digits and `_`, \
                 not starting with a digit, at most 63 bytes (optionally `schema.table`)",
                s.value()
            ),
        );
        None
    }
}

/// Whether `s` is `[A-Za-z_][A-Za-z0-9_]*` (≤ 63 bytes), optionally qualified once.
pub fn is_identifier(s: &str) -> bool {
    let plain = |p: &str| {
        let mut b = p.bytes();
        matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
            && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
            && p.len() <= 63
    };
    match s.split_once('.') {
        Some((a, b)) => plain(a) && plain(b),
        None => plain(s),
    }
}

fn state_path(e: &Expr, name: &str, errors: &mut Errors) -> Option<Path> {
    match e {
        Expr::Path(p) if p.qself.is_none() && p.path.segments.len() >= 2 => Some(p.path.clone()),
        other => {
            errors.spanned(
                other,
                format!(
                    "`{name}` takes a variant of a `#[derive(State)]` enum, e.g. \
                     `{name} = CouponState::Unused`"
                ),
            );
            None
        }
    }
}

/// `msg`, `msg.field`, `msg.0.field`: a parameter and its fields.
pub fn field_path(e: &Expr, name: &str, errors: &mut Errors) -> Option<FieldPath> {
    fn root(e: &Expr) -> Option<Ident> {
        match e {
            Expr::Path(p) if p.qself.is_none() => p.path.get_ident().cloned(),
            Expr::Field(f) => root(&f.base),
            _ => None,
        }
    }
    match root(e) {
        Some(root) => Some(FieldPath {
            root,
            expr: e.clone(),
        }),
        None => {
            errors.spanned(
                e,
                format!("`{name}` takes a parameter or one of its fields, e.g. `msg.order_no`"),
            );
            None
        }
    }
}

/// `30s`, `15m`, `24h`, `7d`, `1d12h` → seconds.
pub fn parse_ttl(s: &str) -> Option<u64> {
    let mut total: u64 = 0;
    let mut num: Option<u64> = None;
    for c in s.chars() {
        if let Some(d) = c.to_digit(10) {
            num = Some(
                num.unwrap_or(0)
                    .checked_mul(10)?
                    .checked_add(u64::from(d))?,
            );
        } else {
            let unit = match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86400,
                _ => return None,
            };
            total = total.checked_add(num.take()?.checked_mul(unit)?)?;
        }
    }
    if num.is_some() || total == 0 || total > i64::MAX as u64 {
        return None;
    }
    Some(total)
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
    fn checks_identifiers() {
        assert!(is_identifier("coupon"));
        assert!(is_identifier("shop.coupon"));
        assert!(!is_identifier("coupon; DROP TABLE x"));
        assert!(!is_identifier("1coupon"));
        assert!(!is_identifier(""));
    }

    #[test]
    fn parses_ttls() {
        assert_eq!(parse_ttl("30s"), Some(30));
        assert_eq!(parse_ttl("1d12h"), Some(129600));
        assert_eq!(parse_ttl("7"), None);
        assert_eq!(parse_ttl("0s"), None);
        assert_eq!(parse_ttl("3w"), None);
    }
}

//! The handler's signature, checked and taken apart.

use crate::args::Errors;
use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{
    FnArg, GenericArgument, Ident, ItemFn, Pat, PathArguments, ReturnType, Type, parse_quote,
};

/// The handler's signature, taken apart.
pub(super) struct Handler<'a> {
    pub func: &'a ItemFn,
    /// The transaction parameter's pattern and type.
    pub tx_pat: &'a Pat,
    pub tx_ty: &'a Type,
    /// How the body holds the transaction.
    pub tx_form: TxForm,
    /// The database type (`Sqlite`, `Postgres`, `MySql`, a generic, or
    /// the connection type's `Database`).
    pub db: Type,
    /// The other parameters: name and the whole `name: Type`.
    pub params: Vec<(Ident, &'a FnArg)>,
    /// The declared return type and its `Ok` type.
    pub ret: &'a Type,
    pub ok: &'a Type,
}

/// How the body holds the call's transaction.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum TxForm {
    /// `tx: &mut Transaction<'_, DB>`: queries run on `&mut **tx`.
    Transaction,
    /// `tx: &mut PgConnection` (any `…Connection`): the transaction's
    /// connection, so queries run on `&mut *tx`, as in ordinary sqlx code.
    Connection,
}

const FIRST_PARAM: &str = "the first parameter must be the transaction: \
     `tx: &mut sqlx::Transaction<'_, DB>`, or its connection, `tx: &mut sqlx::PgConnection` \
     (`MySqlConnection`, `SqliteConnection`, `AnyConnection`)";

pub(super) fn analyze(func: &ItemFn) -> Result<Handler<'_>, syn::Error> {
    let mut errors = Errors::default();
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        errors.at(
            sig.fn_token.span(),
            "#[idempotent] handlers must be `async fn`: the generated code awaits the database",
        );
    }
    let mut inputs = sig.inputs.iter();
    let mut tx = None;
    match inputs.next() {
        Some(FnArg::Typed(pt)) => match tx_db(&pt.ty) {
            Some((form, db)) => tx = Some((&*pt.pat, &*pt.ty, form, db)),
            None => errors.spanned(&pt.ty, FIRST_PARAM),
        },
        Some(FnArg::Receiver(r)) => errors.spanned(
            r,
            "#[idempotent] handlers cannot take `self`; pass what they need as parameters",
        ),
        None => errors.at(sig.paren_token.span.join(), FIRST_PARAM),
    }
    let mut params = Vec::new();
    for arg in inputs {
        match arg {
            FnArg::Typed(pt) => match &*pt.pat {
                Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {
                    params.push((pi.ident.clone(), arg))
                }
                other => errors.spanned(
                    other,
                    "parameters of an #[idempotent] handler must be plain names, \
                     so the key template can refer to them",
                ),
            },
            FnArg::Receiver(r) => errors.spanned(r, "#[idempotent] handlers cannot take `self`"),
        }
    }
    let ret = match &sig.output {
        ReturnType::Type(_, ty) => match ok_type(ty) {
            Some(ok) => Some((&**ty, ok)),
            None => {
                errors.spanned(
                    ty,
                    "#[idempotent] handlers return `Result<T, E>`: an error rolls the transaction back",
                );
                None
            }
        },
        ReturnType::Default => {
            errors.at(
                sig.ident.span(),
                "#[idempotent] handlers return `Result<T, E>`: an error rolls the transaction back",
            );
            None
        }
    };
    if let Some((Pat::Ident(pi), _, TxForm::Transaction, db)) = &tx
        && let Some(span) = executor_reborrow(func.block.to_token_stream(), &pi.ident)
    {
        let name = &pi.ident;
        let conn = connection_of(db);
        errors.at(
            span,
            format!(
                "`&mut *{name}` is a `&mut Transaction`, which sqlx runs no query on: \
                 write `&mut **{name}`, or declare the parameter as the transaction's \
                 connection, `{name}: &mut {conn}`, and keep `&mut *{name}`"
            ),
        );
    }
    errors.finish()?;
    let (tx_pat, tx_ty, tx_form, db) = tx.expect("no errors");
    let (ret, ok) = ret.expect("no errors");
    Ok(Handler {
        func,
        tx_pat,
        tx_ty,
        tx_form,
        db,
        params,
        ret,
        ok,
    })
}

/// `&mut Transaction<'_, DB>` → `DB`; `&mut PgConnection` (a type whose
/// name ends in `Connection`) → `<PgConnection as Connection>::Database`.
fn tx_db(ty: &Type) -> Option<(TxForm, Type)> {
    let Type::Reference(r) = ungroup(ty) else {
        return None;
    };
    r.mutability?;
    let Type::Path(p) = ungroup(&r.elem) else {
        return None;
    };
    let last = p.path.segments.last()?;
    if last.ident.to_string().ends_with("Connection") {
        let conn = &r.elem;
        return Some((
            TxForm::Connection,
            parse_quote!(::idem_runtime::__private::DatabaseOf<#conn>),
        ));
    }
    if last.ident != "Transaction" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    args.args.iter().rev().find_map(|a| match a {
        GenericArgument::Type(t) => Some((TxForm::Transaction, t.clone())),
        _ => None,
    })
}

/// A type without the invisible group a `macro_rules!` `$t:ty` puts
/// around it, or its parentheses.
fn ungroup(ty: &Type) -> &Type {
    match ty {
        Type::Group(g) => ungroup(&g.elem),
        Type::Paren(p) => ungroup(&p.elem),
        other => other,
    }
}

/// The methods that take an executor, in sqlx's query types.
const EXECUTOR_METHODS: &[&str] = &[
    "execute",
    "execute_many",
    "fetch",
    "fetch_all",
    "fetch_many",
    "fetch_one",
    "fetch_optional",
];

/// Where the body passes `&mut *tx` (a `&mut Transaction`, not an
/// executor) as the only argument of one of sqlx's executor methods.
fn executor_reborrow(body: TokenStream, tx: &Ident) -> Option<Span> {
    let tokens: Vec<TokenTree> = body.into_iter().collect();
    for (i, tt) in tokens.iter().enumerate() {
        match tt {
            TokenTree::Group(g) => {
                let after_method = matches!(
                    i.checked_sub(1).map(|j| &tokens[j]),
                    Some(TokenTree::Ident(m)) if EXECUTOR_METHODS.iter().any(|e| m == e)
                );
                if after_method && g.delimiter() == Delimiter::Parenthesis {
                    let inner: Vec<String> =
                        g.stream().into_iter().map(|t| t.to_string()).collect();
                    if inner == ["&", "mut", "*", &tx.to_string()] {
                        return Some(g.span());
                    }
                }
                if let Some(span) = executor_reborrow(g.stream(), tx) {
                    return Some(span);
                }
            }
            _ => continue,
        }
    }
    None
}

/// The connection type of a database type, for messages.
fn connection_of(db: &Type) -> String {
    let name = match db {
        Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    };
    match name.as_deref() {
        Some("Postgres") => "PgConnection".into(),
        Some("MySql") => "MySqlConnection".into(),
        Some("Sqlite") => "SqliteConnection".into(),
        Some("Any") => "AnyConnection".into(),
        _ => format!("<{} as sqlx::Database>::Connection", db.to_token_stream()),
    }
}

/// `Result<T, E>` (or an alias such as `sqlx::Result<T>`) → `T`.
fn ok_type(ty: &Type) -> Option<&Type> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    args.args.iter().find_map(|a| match a {
        GenericArgument::Type(t) => Some(t),
        _ => None,
    })
}

/// The parameters besides the transaction, for error messages.
pub(super) fn param_list(h: &Handler) -> String {
    if h.params.is_empty() {
        return "none besides the transaction".into();
    }
    h.params
        .iter()
        .map(|(n, _)| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

//! The handler's signature, checked and taken apart.

use crate::args::Errors;
use syn::spanned::Spanned;
use syn::{FnArg, GenericArgument, Ident, ItemFn, Pat, PathArguments, ReturnType, Type};

/// The handler's signature, taken apart.
pub(super) struct Handler<'a> {
    pub func: &'a ItemFn,
    /// The transaction parameter's pattern and type.
    pub tx_pat: &'a Pat,
    pub tx_ty: &'a Type,
    /// The database type (`Sqlite`, `Postgres`, `MySql`, or a generic).
    pub db: &'a Type,
    /// The other parameters: name and the whole `name: Type`.
    pub params: Vec<(Ident, &'a FnArg)>,
    /// The declared return type and its `Ok` type.
    pub ret: &'a Type,
    pub ok: &'a Type,
}

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
            Some(db) => tx = Some((&*pt.pat, &*pt.ty, db)),
            None => errors.spanned(
                &pt.ty,
                "the first parameter must be the transaction: `tx: &mut sqlx::Transaction<'_, DB>`",
            ),
        },
        Some(FnArg::Receiver(r)) => errors.spanned(
            r,
            "#[idempotent] handlers cannot take `self`; pass what they need as parameters",
        ),
        None => errors.at(
            sig.paren_token.span.join(),
            "the first parameter must be the transaction: `tx: &mut sqlx::Transaction<'_, DB>`",
        ),
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
    errors.finish()?;
    let (tx_pat, tx_ty, db) = tx.expect("no errors");
    let (ret, ok) = ret.expect("no errors");
    Ok(Handler {
        func,
        tx_pat,
        tx_ty,
        db,
        params,
        ret,
        ok,
    })
}

/// `&mut Transaction<'_, DB>` → `DB`.
fn tx_db(ty: &Type) -> Option<&Type> {
    let Type::Reference(r) = ty else { return None };
    r.mutability?;
    let Type::Path(p) = &*r.elem else { return None };
    let last = p.path.segments.last()?;
    if last.ident != "Transaction" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    args.args.iter().rev().find_map(|a| match a {
        GenericArgument::Type(t) => Some(t),
        _ => None,
    })
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

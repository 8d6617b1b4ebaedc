//! Validation of the handler and expansion into the transactional protocol.

use crate::args::{self, Args, Errors, FieldPath, Strategy};
use crate::key::{self, Segment};
use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, GenericArgument, Ident, ItemFn, Pat, PathArguments, ReturnType, Type};

/// `#[idempotent(...)]`: on any error, the user's function is emitted
/// unchanged, followed by the errors, so the IDE keeps working inside it.
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    let func: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(_) => {
            let e = syn::Error::new(
                Span::call_site(),
                "#[idempotent] applies to an `async fn` handler",
            );
            let e = e.into_compile_error();
            return quote!(#item #e);
        }
    };
    match expand(attr, &func) {
        Ok(ts) => ts,
        Err(e) => {
            let e = e.into_compile_error();
            // A handler written without `async` still awaits in its body:
            // emit it as `async fn` so that only our error is reported,
            // not also rustc's "`await` is only allowed inside `async`".
            let mut func = func;
            if func.sig.asyncness.is_none() {
                func.sig.asyncness = Some(syn::Token![async](func.sig.fn_token.span));
            }
            quote!(#func #e)
        }
    }
}

/// The handler's signature, taken apart.
struct Handler<'a> {
    func: &'a ItemFn,
    /// The transaction parameter's pattern and type.
    tx_pat: &'a Pat,
    tx_ty: &'a Type,
    /// The database type (`Sqlite`, `Postgres`, `MySql`, or a generic).
    db: &'a Type,
    /// The other parameters: name and the whole `name: Type`.
    params: Vec<(Ident, &'a FnArg)>,
    /// The declared return type and its `Ok` type.
    ret: &'a Type,
    ok: &'a Type,
}

fn analyze(func: &ItemFn) -> Result<Handler<'_>, syn::Error> {
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

fn expand(attr: TokenStream, func: &ItemFn) -> Result<TokenStream, syn::Error> {
    // Report argument and signature errors together.
    let (args, handler) = match (args::parse(attr), analyze(func)) {
        (Ok(a), Ok(h)) => (a, h),
        (Err(mut a), Err(h)) => {
            a.combine(h);
            return Err(a);
        }
        (Err(e), _) | (_, Err(e)) => return Err(e),
    };
    let mut errors = Errors::default();
    let key = key_builder(&args, &handler, &mut errors);
    let check_root = |fp: &FieldPath, what: &str, errors: &mut Errors| {
        if !handler.params.iter().any(|(n, _)| *n == fp.root) {
            errors.at(
                fp.root.span(),
                format!(
                    "`{what}` refers to unknown parameter `{}`; the parameters are: {}",
                    fp.root,
                    param_list(&handler)
                ),
            );
        }
    };
    match &args.strategy {
        Strategy::StateMachine { id, .. } => check_root(id, "id", &mut errors),
        Strategy::Record {
            biz_no,
            fingerprint,
            ..
        } => {
            if let Some(b) = biz_no {
                check_root(b, "biz_no", &mut errors);
            }
            for f in fingerprint.iter().flatten() {
                check_root(f, "fingerprint", &mut errors);
            }
        }
        Strategy::UniqueInsert { .. } => {}
    }
    errors.finish()?;
    Ok(generate(&args, &handler, key))
}

fn param_list(h: &Handler) -> String {
    if h.params.is_empty() {
        return "none besides the transaction".into();
    }
    h.params
        .iter()
        .map(|(n, _)| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The key derivation: `KeyBuilder::new().lit(..).part(..)…`.
fn key_builder(args: &Args, h: &Handler, errors: &mut Errors) -> TokenStream {
    let lit = &args.key;
    let template = lit.value();
    let span_of = |range: Option<std::ops::Range<usize>>| {
        // Point inside the string where the compiler allows it (+1: the quote).
        range
            .and_then(|r| lit.token().subspan(r.start + 1..r.end + 1))
            .unwrap_or_else(|| lit.span())
    };
    let segments = match key::parse(&template) {
        Ok(s) => s,
        Err(errs) => {
            for e in errs {
                errors.at(span_of(e.range), e.message);
            }
            return TokenStream::new();
        }
    };
    let tx_name = match h.tx_pat {
        Pat::Ident(pi) => Some(pi.ident.to_string()),
        _ => None,
    };
    let mut calls = Vec::new();
    for seg in segments {
        match seg {
            Segment::Lit(text) => calls.push(quote!(.lit(#text))),
            Segment::Placeholder(p) => {
                let span = span_of(Some(p.range.clone()));
                let Some((ident, _)) = h.params.iter().find(|(n, _)| *n == p.root) else {
                    let hint = if tx_name.as_deref() == Some(p.root.as_str()) {
                        "the transaction cannot be part of the key".to_string()
                    } else {
                        format!("the parameters are: {}", param_list(h))
                    };
                    errors.at(
                        span,
                        format!("unknown parameter `{}` in key template; {hint}", p.root),
                    );
                    continue;
                };
                let ident = Ident::new(&ident.to_string(), span);
                let members = p.members.iter().map(|m| match m.parse::<u32>() {
                    Ok(i) => {
                        let idx = syn::Index { index: i, span };
                        quote_spanned!(span=> .#idx)
                    }
                    Err(_) => {
                        let m = Ident::new(m, span);
                        quote_spanned!(span=> .#m)
                    }
                });
                let text = p.text;
                let value = quote_spanned!(span=> &#ident #(#members)*);
                calls.push(quote_spanned!(span=> .part(#text, #value)));
            }
        }
    }
    let validate = match &args.validate {
        Some(path) => quote!(::core::option::Option::Some(|__idem_k: &str| {
            ::idem_runtime::__private::validate(#path, __idem_k)
        })),
        None => quote!(::core::option::Option::None),
    };
    quote!(::idem_runtime::__private::KeyBuilder::new() #(#calls)* .finish(#validate))
}

/// `fingerprint(&(a, b, …))?`, spanned so that a payload type without
/// `Serialize` is reported on the payload, from the first element to the
/// last, rather than on the whole attribute. (rustc blames the argument as
/// a whole, not the one element at fault; on stable, spans cannot be
/// joined, but an expression whose first token carries one span and whose
/// last token another is reported over the range between them.)
fn fingerprint_call(payload: &[TokenStream]) -> TokenStream {
    let first = |t: &TokenStream| t.clone().into_iter().next().map(|t| t.span());
    let last = |t: &TokenStream| t.clone().into_iter().last().map(|t| t.span());
    let lo = payload
        .first()
        .and_then(first)
        .unwrap_or_else(Span::call_site);
    let hi = payload
        .last()
        .and_then(last)
        .unwrap_or_else(Span::call_site);
    let mut tuple = Group::new(Delimiter::Parenthesis, quote!(#(#payload,)*));
    tuple.set_span(hi);
    let amp = quote_spanned!(lo=> &);
    let mut args = Group::new(Delimiter::Parenthesis, quote!(#amp #tuple));
    args.set_span(hi);
    let path = quote_spanned!(lo=> ::idem_runtime::__private::fingerprint);
    let question = quote_spanned!(hi=> ?);
    quote!(#path #args #question)
}

fn generate(args: &Args, h: &Handler, key: TokenStream) -> TokenStream {
    let ItemFn {
        attrs, vis, sig, ..
    } = h.func;
    let body = &h.func.block;
    let name = &sig.ident;
    let name_str = name.to_string();
    let generics = &sig.generics;
    let where_clause = &sig.generics.where_clause;
    let (db, ret, ok, tx_pat, tx_ty) = (h.db, h.ret, h.ok, h.tx_pat, h.tx_ty);
    let params = h.params.iter().map(|(_, arg)| arg);
    let strategy = args.strategy.name();
    // What cache markers and records are scoped by: the record strategy's
    // `biz_type`; elsewhere the function's name (it only scopes cache
    // markers there, so a rename costs cache misses, never a double apply).
    let scope = match &args.strategy {
        Strategy::Record { biz_type, .. } => biz_type.value(),
        _ => name_str.clone(),
    };
    let call = quote!(::idem_runtime::__private::Call::<#db>);
    let body_call = quote! {
        let __idem_body: #ret = {
            let #tx_pat: #tx_ty = __idem_call.tx();
            async move #body.await
        };
    };
    // The front cache (feature `redis`) answers first, then the transaction.
    let open_plain = quote! {
        let __idem_source: ::idem_runtime::__private::Source<'_, #db> =
            ::core::convert::Into::into(__idem_source);
        if #call::cache_hit(&__idem_source, #scope, &__idem_key, &__idem_span).await {
            return ::core::result::Result::Ok(
                ::idem_runtime::__private::Outcome::Duplicate(::core::option::Option::None),
            );
        }
        let mut __idem_call =
            #call::begin(__idem_source, __idem_key, #strategy, #scope, __idem_span).await?;
    };
    let protocol = match &args.strategy {
        Strategy::StateMachine {
            table,
            id,
            id_column,
            state_column,
            key_column,
            from,
            to,
        } => {
            let id_column = id_column.as_ref().map_or("id".into(), |s| s.value());
            let state_column = state_column.as_ref().map_or("status".into(), |s| s.value());
            let key_column = match key_column {
                Some(c) => {
                    let c = c.value();
                    quote!(::core::option::Option::Some(#c))
                }
                None => quote!(::core::option::Option::None),
            };
            // Spanned at the id, so that an id type without `EntityId`
            // is reported there rather than on the whole attribute.
            let id = &id.expr;
            let id = quote_spanned!(id.span()=> ::idem_runtime::__private::entity_id(&#id));
            quote! {
                let (__idem_from, __idem_to) = ::idem_runtime::__private::states(#from, #to);
                let __idem_spec = ::idem_runtime::__private::StateMachine {
                    table: #table,
                    id_column: #id_column,
                    state_column: #state_column,
                    key_column: #key_column,
                    id: #id,
                    from: __idem_from,
                    to: __idem_to,
                };
                #open_plain
                let __idem_sql = __idem_call.state_sql(&__idem_spec)?;
                if __idem_call.state_guard(&__idem_spec, &__idem_sql).await? {
                    return __idem_call.duplicate(::core::option::Option::None).await;
                }
                #body_call
                __idem_call.state_finish(&__idem_spec, &__idem_sql, __idem_body).await
            }
        }
        Strategy::Record {
            biz_no,
            ttl_secs,
            fingerprint,
            ..
        } => {
            let biz_no = match biz_no {
                Some(b) => {
                    let e = &b.expr;
                    let e = quote_spanned!(e.span()=> &#e);
                    quote!(::core::option::Option::Some(::idem_runtime::__private::key_part(#e)))
                }
                None => quote!(::core::option::Option::None),
            };
            // Each element spanned at its parameter or field, so that a type
            // without `Serialize` is reported there.
            let payload: Vec<TokenStream> = match fingerprint {
                Some(list) => list
                    .iter()
                    .map(|f| {
                        let e = &f.expr;
                        quote_spanned!(e.span()=> &#e)
                    })
                    .collect(),
                None => h
                    .params
                    .iter()
                    .map(|(n, _)| quote_spanned!(n.span()=> &#n))
                    .collect(),
            };
            let ttl = *ttl_secs as i64;
            let fingerprint = fingerprint_call(&payload);
            // The stored result must be `Serialize + DeserializeOwned`:
            // spanned at the `Ok` type, so that is where a missing derive
            // is reported.
            let guard =
                quote_spanned!(ok.span()=> __idem_call.record_guard::<#ok>(&__idem_spec).await?);
            let finish = quote_spanned!(ok.span()=> __idem_call.record_finish(&__idem_spec, __idem_body).await);
            let replay = quote_spanned!(ok.span()=>
                #call::cache_replay::<#ok>(&__idem_source, &__idem_spec, &__idem_key, &__idem_span).await);
            quote! {
                let __idem_spec = ::idem_runtime::__private::Record {
                    biz_type: #scope,
                    biz_no: #biz_no,
                    ttl_secs: #ttl,
                    fingerprint: #fingerprint,
                };
                let __idem_source: ::idem_runtime::__private::Source<'_, #db> =
                    ::core::convert::Into::into(__idem_source);
                if let ::core::option::Option::Some(__idem_hit) = #replay {
                    return ::core::result::Result::Ok(
                        ::idem_runtime::__private::Outcome::Duplicate(::core::option::Option::Some(__idem_hit)),
                    );
                }
                let mut __idem_call =
                    #call::begin(__idem_source, __idem_key, #strategy, #scope, __idem_span).await?;
                if let ::core::option::Option::Some((__idem_stored, __idem_marker)) = #guard {
                    return __idem_call.duplicate_replay(__idem_stored, __idem_marker).await;
                }
                #body_call
                #finish
            }
        }
        Strategy::UniqueInsert { constraint } => quote! {
            #open_plain
            __idem_call.unique_guard().await?;
            #body_call
            __idem_call.unique_finish(__idem_body, #constraint).await
        },
    };
    let outer_span = format_ident!("__idem_outer_span");
    quote! {
        #(#attrs)*
        #vis async fn #name #generics (
            __idem_source: impl ::core::convert::Into<::idem_runtime::__private::Source<'_, #db>>,
            #(#params),*
        ) -> ::core::result::Result<
            ::idem_runtime::__private::Outcome<#ok>,
            ::idem_runtime::__private::Error,
        > #where_clause {
            let __idem_span = ::idem_runtime::__private::span(#name_str, #strategy);
            let #outer_span = ::core::clone::Clone::clone(&__idem_span);
            ::idem_runtime::__private::Instrument::instrument(async move {
                let __idem_key = ::idem_runtime::__private::reject_invalid(&__idem_span, #key)?;
                #protocol
            }, #outer_span).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expansion as text, whitespace-normalised.
    fn expand_to_string(attr: TokenStream, item: TokenStream) -> String {
        idempotent(attr, item)
            .to_string()
            .split_whitespace()
            .collect()
    }

    fn has(expansion: &str, code: &str) -> bool {
        let code: String = code.split_whitespace().collect();
        expansion.contains(&code)
    }

    #[test]
    fn record_is_scoped_by_its_biz_type() {
        let e = expand_to_string(
            quote!(key = "n:{m.id}", strategy = record, biz_type = "notice"),
            quote!(
                async fn send(tx: &mut Transaction<'_, Sqlite>, m: &M) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(has(&e, r#"biz_type : "notice""#), "{e}");
        assert!(
            has(
                &e,
                "cache_replay :: < () > (& __idem_source , & __idem_spec , & __idem_key , & __idem_span)"
            ),
            "{e}"
        );
        assert!(
            has(
                &e,
                r#"begin (__idem_source , __idem_key , "record" , "notice" , __idem_span)"#
            ),
            "{e}"
        );
    }

    #[test]
    fn state_machine_passes_its_key_column_and_scope() {
        let attr = |key_column: TokenStream| {
            quote!(key = "c:{m.id}", strategy = state_machine, table = "coupon", id = m.coupon_id,
                   #key_column from = S::A, to = S::B)
        };
        let item = quote!(
            async fn deduct(tx: &mut Transaction<'_, Sqlite>, m: &M) -> Result<(), E> {
                Ok(())
            }
        );
        let e = expand_to_string(attr(quote!(key_column = "last_key",)), item.clone());
        assert!(
            has(
                &e,
                r#"key_column : :: core :: option :: Option :: Some ("last_key")"#
            ),
            "{e}"
        );
        assert!(
            has(
                &e,
                r#"cache_hit (& __idem_source , "deduct" , & __idem_key , & __idem_span)"#
            ),
            "{e}"
        );
        assert!(
            has(
                &e,
                r#"begin (__idem_source , __idem_key , "state_machine" , "deduct" , __idem_span)"#
            ),
            "{e}"
        );
        let e = expand_to_string(attr(quote!()), item);
        assert!(
            has(&e, "key_column : :: core :: option :: Option :: None"),
            "{e}"
        );
    }

    #[test]
    fn unique_insert_passes_its_constraint() {
        let e = expand_to_string(
            quote!(
                key = "pay:{cb.serial}",
                strategy = unique_insert,
                constraint = "payment.serial"
            ),
            quote!(
                async fn pay(tx: &mut Transaction<'_, Sqlite>, cb: &C) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            has(&e, r#"unique_finish (__idem_body , "payment.serial")"#),
            "{e}"
        );
        assert!(
            has(
                &e,
                r#"cache_hit (& __idem_source , "pay" , & __idem_key , & __idem_span)"#
            ),
            "{e}"
        );
    }
}

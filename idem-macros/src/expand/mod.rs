//! Validation of the handler and expansion into the transactional protocol.

mod handler;
mod key_builder;
#[cfg(test)]
mod snapshots;
mod spec;

use crate::args::{self, Args, Errors, FieldPath, Strategy};
use handler::{Handler, TxForm, analyze, param_list};
use key_builder::key_builder;
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ItemFn;
use syn::spanned::Spanned;

/// `#[idempotent(...)]`: on any error, the user's function is emitted
/// unchanged, followed by the errors, so the IDE keeps working inside it.
pub(crate) fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
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

/// The one skeleton every strategy expands to: the key, the strategy's
/// spec, `Call::open` (front cache, begin, outbox update, guard; a
/// duplicate returns here), the body inline on `call.tx()`, then
/// `call.finish` (bookkeeping, commit, cache marker). The order lives in
/// `idem_runtime`'s `call` module, not here.
fn generate(args: &Args, h: &Handler, key: TokenStream) -> TokenStream {
    let ItemFn {
        attrs, vis, sig, ..
    } = h.func;
    let body = &h.func.block;
    let name = &sig.ident;
    let name_str = name.to_string();
    let generics = &sig.generics;
    let where_clause = &sig.generics.where_clause;
    let (db, ret, ok, tx_pat, tx_ty) = (&h.db, h.ret, h.ok, h.tx_pat, h.tx_ty);
    let tx = match h.tx_form {
        TxForm::Transaction => quote!(__idem_call.tx()),
        TxForm::Connection => quote!(&mut **__idem_call.tx()),
    };
    let params = h.params.iter().map(|(_, arg)| arg);
    let strategy = args.strategy.name();
    let scope = match &args.strategy {
        Strategy::Record { biz_type, .. } => biz_type.value(),
        _ => name_str.clone(),
    };
    let spec = spec::spec(&args.strategy, h, &scope);
    // Spanned at the `Ok` type: what the strategy needs of it (the record
    // strategy stores it: `Serialize + DeserializeOwned`) is reported there.
    let open = quote_spanned!(ok.span()=>
        ::idem_runtime::__private::Call::<#db>::open(
            ::core::convert::Into::into(__idem_source), __idem_key, &__idem_spec, __idem_span,
        ).await?
    );
    let finish = quote_spanned!(ok.span()=> __idem_call.finish(&__idem_spec, __idem_body).await);
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
                let __idem_spec = #spec;
                let mut __idem_call = match #open {
                    ::idem_runtime::__private::Open::Run(__idem_call) => __idem_call,
                    ::idem_runtime::__private::Open::Done(__idem_outcome) => {
                        return ::core::result::Result::Ok(__idem_outcome);
                    }
                };
                let __idem_body: #ret = {
                    let #tx_pat: #tx_ty = #tx;
                    async move #body.await
                };
                #finish
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
        assert!(has(&e, r#"span ("send" , "record")"#), "{e}");
        assert!(
            has(
                &e,
                "open (:: core :: convert :: Into :: into (__idem_source) , __idem_key , & __idem_spec , __idem_span ,)"
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
        assert!(has(&e, r#"StateMachine { scope : "deduct" ,"#), "{e}");
        assert!(has(&e, r#"span ("deduct" , "state_machine")"#), "{e}");
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
            has(
                &e,
                r#"UniqueInsert { scope : "pay" , constraint : "payment.serial" , }"#
            ),
            "{e}"
        );
        assert!(
            has(
                &e,
                "__idem_call . finish (& __idem_spec , __idem_body) . await"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_connection_parameter_gets_the_transactions_connection() {
        let e = expand_to_string(
            quote!(key = "n:{m.id}", strategy = record, biz_type = "notice"),
            quote!(
                async fn send(tx: &mut PgConnection, m: &M) -> Result<(), E> {
                    sqlx::query("").execute(&mut *tx).await?;
                    Ok(())
                }
            ),
        );
        assert!(
            has(
                &e,
                "let tx : & mut PgConnection = & mut * * __idem_call . tx () ;"
            ),
            "{e}"
        );
        assert!(
            has(
                &e,
                "Source < '_ , :: idem_runtime :: __private :: DatabaseOf < PgConnection > >"
            ),
            "{e}"
        );
        // A transaction parameter is handed over as it is.
        let e = expand_to_string(
            quote!(key = "n:{m.id}", strategy = record, biz_type = "notice"),
            quote!(
                async fn send(tx: &mut Transaction<'_, Postgres>, m: &M) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            has(
                &e,
                "let tx : & mut Transaction < '_ , Postgres > = __idem_call . tx () ;"
            ),
            "{e}"
        );
    }

    #[test]
    fn reborrowing_a_transaction_parameter_as_an_executor_says_what_to_write() {
        let e = expand_to_string(
            quote!(key = "n:{m.id}", strategy = record, biz_type = "notice"),
            quote!(
                async fn send(tx: &mut Transaction<'_, Postgres>, m: &M) -> Result<(), E> {
                    if m.ok {
                        sqlx::query("").fetch_one(&mut *tx).await?;
                    }
                    Ok(())
                }
            ),
        );
        assert!(
            e.contains("write`&mut**tx`,ordeclaretheparameterasthetransaction'sconnection,`tx:&mutPgConnection`"),
            "{e}"
        );
        // A reborrow passed to a helper of the user's is left alone.
        let e = expand_to_string(
            quote!(key = "n:{m.id}", strategy = record, biz_type = "notice"),
            quote!(
                async fn send(tx: &mut Transaction<'_, Postgres>, m: &M) -> Result<(), E> {
                    helper(&mut *tx).await?;
                    Ok(())
                }
            ),
        );
        assert!(!e.contains("compile_error"), "{e}");
    }
}

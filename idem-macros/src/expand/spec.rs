//! Each strategy's part of the expansion: the value of its spec
//! (`StateMachine`, `Record`, `UniqueInsert`), built from the attribute's
//! options. The protocol around it is the same for every strategy.

use super::handler::Handler;
use crate::args::Strategy;
use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;

/// The spec expression. `scope` is what cache markers are scoped by: the
/// record strategy's `biz_type`, elsewhere the handler's name (it only
/// scopes cache markers there, so a rename costs cache misses, never a
/// double apply).
pub(super) fn spec(strategy: &Strategy, h: &Handler, scope: &str) -> TokenStream {
    match strategy {
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
            let key_column = option(key_column.as_ref().map(|c| c.value()));
            // Spanned at the id, so that an id type without `EntityId`
            // is reported there rather than on the whole attribute.
            let id = &id.expr;
            let id = quote_spanned!(id.span()=> ::idem_runtime::__private::entity_id(&#id));
            quote! {{
                let (__idem_from, __idem_to) = ::idem_runtime::__private::states(#from, #to);
                ::idem_runtime::__private::StateMachine {
                    scope: #scope,
                    table: #table,
                    id_column: #id_column,
                    state_column: #state_column,
                    key_column: #key_column,
                    id: #id,
                    from: __idem_from,
                    to: __idem_to,
                }
            }}
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
            quote! {
                ::idem_runtime::__private::Record {
                    biz_type: #scope,
                    biz_no: #biz_no,
                    ttl_secs: #ttl,
                    fingerprint: #fingerprint,
                }
            }
        }
        Strategy::UniqueInsert { constraint } => quote! {
            ::idem_runtime::__private::UniqueInsert {
                scope: #scope,
                constraint: #constraint,
            }
        },
    }
}

fn option(v: Option<String>) -> TokenStream {
    match v {
        Some(v) => quote!(::core::option::Option::Some(#v)),
        None => quote!(::core::option::Option::None),
    }
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

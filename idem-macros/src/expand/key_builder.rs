//! The key derivation: the template's text and placeholders, as
//! `KeyBuilder::new().lit(..).part(..)…finish(validate)`.

use super::handler::{Handler, param_list};
use crate::args::{Args, Errors};
use crate::key::{self, Segment};
use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::{Ident, Pat};

/// The key derivation: `KeyBuilder::new().lit(..).part(..)…`.
pub(super) fn key_builder(args: &Args, h: &Handler, errors: &mut Errors) -> TokenStream {
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

//! `#[derive(State)]`: a field-less enum's variants as stored state names.

use proc_macro2::TokenStream;
use quote::quote;
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, LitStr};

/// Expands the derive; errors become compile errors.
pub(crate) fn derive(input: TokenStream) -> TokenStream {
    match expand(input.clone()) {
        Ok(ts) => ts,
        Err(e) => {
            let e = e.into_compile_error();
            let stub = stub_impl(input);
            quote!(#e #stub)
        }
    }
}

/// After an error, a placeholder impl so that the handlers using the type
/// do not add "`State` is not implemented" errors to the real one. It is
/// never run: the crate does not compile.
fn stub_impl(input: TokenStream) -> TokenStream {
    let Ok(input) = syn::parse2::<DeriveInput>(input) else {
        return TokenStream::new();
    };
    let ident = &input.ident;
    let (impl_g, ty_g, where_c) = input.generics.split_for_impl();
    quote! {
        impl #impl_g ::idem_runtime::State for #ident #ty_g #where_c {
            fn as_str(&self) -> &'static str {
                ::core::unreachable!()
            }
            fn parse(_: &str) -> ::core::option::Option<Self> {
                ::core::option::Option::None
            }
        }
    }
}

fn expand(input: TokenStream) -> Result<TokenStream, syn::Error> {
    let input: DeriveInput = syn::parse2(input)?;
    let Data::Enum(data) = &input.data else {
        return Err(syn::Error::new(
            input.ident.span(),
            "#[derive(State)] applies to an enum whose variants are the states",
        ));
    };
    let mut errors: Option<syn::Error> = None;
    let mut push = |e: syn::Error| match &mut errors {
        Some(all) => all.combine(e),
        None => errors = Some(e),
    };
    let mut names = Vec::new();
    for v in &data.variants {
        if !matches!(v.fields, Fields::Unit) {
            push(syn::Error::new(
                v.fields.span(),
                "state variants cannot have fields",
            ));
        }
        let mut name = screaming_snake(&v.ident.to_string());
        for attr in v.attrs.iter().filter(|a| a.path().is_ident("state")) {
            let r = attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("rename") {
                    let s: LitStr = meta.value()?.parse()?;
                    if s.value().is_empty() {
                        return Err(syn::Error::new(s.span(), "a state name cannot be empty"));
                    }
                    name = s.value();
                    Ok(())
                } else {
                    Err(meta.error("unknown state option; expected `rename = \"...\"`"))
                }
            });
            if let Err(e) = r {
                push(e);
            }
        }
        if let Some((first, _)) = names
            .iter()
            .find(|(_, n): &&(syn::Ident, String)| *n == name)
        {
            push(syn::Error::new(
                v.ident.span(),
                format!("state name `{name}` is already used by `{first}`"),
            ));
        }
        names.push((v.ident.clone(), name));
    }
    if let Some(e) = errors {
        return Err(e);
    }
    let ident = &input.ident;
    let (impl_g, ty_g, where_c) = input.generics.split_for_impl();
    let variants: Vec<_> = names.iter().map(|(v, _)| v).collect();
    let strs: Vec<_> = names.iter().map(|(_, n)| n).collect();
    Ok(quote! {
        impl #impl_g ::idem_runtime::State for #ident #ty_g #where_c {
            fn as_str(&self) -> &'static str {
                match self { #(Self::#variants => #strs,)* }
            }
            fn parse(text: &str) -> ::core::option::Option<Self> {
                match text {
                    #(#strs => ::core::option::Option::Some(Self::#variants),)*
                    _ => ::core::option::Option::None,
                }
            }
        }
    })
}

/// `PartlyRefunded` → `PARTLY_REFUNDED`.
pub(crate) fn screaming_snake(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if c.is_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            if prev.is_lowercase() || prev.is_ascii_digit() || (prev.is_uppercase() && next_lower) {
                out.push('_');
            }
        }
        out.extend(c.to_uppercase());
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn names() {
        assert_eq!(super::screaming_snake("Unused"), "UNUSED");
        assert_eq!(super::screaming_snake("PartlyRefunded"), "PARTLY_REFUNDED");
        assert_eq!(super::screaming_snake("HTTPDone"), "HTTP_DONE");
    }
}

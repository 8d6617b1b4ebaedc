//! Procedural macros of idem. Use them through `idem-runtime`, which
//! re-exports them and documents them.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod args;
mod expand;
mod key;
mod state;

use proc_macro::TokenStream;

/// See `idem_runtime::idempotent`.
#[proc_macro_attribute]
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(attr.into(), item.into()).into()
}

/// See `idem_runtime::State`.
#[proc_macro_derive(State, attributes(state))]
pub fn derive_state(input: TokenStream) -> TokenStream {
    state::derive(input.into()).into()
}

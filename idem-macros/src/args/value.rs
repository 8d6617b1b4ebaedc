//! One argument's value: a string literal, an SQL identifier, a state
//! variant, a parameter path; and the error collector.

use super::FieldPath;
use idem_syntax::is_identifier;
use proc_macro2::Span;
use syn::{Expr, Ident, LitStr, Path};

/// Collects errors so the user sees them all at once.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    /// Adds an error.
    pub(crate) fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }
    /// Adds an error at `span`.
    pub(crate) fn at(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.push(syn::Error::new(span, msg));
    }
    /// Adds an error covering all of `tokens` (a path, a type, an
    /// expression), not only their first token as `at(x.span())` does on
    /// stable Rust.
    pub(crate) fn spanned(&mut self, tokens: impl quote::ToTokens, msg: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, msg));
    }
    /// The collected errors, if any.
    pub(crate) fn finish(self) -> Result<(), syn::Error> {
        self.0.map_or(Ok(()), Err)
    }
}

pub(super) fn lit_str(e: &Expr, name: &str, errors: &mut Errors) -> Option<LitStr> {
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
pub(super) fn ident_str(e: &Expr, name: &str, errors: &mut Errors) -> Option<LitStr> {
    let s = lit_str(e, name, errors)?;
    if is_identifier(&s.value()) {
        Some(s)
    } else {
        let qualified = if name == "constraint" {
            "`table.column` on SQLite"
        } else {
            "`schema.table`"
        };
        errors.at(
            s.span(),
            format!(
                "`{name} = \"{}\"` is not a valid SQL identifier: use letters, digits and `_`, \
                 not starting with a digit, at most 63 bytes (optionally {qualified})",
                s.value()
            ),
        );
        None
    }
}

pub(super) fn state_path(e: &Expr, name: &str, errors: &mut Errors) -> Option<Path> {
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
pub(super) fn field_path(e: &Expr, name: &str, errors: &mut Errors) -> Option<FieldPath> {
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

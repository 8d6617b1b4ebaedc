//! Expansion snapshots: `tests/expand/<strategy>.rs` expanded by
//! [`idempotent`](super::idempotent) and formatted with `prettyplease` must
//! equal `tests/expand/<strategy>.expanded.rs`. `IDEM_BLESS=1` rewrites
//! them; review the diff like code.

use std::path::Path;

/// Expands every `#[idempotent(...)]` function of a source file.
fn expand_file(source: &str) -> String {
    let mut file: syn::File = syn::parse_str(source).expect("the input parses");
    let mut items = Vec::new();
    for item in file.items {
        let syn::Item::Fn(mut func) = item else {
            items.push(item);
            continue;
        };
        let Some(at) = func
            .attrs
            .iter()
            .position(|a| a.path().is_ident("idempotent"))
        else {
            items.push(syn::Item::Fn(func));
            continue;
        };
        let attr = func.attrs.remove(at);
        let args = attr
            .meta
            .require_list()
            .expect("#[idempotent(...)]")
            .tokens
            .clone();
        let expanded = super::idempotent(args, quote::quote!(#func));
        let expanded: syn::File = syn::parse2(expanded).expect("the expansion parses");
        items.extend(expanded.items);
    }
    file.items = items;
    prettyplease::unparse(&file)
}

fn check(strategy: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/expand");
    let input = std::fs::read_to_string(dir.join(format!("{strategy}.rs"))).expect("input");
    let expanded = expand_file(&input);
    let path = dir.join(format!("{strategy}.expanded.rs"));
    if std::env::var_os("IDEM_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &expanded).expect("write the snapshot");
        return;
    }
    let stored = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        stored == expanded,
        "the expansion of tests/expand/{strategy}.rs changed; rerun with IDEM_BLESS=1 and \
         review the diff. New expansion:\n{expanded}"
    );
}

#[test]
fn state_machine() {
    check("state_machine");
}

#[test]
fn record() {
    check("record");
}

#[test]
fn unique_insert() {
    check("unique_insert");
}

//! The record strategy's payload fingerprint is canonical whatever
//! serde_json's features: this crate turns on `preserve_order` (see its
//! Cargo.toml), and feature unification turns it on for idem-runtime in
//! every test build of the workspace, yet object keys are still sorted, so
//! the fingerprints of existing records do not change and a `HashMap`
//! field gives the same fingerprint on every delivery.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

#[derive(Serialize)]
struct Inner {
    z: f64,
    a: Option<i64>,
    m: BTreeMap<String, u32>,
}

/// Fields deliberately not in alphabetical order.
#[derive(Serialize)]
struct Payload {
    order_id: i64,
    amount: u64,
    currency: &'static str,
    note: String,
    tags: Vec<&'static str>,
    inner: Inner,
    flag: bool,
    nothing: Option<()>,
}

fn payload() -> Payload {
    Payload {
        order_id: -42,
        amount: 18_446_744_073_709_551_615,
        currency: "EUR",
        note: "quote \" backslash \\ tab \t nul \0 é 漢 🦀 \u{7f}".to_string(),
        tags: vec!["b", "a", "c"],
        inner: Inner {
            z: 1.5e-7,
            a: None,
            m: [
                ("é".to_string(), 2),
                ("B".to_string(), 1),
                ("a".to_string(), 3),
            ]
            .into_iter()
            .collect(),
        },
        flag: true,
        nothing: None,
    }
}

/// Computed on main before the canonical writer existed (serde_json
/// without `preserve_order`: its `Map` was a `BTreeMap`).
const GOLDEN: &str = "ddb52c4cc3d87e3355ca935658928ebdc9099e57741b224f12abff31d4c2b6e7";

#[test]
fn preserve_order_is_on_in_this_build() {
    let mut map = serde_json::Map::new();
    map.insert("b".into(), 1.into());
    map.insert("a".into(), 2.into());
    let keys: Vec<&str> = map.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["b", "a"],
        "serde_json's preserve_order must be on for these tests to mean anything"
    );
}

#[test]
fn golden_fingerprint() {
    assert_eq!(idem_runtime::fingerprint(&payload()).unwrap(), GOLDEN);
    // The same through the macro's path.
    assert_eq!(idem_runtime::fingerprint(&payload()).unwrap(), GOLDEN);
}

#[test]
fn key_order_does_not_matter() {
    let a = serde_json::json!({ "x": 1, "y": { "q": [1, 2], "p": null } });
    let b = serde_json::json!({ "y": { "p": null, "q": [1, 2] }, "x": 1 });
    assert_eq!(
        idem_runtime::fingerprint(&a).unwrap(),
        idem_runtime::fingerprint(&b).unwrap()
    );
}

#[test]
fn hash_map_gives_one_fingerprint() {
    #[derive(Serialize)]
    struct WithMap {
        id: u32,
        items: HashMap<String, u32>,
    }
    let build = || WithMap {
        id: 7,
        items: (0..64).map(|i| (format!("item-{i}"), i)).collect(),
    };
    let first = idem_runtime::fingerprint(&build()).unwrap();
    for _ in 0..50 {
        assert_eq!(idem_runtime::fingerprint(&build()).unwrap(), first);
    }
}

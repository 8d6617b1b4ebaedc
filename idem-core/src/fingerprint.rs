//! The fingerprint of a payload: hex SHA-256 of its canonical JSON.
//!
//! Canonical means: no white space, object keys sorted by their UTF-8
//! bytes at every depth, strings and numbers as serde_json writes them.
//! The sorting is done here, not left to serde_json's `Map` (a `BTreeMap`
//! only while its `preserve_order` feature is off: any crate in the build
//! can turn that on, which would change every fingerprint and make a
//! `HashMap` field fingerprint differently on each delivery). The output is
//! exactly what `serde_json::to_string` gave without `preserve_order`, so
//! stored fingerprints stay valid.

use crate::error::Error;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The fingerprint of a payload: hex SHA-256 of its canonical JSON (object
/// keys sorted by bytes, no white space), so field order and map order do
/// not matter, whatever serde_json's features.
///
/// ```
/// use serde_json::json;
/// let a = idem_runtime::fingerprint(&json!({ "b": 1, "a": [true, null] }))?;
/// let b = idem_runtime::fingerprint(&json!({ "a": [true, null], "b": 1 }))?;
/// assert_eq!(a, b);
/// assert_eq!(a.len(), 64);
/// # Ok::<(), idem_runtime::Error>(())
/// ```
pub fn fingerprint<P: Serialize + ?Sized>(payload: &P) -> Result<String, Error> {
    let value = serde_json::to_value(payload).map_err(Error::Serialization)?;
    let mut text = String::new();
    write_canonical(&value, &mut text)?;
    let digest = Sha256::digest(text.as_bytes());
    Ok(digest.iter().map(|b| format!("{b:02x}")).collect())
}

/// Appends the canonical JSON of `value` to `out`.
fn write_canonical(value: &Value, out: &mut String) -> Result<(), Error> {
    match value {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            // `str`'s order is the order of its UTF-8 bytes.
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_scalar(&Value::String(key.clone()), out)?;
                out.push(':');
                write_canonical(item, out)?;
            }
            out.push('}');
        }
        scalar => write_scalar(scalar, out)?,
    }
    Ok(())
}

/// A null, boolean, number or string, as serde_json writes it.
fn write_scalar(value: &Value, out: &mut String) -> Result<(), Error> {
    out.push_str(&serde_json::to_string(value).map_err(Error::Serialization)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canonical(v: &Value) -> String {
        let mut s = String::new();
        write_canonical(v, &mut s).unwrap();
        s
    }

    #[test]
    fn sorts_keys_at_every_depth() {
        let v = json!({ "b": { "y": 1, "x": [ { "d": 0, "c": 0 } ] }, "a": "s" });
        assert_eq!(
            canonical(&v),
            r#"{"a":"s","b":{"x":[{"c":0,"d":0}],"y":1}}"#
        );
    }

    #[test]
    fn byte_order_and_escapes() {
        let v = json!({ "é": 1, "z": 2, "Z": 3, "": 4, "a\"": "\u{0}\n\\" });
        assert_eq!(
            canonical(&v),
            "{\"\":4,\"Z\":3,\"a\\\"\":\"\\u0000\\n\\\\\",\"z\":2,\"é\":1}"
        );
    }

    #[test]
    fn scalars() {
        assert_eq!(
            canonical(&json!([null, true, -1, 1.5, u64::MAX, "x"])),
            r#"[null,true,-1,1.5,18446744073709551615,"x"]"#
        );
        assert_eq!(canonical(&json!({})), "{}");
        assert_eq!(canonical(&json!([])), "[]");
    }

    /// Without `preserve_order` (a build of this crate alone), serde_json's
    /// own output is sorted: the canonical writer gives exactly it.
    #[test]
    fn same_as_serde_json_when_its_map_is_sorted() {
        let mut probe = serde_json::Map::new();
        probe.insert("b".into(), Value::Null);
        probe.insert("a".into(), Value::Null);
        if probe.keys().next().map(String::as_str) != Some("a") {
            return; // preserve_order is on in this build
        }
        let v = json!({ "k": [1, { "z": "\u{1}", "a": 2.25e300 }], "é": false, "E": null });
        assert_eq!(canonical(&v), serde_json::to_string(&v).unwrap());
    }
}

//! Unit and property tests of the key encoding (kept beside `key.rs`, whose
//! code alone is under 500 lines).

use super::*;

#[test]
fn encodes_parts_canonically() {
    let k = KeyBuilder::new()
        .lit("a:")
        .part("x", &-7i32)
        .lit(":")
        .part("y", "q")
        .finish(None)
        .unwrap();
    assert_eq!(k, "a:-7:q");
}

/// Issue 8, item 4: parts were spliced raw, so an ID containing the
/// template's separator could forge another message's key.
#[test]
fn crafted_ids_do_not_collide() {
    let key = |topic: &str, id: &str| {
        KeyBuilder::new()
            .lit("coupon:")
            .part("msg.topic", topic)
            .lit(":")
            .part("msg.msg_id", id)
            .finish(None)
            .unwrap()
    };
    assert_ne!(key("a:b", "c"), key("a", "b:c"));
}

#[test]
fn rejects_bad_keys() {
    assert!(check_key("").is_err());
    assert!(check_key(&"k".repeat(129)).is_err());
    assert!(check_key(&"k".repeat(128)).is_ok());
    assert!(check_key("a\nb").is_err());
    let e = KeyBuilder::new()
        .lit("a:")
        .part("m.id", "")
        .finish(None)
        .unwrap_err();
    assert!(e.to_string().contains("{m.id}"), "{e}");
    assert!(!e.is_retryable());
}

#[test]
fn runs_the_validator() {
    fn digits(k: &str) -> Result<(), String> {
        if k.bytes().all(|b| b.is_ascii_digit()) {
            Ok(())
        } else {
            Err("not all digits".into())
        }
    }
    assert!(
        KeyBuilder::new()
            .part("a", "123")
            .finish(Some(digits))
            .is_ok()
    );
    let e = KeyBuilder::new()
        .part("a", "12x")
        .finish(Some(digits))
        .unwrap_err();
    assert!(e.to_string().contains("not all digits"));
}

#[test]
fn escapes_what_is_not_unreserved() {
    let enc = |raw: &str| {
        let mut out = String::new();
        escape_part(raw, &mut out);
        out
    };
    // Ordinary IDs stay readable.
    for id in [
        "ORD-1",
        "42",
        "-7",
        "a.b_c~d",
        "67e55044-10b1-426f-9247-bb680e5fe0c8",
    ] {
        assert_eq!(enc(id), id);
    }
    assert_eq!(enc("a:b"), "a%3Ab");
    assert_eq!(enc("%"), "%25");
    assert_eq!(enc("a b/c"), "a%20b%2Fc");
    assert_eq!(enc("é"), "%C3%A9");
    assert_eq!(enc("\n"), "%0A");
    let e = KeyBuilder::new()
        .lit("k:")
        .part("m.id", "evil\u{0}id")
        .finish(None)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("{m.id}` contains the control character"),
        "{e}"
    );
    // Custom `KeyPart` impls are encoded too.
    struct Pair(u8, u8);
    impl KeyPart for Pair {
        fn write_key_part(&self, out: &mut String) {
            let _ = write!(out, "{}:{}", self.0, self.1);
        }
    }
    let k = KeyBuilder::new()
        .lit("p:")
        .part("p", &Pair(1, 2))
        .finish(None)
        .unwrap();
    assert_eq!(k, "p:1%3A2");
}

#[test]
fn the_length_limit_counts_the_encoded_key() {
    // 43 raw bytes, 2 + 129 encoded.
    let raw = ":".repeat(43);
    let e = KeyBuilder::new()
        .lit("k:")
        .part("p", raw.as_str())
        .finish(None)
        .unwrap_err();
    assert!(e.to_string().contains("131 bytes"), "{e}");
    let raw = ":".repeat(42);
    assert!(
        KeyBuilder::new()
            .lit("k:")
            .part("p", raw.as_str())
            .finish(None)
            .is_ok()
    );
}

/// Injectivity over random templates that obey the compile-time rules
/// (a separator after every placeholder but the last, which may end
/// the template) and random part values.
mod injective {
    use super::super::*;
    use proptest::prelude::*;

    /// A template: leading text, then each placeholder with the text after it.
    #[derive(Debug, Clone)]
    struct Template {
        head: String,
        tails: Vec<String>,
    }

    const SEPARATORS: &str = ":/|#@,";

    fn text() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9:/|#@,._~%-]{0,5}"
    }

    fn separated() -> impl Strategy<Value = String> {
        ("[:/|#@,]", text()).prop_map(|(s, t)| s + &t)
    }

    fn template() -> impl Strategy<Value = Template> {
        (
            text(),
            proptest::collection::vec(separated(), 1..5),
            any::<bool>(),
        )
            .prop_map(|(head, mut tails, open_end)| {
                if open_end {
                    tails.last_mut().expect("one part at least").clear();
                }
                Template { head, tails }
            })
    }

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a:b%/._~|#@, -]{1,6}",
            any::<String>().prop_filter("non-empty", |s| !s.is_empty()),
            "[A-Za-z0-9-]{1,8}",
        ]
    }

    fn with_values(n: usize) -> impl Strategy<Value = Vec<String>> {
        proptest::collection::vec(value(), n)
    }

    fn encode(t: &Template, parts: &[String]) -> String {
        let mut b = KeyBuilder::new().lit(&t.head);
        for (part, tail) in parts.iter().zip(&t.tails) {
            b = b.part("p", part.as_str()).lit(tail);
        }
        // The key before `finish`: its length and control-character
        // checks are not what is tested here.
        b.key
    }

    /// Reads the parts back: each is the maximal run of unreserved
    /// characters and `%XX` escapes, ended by a separator or the end.
    fn decode(t: &Template, key: &str) -> Option<Vec<String>> {
        let mut rest = key.strip_prefix(t.head.as_str())?;
        let mut parts = Vec::new();
        for tail in &t.tails {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || "-._~%".contains(c)))
                .unwrap_or(rest.len());
            let (encoded, after) = rest.split_at(end);
            let mut bytes = Vec::new();
            let mut it = encoded.bytes();
            while let Some(b) = it.next() {
                if b == b'%' {
                    let hex = [it.next()?, it.next()?];
                    bytes.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
                } else {
                    bytes.push(b);
                }
            }
            parts.push(String::from_utf8(bytes).ok()?);
            rest = after.strip_prefix(tail.as_str())?;
        }
        rest.is_empty().then_some(parts)
    }

    fn template_and_values() -> impl Strategy<Value = (Template, Vec<String>, Vec<String>)> {
        template().prop_flat_map(|t| {
            let n = t.tails.len();
            (Just(t), with_values(n), with_values(n))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5_000))]

        #[test]
        fn keys_decode_to_their_parts((t, a, b) in template_and_values()) {
            for tail in &t.tails[..t.tails.len() - 1] {
                prop_assert!(SEPARATORS.contains(tail.chars().next().unwrap()));
            }
            let (ka, kb) = (encode(&t, &a), encode(&t, &b));
            prop_assert_eq!(decode(&t, &ka), Some(a.clone()));
            prop_assert_eq!(decode(&t, &kb), Some(b.clone()));
            // And directly: distinct parts, distinct keys.
            prop_assert_eq!(a == b, ka == kb, "{:?} {:?} → {} {}", a, b, ka, kb);
        }

        /// Part tuples that differ only by where a separator falls, the
        /// attack of issue 8: `a:b` + `c` against `a` + `b:c`.
        #[test]
        fn moved_separators_do_not_collide(
            t in template(),
            left in "[a-z]{1,4}",
            right in "[a-z]{1,4}",
            sep in "[:/|#@,%]",
        ) {
            if t.tails.len() >= 2 {
                let sep0 = t.tails[0].clone();
                let mut a: Vec<String> = vec!["x".into(); t.tails.len()];
                let mut b = a.clone();
                a[0] = format!("{left}{sep0}{right}");
                a[1] = "c".into();
                b[0] = left.clone();
                b[1] = format!("{right}{sep}c");
                if a != b {
                    prop_assert_ne!(encode(&t, &a), encode(&t, &b));
                }
            }
        }
    }
}

//! Fuzzing the payment-callback endpoint's parsing and verification
//! (the runtime verifier's signature, timestamp and serial checks, then
//! `read_callback`'s JSON and status: the endpoint's checks in its order;
//! `check_serial` /
//! `validate_serial`: the serial's format) with arbitrary bytes and
//! strings and with mutated valid callbacks: nothing panics, every
//! rejection is one of the documented answers with a non-empty, bounded
//! message, and whatever is accepted really is a signed success callback.
//! No database: these checks all run before the endpoint touches one.

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use idem_examples::payments::{
    Callback, KEY_PREFIX, Rejection, SERIAL_DIGITS, SERIAL_PREFIX, SIGNATURE_HEADER,
    TIMESTAMP_HEADER, check_serial, read_callback, serial, validate_serial, verifier,
};
use proptest::prelude::*;

const SECRET: &[u8] = b"fuzz-shared-secret";
/// Every callback is signed at, and checked at, this moment.
const NOW: i64 = 1_800_000_000;
/// Cases per property (6 properties, 24,000 in all): about 8 s in a debug
/// build.
const CASES: u32 = 4_000;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        // Failures are shrunk and reported; no files written.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A rejection is one of the documented answers, explained in a message
/// that is neither empty nor an echo of a huge input.
fn assert_clear(r: &Rejection) {
    let expected = match r.code {
        "BAD_SIGNATURE" if r.status == StatusCode::UNAUTHORIZED => StatusCode::UNAUTHORIZED,
        "BAD_SIGNATURE" | "BAD_REQUEST" | "BAD_SERIAL" => StatusCode::BAD_REQUEST,
        "UNSUPPORTED_STATUS" => StatusCode::UNPROCESSABLE_ENTITY,
        other => panic!("undocumented code {other}: {r:?}"),
    };
    assert_eq!(r.status, expected, "{r:?}");
    assert!(!r.message.trim().is_empty(), "empty message: {r:?}");
    assert!(
        r.message.len() <= 400,
        "message of {} bytes: {r:?}",
        r.message.len()
    );
}

/// What an accepted callback must be.
fn assert_accepted(cb: &Callback, body: &[u8]) {
    assert_eq!(cb.status, "SUCCESS");
    let reparsed: Callback = serde_json::from_slice(body).expect("accepted bodies parse");
    assert_eq!(&reparsed, cb);
}

fn header(sig: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(sig).ok()
}

/// The checks the endpoint runs before the database, in its order (the
/// runtime's `SignedCallback`: signature and timestamp, then the serial;
/// then `read_callback`), on a callback sent with `signature` (if any) at
/// [`NOW`].
fn parse(body: &[u8], signature: Option<&HeaderValue>) -> Result<Callback, Rejection> {
    let mut headers = HeaderMap::new();
    headers.insert(TIMESTAMP_HEADER, NOW.into());
    if let Some(s) = signature {
        headers.insert(SIGNATURE_HEADER, s.clone());
    }
    let v = verifier(SECRET);
    v.verify_at(&headers, body, NOW)
        .and_then(|_| v.serial_of(&headers, body))
        .map_err(|e| Rejection::refused(&e))?;
    read_callback(body)
}

/// The platform's signature of `body` at `timestamp`.
fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    verifier(secret).sign(timestamp, body)
}

fn valid_body(n: u64, order: i64, amount: i64) -> Vec<u8> {
    serde_json::to_vec(&Callback::success(serial(n), order, amount)).unwrap()
}

/// One edit of a byte string.
#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
}

fn apply(body: &mut Vec<u8>, edit: &Edit) {
    let at = |i: usize, len: usize| if len == 0 { 0 } else { i % len };
    match *edit {
        Edit::Flip(i, mask) if !body.is_empty() => {
            let i = at(i, body.len());
            body[i] ^= mask.max(1);
        }
        Edit::Insert(i, b) => {
            let i = at(i, body.len() + 1);
            body.insert(i, b);
        }
        Edit::Remove(i) if !body.is_empty() => {
            let i = at(i, body.len());
            body.remove(i);
        }
        Edit::Truncate(i) => body.truncate(at(i, body.len() + 1)),
        _ => {}
    }
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, m)| Edit::Flip(i, m)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<usize>().prop_map(Edit::Remove),
        any::<usize>().prop_map(Edit::Truncate),
    ]
}

/// Arbitrary JSON values, nested a little.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,40}".prop_map(Value::String),
        Just(Value::String(serial(7))),
        Just(Value::String("SUCCESS".into())),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            prop::collection::btree_map("[a-z_]{0,12}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(config())]

    /// Arbitrary bytes with an arbitrary (or no) signature header: never a
    /// panic, and never accepted unless the signature is right.
    #[test]
    fn arbitrary_bytes_and_signatures(
        body in prop::collection::vec(any::<u8>(), 0..512),
        sig in prop::option::of(prop_oneof![".{0,80}", "[0-9a-f]{64}", "[0-9A-Fa-f ]{0,70}"]),
    ) {
        let value = sig.as_deref().and_then(header);
        match parse(&body, value.as_ref()) {
            Ok(cb) => {
                let value = value.unwrap();
                let given = value.to_str().unwrap().trim().to_ascii_lowercase();
                prop_assert_eq!(given, sign(SECRET, NOW, &body));
                assert_accepted(&cb, &body);
            }
            Err(r) => assert_clear(&r),
        }
    }

    /// Arbitrary bytes, correctly signed: the JSON and status checks see
    /// them; a rejection is BAD_REQUEST or UNSUPPORTED_STATUS.
    #[test]
    fn arbitrary_signed_bytes(body in prop::collection::vec(any::<u8>(), 0..512)) {
        let sig = header(&sign(SECRET, NOW, &body));
        match parse(&body, sig.as_ref()) {
            Ok(cb) => assert_accepted(&cb, &body),
            Err(r) => {
                assert_clear(&r);
                prop_assert_ne!(r.code, "BAD_SIGNATURE");
            }
        }
    }

    /// A valid callback with a few byte edits, then either re-signed or
    /// sent with the original signature.
    #[test]
    fn mutated_valid_callbacks(
        n in any::<u64>(),
        order in any::<i64>(),
        amount in any::<i64>(),
        edits in prop::collection::vec(edit(), 1..6),
        resign in any::<bool>(),
    ) {
        let original = valid_body(n, order, amount);
        let mut body = original.clone();
        for e in &edits {
            apply(&mut body, e);
        }
        let sig = header(&sign(SECRET, NOW, if resign { &body } else { &original }));
        match parse(&body, sig.as_ref()) {
            Ok(cb) => {
                prop_assert!(resign || body == original, "accepted a body the signature is not of");
                assert_accepted(&cb, &body);
                // An accepted serial still goes through the format check.
                let _ = check_serial(&cb.serial);
            }
            Err(r) => {
                assert_clear(&r);
                if !resign && body != original {
                    prop_assert_eq!(r.code, "BAD_SIGNATURE");
                }
            }
        }
    }

    /// A valid callback with one field replaced by an arbitrary JSON value
    /// (or removed, or an extra field added), signed.
    #[test]
    fn mutated_fields(
        n in any::<u64>(),
        field in prop_oneof![
            Just("serial"), Just("order_id"), Just("amount_cents"), Just("status"), Just("extra")
        ],
        value in prop::option::of(json_value()),
    ) {
        let mut v = serde_json::to_value(Callback::success(serial(n), 1, 100)).unwrap();
        let map = v.as_object_mut().unwrap();
        match value {
            Some(x) => { map.insert(field.to_string(), x); }
            None => { map.remove(field); }
        }
        let body = serde_json::to_vec(&v).unwrap();
        let sig = header(&sign(SECRET, NOW, &body));
        match parse(&body, sig.as_ref()) {
            Ok(cb) => {
                assert_accepted(&cb, &body);
                if check_serial(&cb.serial).is_ok() {
                    let key = format!("{KEY_PREFIX}{}", cb.serial);
                    prop_assert!(validate_serial(&key).is_ok());
                }
            }
            Err(r) => assert_clear(&r),
        }
    }

    /// A tampered signature on a valid body: never accepted.
    #[test]
    fn tampered_signatures(
        n in any::<u64>(),
        edits in prop::collection::vec(edit(), 1..4),
    ) {
        let body = valid_body(n, 5, 500);
        let good = sign(SECRET, NOW, &body);
        let mut sig = good.clone().into_bytes();
        for e in &edits {
            apply(&mut sig, e);
        }
        let sig = String::from_utf8_lossy(&sig).into_owned();
        let value = header(&sig);
        match parse(&body, value.as_ref()) {
            Ok(_) => prop_assert!(
                sig.trim().eq_ignore_ascii_case(&good),
                "accepted signature {sig:?}"
            ),
            Err(r) => {
                assert_clear(&r);
                prop_assert_eq!(r.code, "BAD_SIGNATURE");
            }
        }
    }

    /// The serial's format on arbitrary text and near-misses: accepted
    /// exactly when it is the prefix and 20 ASCII digits; the rejection
    /// message is bounded whatever the input's length.
    #[test]
    fn serial_format(
        text in prop_oneof![
            ".{0,64}",
            "PAY[0-9]{18,22}",
            "PAY[0-9٠-٩０-９]{20}",
            "(pay|PAY|PAY )[0-9]{20}",
            prop::collection::vec(any::<char>(), 0..2_000).prop_map(|c| c.into_iter().collect()),
        ],
    ) {
        let expected = text
            .strip_prefix(SERIAL_PREFIX)
            .is_some_and(|d| d.len() == SERIAL_DIGITS && d.bytes().all(|b| b.is_ascii_digit()));
        match check_serial(&text) {
            Ok(()) => prop_assert!(expected, "accepted {text:?}"),
            Err(m) => {
                prop_assert!(!expected, "rejected {text:?}: {m}");
                prop_assert!(!m.is_empty() && m.len() <= 400, "message of {} bytes", m.len());
            }
        }
        let key = format!("{KEY_PREFIX}{text}");
        prop_assert_eq!(validate_serial(&key).is_ok(), expected);
        prop_assert!(validate_serial(&text).is_err() || text.starts_with(KEY_PREFIX));
    }
}

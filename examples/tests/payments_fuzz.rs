//! Fuzzing the payment-callback routes' checks before the database, in
//! the routes' order: the platform's preset (signature, timestamp, serial,
//! WeChat Pay's decryption), then the reader of its payload
//! (`stripe_payment`, `alipay_payment`, `wechatpay_payment`), on arbitrary
//! bytes and on mutated genuine notifications; and the serials' formats
//! and Alipay's amounts on arbitrary text. Nothing panics, every refusal
//! is one of the documented answers with a non-empty, bounded message, and
//! whatever is accepted really is the signed payment of an order.

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use idem_examples::payments::{
    self, ALIPAY, Charge, Merchant, Notification, PLATFORMS, Payment, PlatformKeys, Rejection,
    STRIPE, WECHATPAY, check_digits_serial, check_stripe_serial, validate_key, yuan_to_cents,
};
use idem_runtime::http::CallbackError;
use idem_runtime::http::scheme::SignatureScheme;
use proptest::prelude::*;
use std::sync::LazyLock;

/// Every notification is signed at, and checked at, this moment.
const NOW: i64 = 1_800_000_000;
/// Cases of the properties that sign no RSA signature per case.
const CASES: u32 = 2_000;
/// Cases of those that do (Alipay's and WeChat Pay's, about 5 ms each in a
/// debug build).
const RSA_CASES: u32 = 200;

static MERCHANT: LazyLock<Merchant> = LazyLock::new(Merchant::demo);
static KEYS: LazyLock<PlatformKeys> = LazyLock::new(PlatformKeys::demo);

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // Failures are shrunk and reported; no files written.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Why a callback is refused before the database: by the preset, or by
/// the payload's reader.
#[derive(Debug)]
enum Refused {
    Preset(CallbackError),
    Read(Rejection),
}

fn headers(pairs: &[(&'static str, String)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        if let Ok(v) = HeaderValue::from_str(value) {
            map.insert(HeaderName::from_static(name), v);
        }
    }
    map
}

/// The route of `platform`'s checks on `body` with `headers`, at [`NOW`].
fn check(platform: &str, headers: &HeaderMap, body: &[u8]) -> Result<Payment, Refused> {
    let body = Bytes::copy_from_slice(body);
    let m = &*MERCHANT;
    let verified = match platform {
        STRIPE => m.stripe.verify(headers, &body, NOW),
        ALIPAY => m.alipay.verify(headers, &body, NOW),
        _ => m.wechatpay.verify(headers, &body, NOW),
    }
    .map_err(Refused::Preset)?;
    let serial = verified.serial.expect("every preset names a serial");
    let read = match platform {
        STRIPE => payments::stripe_payment(&serial, &verified.payload),
        ALIPAY => payments::alipay_payment(&serial, &verified.payload),
        _ => payments::wechatpay_payment(&serial, &verified.payload),
    };
    read.map_err(Refused::Read)
}

/// A refusal is one of the documented answers, explained in a message that
/// is neither empty nor an echo of a huge input.
fn assert_clear(r: &Refused) {
    let (status, message) = match r {
        Refused::Preset(e) => (e.status(), e.to_string()),
        Refused::Read(r) => {
            let expected = match r.code {
                "BAD_REQUEST" => StatusCode::BAD_REQUEST,
                "UNSUPPORTED_STATUS" | "OTHER_MERCHANT" | "AMOUNT_MISMATCH" => {
                    StatusCode::UNPROCESSABLE_ENTITY
                }
                other => panic!("undocumented code {other}: {r:?}"),
            };
            assert_eq!(r.status, expected, "{r:?}");
            (r.status, r.message.clone())
        }
    };
    assert!(
        status == StatusCode::BAD_REQUEST
            || status == StatusCode::UNAUTHORIZED
            || status == StatusCode::UNPROCESSABLE_ENTITY,
        "{r:?}"
    );
    assert!(!message.trim().is_empty(), "empty message: {r:?}");
    assert!(
        message.len() <= 400,
        "message of {} bytes: {r:?}",
        message.len()
    );
}

/// An accepted payment is one an order can be booked under: its key
/// passes the handler's `validate`.
fn assert_bookable(p: &Payment) {
    let key = format!("{}{}:{}", payments::KEY_PREFIX, p.platform, p.serial);
    assert!(validate_key(&key).is_ok(), "{p:?}");
    assert!(p.amount_cents > 0, "{p:?}");
}

fn genuine(platform: &'static str, n: u64, order_id: i64, amount_cents: i64) -> Notification {
    let charge = Charge {
        platform,
        serial: payments::serial(platform, n),
        order_id,
        amount_cents,
    };
    Notification::new(&KEYS, &charge, NOW)
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

fn platform() -> impl Strategy<Value = &'static str> {
    prop::sample::select(PLATFORMS.to_vec())
}

/// Arbitrary JSON values, nested a little.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,40}".prop_map(Value::String),
        Just(Value::String("succeeded".into())),
        Just(Value::String("SUCCESS".into())),
        Just(Value::String("cny".into())),
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
    #![proptest_config(config(CASES))]

    /// Arbitrary bytes with arbitrary signature headers, on every route:
    /// never a panic, never accepted.
    #[test]
    fn arbitrary_bytes_and_headers(
        p in platform(),
        body in prop::collection::vec(any::<u8>(), 0..512),
        sig in ".{0,120}",
        ts in prop_oneof![Just(NOW.to_string()), ".{0,12}"],
    ) {
        let h = headers(&[
            ("stripe-signature", format!("t={ts},v1={sig}")),
            ("wechatpay-timestamp", ts.clone()),
            ("wechatpay-nonce", "N".into()),
            ("wechatpay-serial", "PUB_KEY_ID_DEMO_1".into()),
            ("wechatpay-signature", sig),
        ]);
        match check(p, &h, &body) {
            Ok(payment) => prop_assert!(false, "accepted unsigned bytes: {payment:?}"),
            Err(r) => assert_clear(&r),
        }
    }

    /// Arbitrary bytes signed as Stripe signs: the reader sees them; a
    /// refusal is its own, or the serial's.
    #[test]
    fn arbitrary_bytes_signed_by_stripe(body in prop::collection::vec(any::<u8>(), 0..512)) {
        let n = genuine(STRIPE, 1, 2, 100).with_body(body.clone());
        match check(STRIPE, &headers(&n.headers(NOW)), &body) {
            Ok(payment) => assert_bookable(&payment),
            Err(Refused::Preset(e)) => prop_assert!(matches!(e, CallbackError::BadSerial(_)), "{e:?}"),
            Err(r) => assert_clear(&r),
        }
    }

    /// A genuine Stripe event with one field of its object replaced by an
    /// arbitrary JSON value (or removed), signed: refused clearly, or read
    /// as exactly what it says.
    #[test]
    fn stripe_events_with_a_field_replaced(
        order in 1i64..1_000_000,
        field in prop_oneof![
            Just("amount_received"), Just("amount_total"), Just("currency"), Just("status"),
            Just("payment_status"), Just("metadata"), Just("client_reference_id"), Just("extra"),
        ],
        value in prop::option::of(json_value()),
    ) {
        let n = genuine(STRIPE, 7, order, 100);
        let mut event: serde_json::Value = serde_json::from_slice(&n.body).unwrap();
        let object = event["data"]["object"].as_object_mut().unwrap();
        match value {
            Some(v) => { object.insert(field.into(), v); }
            None => { object.remove(field); }
        }
        let body = serde_json::to_vec(&event).unwrap();
        let n = n.with_body(body.clone());
        let object = &event["data"]["object"];
        let (reference, amount) = match event["type"].as_str() {
            Some("payment_intent.succeeded") => (&object["metadata"]["order_id"], &object["amount_received"]),
            _ => (&object["client_reference_id"], &object["amount_total"]),
        };
        match check(STRIPE, &headers(&n.headers(NOW)), &body) {
            Ok(p) => {
                assert_bookable(&p);
                let order = p.order_id.to_string();
                prop_assert_eq!(Some(order.as_str()), reference.as_str());
                prop_assert_eq!(Some(p.amount_cents), amount.as_i64());
            }
            Err(r) => assert_clear(&r),
        }
    }

    /// The serials' formats on arbitrary text and near-misses: accepted
    /// exactly when they are what the platform writes; the key's check
    /// agrees; messages bounded whatever the input's length.
    #[test]
    fn serial_formats(
        text in prop_oneof![
            ".{0,64}",
            "evt_[A-Za-z0-9]{0,70}",
            "[0-9]{14,34}",
            "[0-9٠-٩０-９]{20}",
            prop::collection::vec(any::<char>(), 0..2_000).prop_map(|c| c.into_iter().collect()),
        ],
    ) {
        let stripe = text.strip_prefix("evt_").is_some_and(|r| {
            (1..=64).contains(&r.len()) && r.bytes().all(|b| b.is_ascii_alphanumeric())
        });
        let digits = (16..=32).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit());
        for (got, expected) in [(check_stripe_serial(&text), stripe), (check_digits_serial(&text), digits)] {
            match got {
                Ok(()) => prop_assert!(expected, "accepted {text:?}"),
                Err(m) => {
                    prop_assert!(!expected, "refused {text:?}: {m}");
                    prop_assert!(!m.is_empty() && m.len() <= 400, "message of {} bytes", m.len());
                }
            }
        }
        let key = |p: &str| format!("{}{p}:{text}", payments::KEY_PREFIX);
        prop_assert_eq!(validate_key(&key(STRIPE)).is_ok(), stripe);
        prop_assert_eq!(validate_key(&key(ALIPAY)).is_ok(), digits);
        prop_assert_eq!(validate_key(&key(WECHATPAY)).is_ok(), digits);
        prop_assert!(validate_key(&key("paypal")).is_err());
    }

    /// Alipay's amounts: what `yuan_to_cents` accepts is a decimal with at
    /// most two places, read exactly.
    #[test]
    fn alipay_amounts(
        text in prop_oneof![".{0,16}", "[0-9]{0,13}(\\.[0-9]{0,3})?", "-?[0-9]{1,3}\\.[0-9]{2}"],
    ) {
        let (whole, frac) = text.split_once('.').unwrap_or((&text, ""));
        let well_formed = !whole.is_empty()
            && whole.len() <= 12
            && whole.bytes().all(|b| b.is_ascii_digit())
            && frac.bytes().all(|b| b.is_ascii_digit())
            && frac.len() <= 2
            && (!frac.is_empty() || !text.contains('.'));
        match yuan_to_cents(&text) {
            Some(cents) => {
                prop_assert!(well_formed, "accepted {text:?}");
                let back = format!("{}.{:02}", cents / 100, cents % 100);
                let padded = format!("{whole}.{frac:0<2}");
                prop_assert_eq!(back.parse::<f64>().unwrap(), padded.parse::<f64>().unwrap());
            }
            None => prop_assert!(!well_formed, "refused {text:?}"),
        }
    }
}

proptest! {
    #![proptest_config(config(RSA_CASES))]

    /// A genuine notification of any platform with a few byte edits, sent
    /// with its original signature: accepted only unedited (Alipay's: only
    /// with the same signed parameters, values decoded, empty ones aside).
    #[test]
    fn mutated_notifications(
        p in platform(),
        n in any::<u64>(),
        order in 1i64..1_000_000,
        amount in 1i64..10_000_000,
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        let note = genuine(p, n, order, amount);
        let h = headers(&note.headers(NOW));
        let mut body = note.body.clone();
        for e in &edits {
            apply(&mut body, e);
        }
        match check(p, &h, &body) {
            Ok(payment) => {
                prop_assert!(same_signed(p, &body, &note.body), "accepted a body the signature is not of");
                prop_assert_eq!((payment.order_id, payment.amount_cents), (order, amount));
            }
            Err(r) => {
                assert_clear(&r);
                if !same_signed(p, &body, &note.body) {
                    let refused_by_preset = matches!(r, Refused::Preset(_));
                    prop_assert!(refused_by_preset, "{r:?}");
                }
            }
        }
    }

    /// An Alipay form or a WeChat Pay resource with one field replaced by
    /// arbitrary text (or left out), signed (and encrypted) by the
    /// platform: refused clearly, or read as exactly what it says.
    #[test]
    fn rsa_notifications_with_a_field_replaced(
        wechat in any::<bool>(),
        order in 1i64..1_000_000,
        field in prop_oneof![
            Just("trade_status"), Just("trade_state"), Just("app_id"), Just("mchid"),
            Just("total_amount"), Just("out_trade_no"), Just("trade_no"), Just("transaction_id"),
        ],
        value in prop::option::of(prop_oneof![".{0,24}", "[0-9]{0,24}", "[0-9]{1,5}\\.[0-9]{2}"]),
    ) {
        let (p, body, h) = if wechat {
            replaced_wechatpay(order, field, value.as_deref())
        } else {
            replaced_alipay(order, field, value.as_deref())
        };
        match check(p, &h, &body) {
            Ok(payment) => {
                assert_bookable(&payment);
                prop_assert_eq!(payment.platform.as_str(), p);
            }
            Err(r) => assert_clear(&r),
        }
    }
}

/// Whether `a` and `b` are one signed content: the same bytes, or for
/// Alipay the same parameters as signed.
fn same_signed(platform: &str, a: &[u8], b: &[u8]) -> bool {
    use idem_runtime::http::scheme::Alipay;
    let signed = |body: &[u8]| Alipay::parse_form(body).map(|f| Alipay::signed_content(&f));
    a == b || (platform == ALIPAY && signed(a).is_ok_and(|s| Ok(s) == signed(b)))
}

/// An Alipay form with `field` set to `value` (or left out), signed.
fn replaced_alipay(
    order: i64,
    field: &str,
    value: Option<&str>,
) -> (&'static str, Vec<u8>, HeaderMap) {
    use base64::Engine as _;
    use rsa::signature::{SignatureEncoding as _, Signer as _};
    let note = genuine(ALIPAY, 3, order, 1234);
    let mut form: Vec<(String, String)> = form_urlencoded::parse(&note.body)
        .into_owned()
        .filter(|(k, _)| k != "sign" && k != "sign_type" && k != field)
        .collect();
    if let Some(v) = value {
        form.push((field.into(), v.into()));
    }
    let mut signed: Vec<&(String, String)> = form.iter().filter(|(_, v)| !v.is_empty()).collect();
    signed.sort();
    let content: Vec<String> = signed.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let sig = KEYS.alipay.sign(content.join("&").as_bytes()).to_bytes();
    form.push((
        "sign".into(),
        base64::engine::general_purpose::STANDARD.encode(sig),
    ));
    form.push(("sign_type".into(), "RSA2".into()));
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&form)
        .finish();
    (ALIPAY, body.into_bytes(), HeaderMap::new())
}

/// A WeChat Pay notification whose resource has `field` set to `value` (or
/// left out), encrypted and signed.
fn replaced_wechatpay(
    order: i64,
    field: &str,
    value: Option<&str>,
) -> (&'static str, Vec<u8>, HeaderMap) {
    use aes_gcm::aead::{Aead as _, KeyInit as _, Payload};
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let note = genuine(WECHATPAY, 3, order, 1234);
    let mut outer: serde_json::Value = serde_json::from_slice(&note.body).unwrap();
    let resource = &outer["resource"];
    let nonce = resource["nonce"].as_str().unwrap().to_owned();
    let cipher = aes_gcm::Aes256Gcm::new(&KEYS.apiv3_key.into());
    let aes_nonce = aes_gcm::Nonce::try_from(nonce.as_bytes()).unwrap();
    let sealed = b64
        .decode(resource["ciphertext"].as_str().unwrap())
        .unwrap();
    let aad = b"transaction";
    let plain = cipher
        .decrypt(&aes_nonce, Payload { msg: &sealed, aad })
        .unwrap();
    let mut inner: serde_json::Value = serde_json::from_slice(&plain).unwrap();
    let object = inner.as_object_mut().unwrap();
    match value {
        Some(v) => object.insert(field.into(), v.into()),
        None => object.remove(field),
    };
    let plain = serde_json::to_vec(&inner).unwrap();
    let sealed = cipher
        .encrypt(&aes_nonce, Payload { msg: &plain, aad })
        .unwrap();
    outer["resource"]["ciphertext"] = b64.encode(sealed).into();
    let body = serde_json::to_vec(&outer).unwrap();
    let note = note.with_body(body.clone());
    (WECHATPAY, body, headers(&note.headers(NOW)))
}

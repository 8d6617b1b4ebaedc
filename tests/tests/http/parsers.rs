//! Property tests (proptest) of the HTTP layer's parsers over arbitrary
//! input: the `Idempotency-Key` header and the callback signature and
//! timestamp headers. None panics; the key parser accepts exactly the
//! draft's keys (bare tokens and quoted strings of printable ASCII, at
//! most `MAX_IDEMPOTENCY_KEY_LEN` bytes) and gives back what the client
//! meant; the verifier accepts a signature only for the signed bytes, and
//! refuses any change to the body, the timestamp or the signature.
//! Each property runs `CASES` cases (the closing note gives the total).

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use idem_runtime::http::{CallbackVerifier, IdempotencyKey, MAX_IDEMPOTENCY_KEY_LEN};
use proptest::prelude::*;

const CASES: u32 = 2_000;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        ..ProptestConfig::default()
    }
}

/// The key a quoted header value means, if it is one.
fn unquoted(value: &[u8]) -> Option<Vec<u8>> {
    let inner = value.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    let mut out = Vec::new();
    let mut bytes = inner.iter();
    while let Some(&c) = bytes.next() {
        match c {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(e),
                _ => return None,
            },
            b'"' => return None,
            c if (0x20..=0x7e).contains(&c) => out.push(c),
            _ => return None,
        }
    }
    Some(out)
}

fn quote(key: &str) -> String {
    let mut q = String::from("\"");
    for c in key.chars() {
        if c == '"' || c == '\\' {
            q.push('\\');
        }
        q.push(c);
    }
    q.push('"');
    q
}

/// The input proptest drew once for `keys_round_trip` (a full CI run,
/// 2026-12-04), whose bare reading the property then expected refused:
/// a value that is a quoted string means the key inside it.
#[test]
fn a_drawn_key_that_is_a_quoted_string_means_its_content() {
    let key = IdempotencyKey::parse(br#""A""#).expect("a quoted key");
    assert_eq!(key.as_str(), "A");
    let key = IdempotencyKey::parse(br#" "A" "#).expect("a quoted key in white space");
    assert_eq!(key.as_str(), "A");
}

proptest! {
    #![proptest_config(config())]

    /// Any bytes: an answer, never a panic; what is accepted is
    /// printable ASCII within the bound.
    #[test]
    fn the_key_parser_takes_any_bytes(value in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(key) = IdempotencyKey::parse(&value) {
            let k = key.as_str();
            prop_assert!(!k.is_empty() && k.len() <= MAX_IDEMPOTENCY_KEY_LEN);
            prop_assert!(k.bytes().all(|c| (0x20..=0x7e).contains(&c)));
        }
    }

    /// A quoted key of printable ASCII parses back to itself; a bare
    /// token too.
    #[test]
    fn keys_round_trip(key in "[ -~]{1,128}") {
        let quoted = quote(&key);
        let parsed = IdempotencyKey::parse(quoted.as_bytes()).expect("a quoted printable key");
        prop_assert_eq!(parsed.as_str(), key.as_str());
        // Bare: the header's surrounding white space is not the key's.
        let bare = key.trim_matches([' ', '\t']);
        let bare_ok = !bare.is_empty()
            && bare.bytes().all(|c| (0x21..=0x7e).contains(&c) && !b"\"\\,;".contains(&c));
        match IdempotencyKey::parse(key.as_bytes()) {
            // A key that is itself a quoted string (`"A"`, drawn now and
            // then) means its content, not itself.
            Ok(k) if bare.starts_with('"') => {
                let inner = unquoted(bare.as_bytes());
                prop_assert_eq!(Some(k.as_str().as_bytes().to_vec()), inner, "{:?}", key);
            }
            Ok(k) => {
                prop_assert!(bare_ok, "accepted a bare key with a separator: {key:?}");
                prop_assert_eq!(k.as_str(), bare);
            }
            Err(_) => prop_assert!(!bare_ok, "refused a bare token: {key:?}"),
        }
    }

    /// A quoted value's meaning agrees with an independent reading of the
    /// draft's grammar.
    #[test]
    fn quoted_values_mean_what_the_grammar_says(inner in proptest::collection::vec(any::<u8>(), 0..80)) {
        let mut value = vec![b'"'];
        value.extend(&inner);
        value.push(b'"');
        let expected = unquoted(&value).filter(|k| !k.is_empty() && k.len() <= MAX_IDEMPOTENCY_KEY_LEN);
        match IdempotencyKey::parse(&value) {
            Ok(k) => prop_assert_eq!(Some(k.as_str().as_bytes().to_vec()), expected),
            Err(_) => prop_assert!(expected.is_none(), "refused {value:?}"),
        }
    }

    /// Any signature and timestamp header values: refused without a panic,
    /// unless they are the real ones.
    #[test]
    fn the_verifier_takes_any_headers(
        sig in proptest::collection::vec(any::<u8>(), 0..100),
        ts in proptest::collection::vec(any::<u8>(), 0..30),
        body in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let v = CallbackVerifier::new(b"prop-secret".to_vec());
        let mut headers = HeaderMap::new();
        let names: Vec<HeaderName> = v.signed_headers(&body).into_iter().map(|(n, _)| n).collect();
        if let (Ok(s), Ok(t)) = (HeaderValue::from_bytes(&sig), HeaderValue::from_bytes(&ts)) {
            headers.insert(names[0].clone(), s);
            if let Some(name) = names.get(1) {
                headers.insert(name.clone(), t);
            }
            let _ = v.verify_at(&headers, &body, 1_700_000_000);
        }
    }

    /// The real signature verifies; any change to the body, the timestamp
    /// or a signature byte is refused.
    #[test]
    fn only_the_signed_bytes_verify(
        body in proptest::collection::vec(any::<u8>(), 0..200),
        flip in any::<usize>(),
        ts in 1_600_000_000i64..1_800_000_000,
    ) {
        let v = CallbackVerifier::new(b"prop-secret".to_vec());
        let names: Vec<HeaderName> = v.signed_headers(&body).into_iter().map(|(n, _)| n).collect();
        let headers = |sig: &str, ts: i64| {
            let mut h = HeaderMap::new();
            h.insert(names[0].clone(), HeaderValue::from_str(sig).unwrap());
            if let Some(name) = names.get(1) {
                h.insert(name.clone(), HeaderValue::from_str(&ts.to_string()).unwrap());
            }
            h
        };
        let sig = v.sign(ts, &body);
        prop_assert!(v.verify_at(&headers(&sig, ts), &body, ts).is_ok());
        if !body.is_empty() {
            let mut changed = body.clone();
            changed[flip % body.len()] ^= 0x01;
            prop_assert!(v.verify_at(&headers(&sig, ts), &changed, ts).is_err());
        }
        prop_assert!(v.verify_at(&headers(&sig, ts + 1), &body, ts + 1).is_err());
        let mut bad: Vec<char> = sig.chars().collect();
        let at = flip % bad.len();
        bad[at] = if bad[at] == '0' { '1' } else { '0' };
        let bad: String = bad.into_iter().collect();
        prop_assert!(v.verify_at(&headers(&bad, ts), &body, ts).is_err());
    }
}

/// The presets' header parsers (`idem_runtime::http::scheme`).
mod presets {
    use super::*;
    use idem_runtime::http::SignatureScheme;
    use idem_runtime::http::scheme::{
        Adyen, Alipay, GitHub, Paddle, Shopify, SignatureHeader, StandardWebhooks, Stripe,
        WeChatPay,
    };

    /// A test key (tests/http/keys/README.md), never a platform's.
    const PUBLIC_KEY: &str = include_str!("keys/old.pub.pem");

    fn wechat() -> WeChatPay {
        WeChatPay::new(
            "PUB_KEY_ID_OLD",
            PUBLIC_KEY,
            b"idem-test-apiv3-key-32-bytes-ok!",
        )
        .unwrap()
    }

    type Parse = fn(&str) -> Result<SignatureHeader, idem_runtime::http::CallbackError>;
    type Format = fn(&SignatureHeader) -> String;

    /// Each preset's parser and writer.
    fn parsers() -> [(&'static str, Parse, Format); 8] {
        [
            ("stripe", Stripe::parse_header, Stripe::format_header),
            (
                "standard",
                StandardWebhooks::parse_header,
                StandardWebhooks::format_header,
            ),
            ("github", GitHub::parse_header, GitHub::format_header),
            ("shopify", Shopify::parse_header, Shopify::format_header),
            ("paddle", Paddle::parse_header, Paddle::format_header),
            ("alipay", Alipay::parse_header, Alipay::format_header),
            ("wechat", WeChatPay::parse_header, WeChatPay::format_header),
            ("adyen", Adyen::parse_header, Adyen::format_header),
        ]
    }

    /// Header-like text: the presets' keys and separators, hex and base64
    /// digits, and anything else now and then.
    fn header_text() -> impl Strategy<Value = String> {
        prop_oneof![
            "((t|ts|v0|v1|h1|sha256|x)[=,]?[0-9a-fA-F+/=]{0,70}[,; ]?){0,5}",
            "(v1,[A-Za-z0-9+/]{42,44}={0,2} ?){0,3}",
            "sha256=[0-9a-fA-F]{60,66}",
            ".{0,120}",
        ]
    }

    fn tags() -> impl Strategy<Value = Vec<Vec<u8>>> {
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 32), 1..4)
    }

    proptest! {
        #![proptest_config(config())]

        /// No input panics a parser; what one accepts, written back and
        /// parsed again, is the same header.
        #[test]
        fn parsed_headers_round_trip(text in header_text()) {
            for (name, parse, format) in parsers() {
                if let Ok(h) = parse(&text) {
                    let again = parse(&format(&h));
                    prop_assert_eq!(again.as_ref(), Ok(&h), "{}: {:?} -> {:?}", name, text, format(&h));
                }
            }
        }

        /// A header written from signatures (and a timestamp) parses back
        /// to them.
        #[test]
        fn written_headers_parse_back(sigs in tags(), ts in 0i64..=i64::MAX) {
            let many = [
                (Stripe::parse_header as Parse, Stripe::format_header as Format, Some(ts)),
                (Paddle::parse_header, Paddle::format_header, Some(ts)),
                (StandardWebhooks::parse_header, StandardWebhooks::format_header, None),
            ];
            for (parse, format, ts) in many {
                let h = SignatureHeader::new(ts, sigs.clone());
                prop_assert_eq!(parse(&format(&h)), Ok(h));
            }
            let one = SignatureHeader::new(None, sigs[..1].to_vec());
            prop_assert_eq!(GitHub::parse_header(&GitHub::format_header(&one)), Ok(one.clone()));
            prop_assert_eq!(Shopify::parse_header(&Shopify::format_header(&one)), Ok(one.clone()));
            prop_assert_eq!(Alipay::parse_header(&Alipay::format_header(&one)), Ok(one.clone()));
            prop_assert_eq!(WeChatPay::parse_header(&WeChatPay::format_header(&one)), Ok(one.clone()));
            prop_assert_eq!(Adyen::parse_header(&Adyen::format_header(&one)), Ok(one));
        }

        /// Every preset takes any header values without panicking, and
        /// refuses them unless they are the real ones.
        #[test]
        fn the_presets_take_any_headers(
            a in header_text(),
            b in proptest::collection::vec(any::<u8>(), 0..30),
            body in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let body = axum::body::Bytes::from(body);
            let schemes: [(Box<dyn SignatureScheme>, &[&str]); 8] = [
                (Box::new(Stripe::new("k")), &["stripe-signature"]),
                (Box::new(StandardWebhooks::new("whsec_a2V5").unwrap()), &["webhook-signature", "webhook-timestamp", "webhook-id"]),
                (Box::new(GitHub::new("k")), &["x-hub-signature-256"]),
                (Box::new(Shopify::new("k")), &["x-shopify-hmac-sha256"]),
                (Box::new(Paddle::new("k")), &["paddle-signature"]),
                // Alipay signs the form alone: the body is its input.
                (Box::new(Alipay::new(PUBLIC_KEY).unwrap()), &["sign"]),
                (Box::new(Adyen::new("6b").unwrap()), &["sign"]),
                (Box::new(wechat()), &["wechatpay-signature", "wechatpay-timestamp", "wechatpay-nonce", "wechatpay-serial"]),
            ];
            for (scheme, names) in schemes {
                let mut headers = HeaderMap::new();
                if let Ok(v) = HeaderValue::from_str(&a) {
                    headers.insert(HeaderName::from_static(names[0]), v);
                }
                for name in &names[1..] {
                    if let Ok(v) = HeaderValue::from_bytes(&b) {
                        headers.insert(HeaderName::from_static(name), v);
                    }
                }
                prop_assert!(scheme.verify(&headers, &body, 1_700_000_000).is_err());
            }
        }

        /// Any bytes as an Alipay form: an answer, never a panic; a form
        /// accepted has each name once, and its signed content leaves out
        /// `sign`, `sign_type` and empty values.
        #[test]
        fn alipay_forms_take_any_bytes(body in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(params) = Alipay::parse_form(&body) {
                let content = Alipay::signed_content(&params);
                for (name, value) in &params {
                    let signed = name != "sign" && name != "sign_type" && !value.is_empty();
                    let pair = format!("{name}={value}");
                    prop_assert!(!signed || content.contains(&pair), "{pair} not in {content}");
                }
                let body = axum::body::Bytes::from(body);
                let alipay = Alipay::new(PUBLIC_KEY).unwrap();
                prop_assert!(alipay.verify(&HeaderMap::new(), &body, 1_700_000_000).is_err());
            }
        }

        /// A form written from parameters parses back to them, and signs
        /// their content sorted by name.
        #[test]
        fn alipay_forms_round_trip(
            params in proptest::collection::btree_map("[a-z_]{1,12}", "[^\\x{FFFD}]{0,20}", 0..8),
        ) {
            let params: Vec<(String, String)> = params
                .into_iter()
                .filter(|(n, _)| n != "charset")
                .collect();
            let mut form = form_urlencoded::Serializer::new(String::new());
            // Written in reverse: the content is sorted whatever the order.
            for (n, v) in params.iter().rev() {
                form.append_pair(n, v);
            }
            let parsed = Alipay::parse_form(form.finish().as_bytes()).expect("a form");
            let mut sorted = parsed.clone();
            sorted.sort();
            prop_assert_eq!(&sorted, &params);
            let expected: Vec<String> = params
                .iter()
                .filter(|(n, v)| n != "sign" && n != "sign_type" && !v.is_empty())
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            prop_assert_eq!(Alipay::signed_content(&parsed), expected.join("&"));
        }

        /// Any bytes as a WeChat Pay notification: refused without a panic
        /// (no resource, not AES-256-GCM, not under the APIv3 key).
        #[test]
        fn wechat_pay_bodies_take_any_bytes(
            body in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..300),
                r#"\{"id":"EV-1","resource":\{"algorithm":"AEAD_AES_256_GCM","ciphertext":"[A-Za-z0-9+/]{0,60}={0,2}","nonce":".{0,14}"(,"associated_data":".{0,10}")?\}\}"#
                    .prop_map(String::into_bytes),
            ],
        ) {
            prop_assert!(wechat().decrypt(&body).is_err());
        }

        /// Any item fields: the signed content has the eight fields, and
        /// the item signed verifies; any change to a signed field, or to a
        /// signature byte, is refused.
        #[test]
        fn adyen_items_sign_and_verify(
            psp in "[A-Z0-9]{1,20}",
            merchant in "[ -~]{0,30}",
            value in any::<i64>(),
            event in "[A-Z_]{1,20}",
            flip in any::<usize>(),
        ) {
            let adyen = Adyen::new("44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056").unwrap();
            let mut item = serde_json::json!({
                "pspReference": psp, "merchantAccountCode": "M", "merchantReference": merchant,
                "amount": {"value": value, "currency": "EUR"}, "eventCode": event, "success": "true",
            });
            let content = Adyen::signed_content(&item);
            prop_assert_eq!(content.matches(':').count(), 7 + merchant.matches(':').count());
            let sig = adyen.sign(&item);
            item["additionalData"] = serde_json::json!({"hmacSignature": sig});
            let body = |item: &serde_json::Value| {
                axum::body::Bytes::from(serde_json::json!({"notificationItems": [{"NotificationRequestItem": item}]}).to_string())
            };
            let v = adyen.verify(&HeaderMap::new(), &body(&item), 1_700_000_000).expect("signed");
            prop_assert_eq!(v.serial, Some(format!("{psp}:{event}")));
            let mut changed = item.clone();
            changed["amount"]["value"] = serde_json::json!(value.wrapping_add(1));
            prop_assert!(adyen.verify(&HeaderMap::new(), &body(&changed), 1_700_000_000).is_err());
            let mut tag = base64_decode(&sig);
            let at = flip % tag.len();
            tag[at] ^= 0x01;
            let mut forged = item.clone();
            forged["additionalData"]["hmacSignature"] = Adyen::format_header(&SignatureHeader::new(None, vec![tag])).into();
            prop_assert!(adyen.verify(&HeaderMap::new(), &body(&forged), 1_700_000_000).is_err());
        }

        /// Any bytes as an Adyen notification: refused without a panic.
        #[test]
        fn adyen_bodies_take_any_bytes(
            body in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..300),
                r#"\{"notificationItems":\[(\{"NotificationRequestItem":\{"pspReference":"[A-Z0-9]{0,5}"(,"additionalData":\{"hmacSignature":"[A-Za-z0-9+/]{40,44}={0,2}"\})?\}\},?){0,2}\]\}"#
                    .prop_map(String::into_bytes),
            ],
        ) {
            let adyen = Adyen::new("6b").unwrap();
            let body = axum::body::Bytes::from(body);
            prop_assert!(adyen.verify(&HeaderMap::new(), &body, 1_700_000_000).is_err());
        }
    }

    fn base64_decode(s: &str) -> Vec<u8> {
        Adyen::parse_header(s).expect("base64").signatures.remove(0)
    }
}

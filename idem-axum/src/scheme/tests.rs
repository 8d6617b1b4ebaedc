use super::*;
use axum::http::{HeaderName, HeaderValue, StatusCode};

const NOW: i64 = 1_700_000_000;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in pairs {
        h.append(
            HeaderName::from_bytes(n.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

fn body(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

#[test]
fn stripe_rotation_unknown_schemes_tolerance() {
    let old = Stripe::new("whsec_old");
    let both = Stripe::new("whsec_old").secret("whsec_new");
    let new = Stripe::new("whsec_new");
    let b = body(r#"{"id":"evt_1","type":"charge.succeeded"}"#);
    let signed = new.sign(NOW, &b);
    // Signed with the new secret: the rolling endpoint accepts it, the old one not.
    let v = both
        .verify(&headers(&[("stripe-signature", &signed)]), &b, NOW)
        .unwrap();
    assert_eq!(v.serial.as_deref(), Some("evt_1"));
    assert_eq!(v.timestamp, Some(NOW));
    assert_eq!(
        old.verify(&headers(&[("stripe-signature", &signed)]), &b, NOW),
        Err(CallbackError::BadSignature)
    );
    // Both signatures sent, a v0 before them: ignored.
    let two = both.sign(NOW, &b);
    assert_eq!(two.matches(",v1=").count(), 2);
    let with_v0 = two.replacen(",", &format!(",v0={},", "ab".repeat(32)), 1);
    assert!(
        old.verify(&headers(&[("stripe-signature", &with_v0)]), &b, NOW)
            .is_ok()
    );
    // Stale, tampered, malformed.
    let h = headers(&[("stripe-signature", &signed)]);
    assert_eq!(
        new.verify(&h, &b, NOW + 301),
        Err(CallbackError::StaleTimestamp { age_secs: 301 })
    );
    assert!(new.verify(&h, &b, NOW + 300).is_ok());
    assert_eq!(
        new.verify(&h, &body(r#"{"id":"evt_2"}"#), NOW),
        Err(CallbackError::BadSignature)
    );
    let moved = signed.replace(&format!("t={NOW}"), &format!("t={}", NOW + 1));
    assert_eq!(
        new.verify(&headers(&[("stripe-signature", &moved)]), &b, NOW),
        Err(CallbackError::BadSignature)
    );
    for bad in [
        "",
        "t=1",
        "v1=00",
        "t=x,v1=00",
        "t=1,v1=zz",
        "t=1,t=1,v1=00",
    ] {
        let err = new
            .verify(&headers(&[("stripe-signature", bad)]), &b, NOW)
            .unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST, "{bad}: {err}");
    }
    assert_eq!(
        new.verify(&HeaderMap::new(), &b, NOW),
        Err(CallbackError::MissingSignature)
    );
}

/// The example of the Standard Webhooks specification (and Svix's
/// documentation).
#[test]
fn standard_webhooks_specification_example() {
    let wh = StandardWebhooks::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
    let sig = wh.sign(
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1614265330,
        br#"{"test": 2432232314}"#,
    );
    assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    let h = headers(&[
        ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
        ("webhook-timestamp", "1614265330"),
        ("webhook-signature", &format!("v1a,xyz {sig}")),
    ]);
    let v = wh
        .verify(&h, &body(r#"{"test": 2432232314}"#), 1614265330)
        .unwrap();
    assert_eq!(v.serial.as_deref(), Some("msg_p5jXN8AQM9LWM0D4loKWxJek"));
    // The id is signed: another id breaks the signature.
    let mut other = h.clone();
    other.insert("webhook-id", HeaderValue::from_static("msg_other"));
    assert_eq!(
        wh.verify(&other, &body(r#"{"test": 2432232314}"#), 1614265330),
        Err(CallbackError::BadSignature)
    );
    assert!(matches!(
        wh.verify(&h, &body(r#"{"test": 2432232314}"#), 1614265330 + 400),
        Err(CallbackError::StaleTimestamp { .. })
    ));
    assert!(StandardWebhooks::new("whsec_not base64!").is_err());
    // A key roll: the new secret's signature alone, accepted by both.
    let next = StandardWebhooks::new("whsec_bmV4dC1rZXk=").unwrap();
    let rolling = wh.clone().secret("whsec_bmV4dC1rZXk=").unwrap();
    let h = headers(&[
        ("webhook-id", "msg_2"),
        ("webhook-timestamp", "1614265330"),
        ("webhook-signature", &next.sign("msg_2", 1614265330, b"{}")),
    ]);
    assert!(rolling.verify(&h, &body("{}"), 1614265330).is_ok());
    assert_eq!(
        wh.verify(&h, &body("{}"), 1614265330),
        Err(CallbackError::BadSignature)
    );
}

/// GitHub's documented example: secret "It's a Secret to Everybody",
/// payload "Hello, World!".
#[test]
fn github_documented_example() {
    let gh = GitHub::new("It's a Secret to Everybody");
    let sig = gh.sign(b"Hello, World!");
    assert_eq!(
        sig,
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    );
    let h = headers(&[("x-hub-signature-256", &sig)]);
    let v = gh.verify(&h, &body("Hello, World!"), NOW).unwrap();
    assert!(v.serial.unwrap().starts_with("sha256-"));
    assert_eq!(v.timestamp, None);
    assert_eq!(
        gh.verify(&h, &body("Hello, World?"), NOW),
        Err(CallbackError::BadSignature)
    );
    let bare = headers(&[("x-hub-signature-256", &sig["sha256=".len()..])]);
    assert_eq!(
        gh.verify(&bare, &body("Hello, World!"), NOW),
        Err(CallbackError::MalformedSignature)
    );
}

#[test]
fn shopify_and_paddle() {
    let shop = Shopify::new("old").secret("new");
    let b = body(r#"{"id":820982911946154508}"#);
    let sig = Shopify::new("new").sign(&b);
    assert_eq!(sig.len(), 44);
    let v = shop
        .verify(&headers(&[("x-shopify-hmac-sha256", &sig)]), &b, NOW)
        .unwrap();
    assert!(v.serial.unwrap().starts_with("sha256-"));
    assert_eq!(
        Shopify::new("old").verify(&headers(&[("x-shopify-hmac-sha256", &sig)]), &b, NOW),
        Err(CallbackError::BadSignature)
    );

    let paddle = Paddle::new("pdl_ntfset_a").secret("pdl_ntfset_b");
    let b = body(r#"{"event_id":"evt_01h","event_type":"transaction.paid"}"#);
    let sig = Paddle::new("pdl_ntfset_b").sign(NOW, &b);
    assert!(sig.starts_with(&format!("ts={NOW};h1=")));
    let h = headers(&[("paddle-signature", &sig)]);
    let v = paddle.verify(&h, &b, NOW + 5).unwrap();
    assert_eq!(v.serial.as_deref(), Some("evt_01h"));
    assert!(matches!(
        paddle.verify(&h, &b, NOW + 6),
        Err(CallbackError::StaleTimestamp { age_secs: 6 })
    ));
    // Stripe's separator is not Paddle's.
    let stripe_like = Stripe::new("pdl_ntfset_b").sign(NOW, &b);
    assert!(
        paddle
            .verify(&headers(&[("paddle-signature", &stripe_like)]), &b, NOW)
            .is_err()
    );
}

#[test]
fn a_scheme_behind_an_arc_answers_as_its_platform() {
    struct Adyenish;
    impl SignatureScheme for Adyenish {
        fn verify(&self, _: &HeaderMap, body: &Bytes, _: i64) -> Result<Verified, CallbackError> {
            Ok(Verified::new(Some("psp_1".into()), None, body.clone()))
        }
        fn accepted(&self) -> Response {
            "[accepted]".into_response()
        }
    }
    let s = Scheme::new(Adyenish);
    assert_eq!(
        s.verify(&HeaderMap::new(), &body("{}"), NOW)
            .unwrap()
            .serial
            .as_deref(),
        Some("psp_1")
    );
    assert_eq!(s.accepted().status(), StatusCode::OK);
    assert!(s.refused(&CallbackError::BadSignature).is_none());
    assert_eq!(format!("{s:?}"), "Scheme(…)");
}

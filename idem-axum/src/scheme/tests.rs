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

/// Fixed vectors, made once with Python `cryptography` under a test key
/// pair (never a platform's): the old key signs, the new one is rolled in.
mod rsa_vectors {
    /// The old key's SubjectPublicKeyInfo, bare base64 (Alipay's console).
    pub(super) const OLD_B64: &str = "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAn83blUX+9qT4ZWahtdzhG90i+b/oCwFYZuWwGgBmHBJID19MsVVAfYOX4CkIgNXlvyvy2DR5rGke/FkYEIsTHcu4czDaSXC6aQW964B/OhAeELnXVC8fTqDxkYN7IWOiahxhRZbXL8xlkpH8265LLKVZT/LmcvUIAOW2/BibGu6TGlCbcC3plQiUuWVjvN4e3CfpwokLWCeDA0PZWfnG7z+v+/trd6rYaSB3zocjpq6ZZt+ejYI+bKCzeEi0i5QL8R5QZl8WpQQ340uopjlUfJeINGmna7VJoEyU28wqsixwlU3ikuC+XJ34hAJD6/eWn7t72SjfCAWCrERhq/MqYwIDAQAB";
    pub(super) const OLD_PEM: &str = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAn83blUX+9qT4ZWahtdzh\nG90i+b/oCwFYZuWwGgBmHBJID19MsVVAfYOX4CkIgNXlvyvy2DR5rGke/FkYEIsT\nHcu4czDaSXC6aQW964B/OhAeELnXVC8fTqDxkYN7IWOiahxhRZbXL8xlkpH8265L\nLKVZT/LmcvUIAOW2/BibGu6TGlCbcC3plQiUuWVjvN4e3CfpwokLWCeDA0PZWfnG\n7z+v+/trd6rYaSB3zocjpq6ZZt+ejYI+bKCzeEi0i5QL8R5QZl8WpQQ340uopjlU\nfJeINGmna7VJoEyU28wqsixwlU3ikuC+XJ34hAJD6/eWn7t72SjfCAWCrERhq/Mq\nYwIDAQAB\n-----END PUBLIC KEY-----\n";
    pub(super) const NEW_PEM: &str = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAzEsDrhrmKUk5scJ77h3Y\noSpJdLT2lgGTE1JdMdgnnkcJd6T4Z0Pauwf+N8ydWil7iF6OfnQvjScKmMDF+cmr\nMdgsWPKqGNmoBzp+IEKbxs99azPLFr/l+Q6rYk8VyzPQXK9TJsTY4EWUL1Kz4aO4\nACYoF6arE4BSUyZdLvOyZ68XC1j1cr3lWaYM38RmvCVHIVCvam4CPvjVTh0oL1qc\nzTqwPuz+UD9WkAwcSbAPZv8cXq01SRd6ROFgsvl0/gfKR4KDhCu18ZL9mjicjhV7\nWoTU49avoz/+NZtnZAGkmw280e0IG9tqikA8pLAEz8EqzV//g8MQwnHELumFyPsB\nJQIDAQAB\n-----END PUBLIC KEY-----\n";
    /// An Alipay notification (an empty `passback_params`, a subject with
    /// `&` and non-ASCII), signed with the old key, then the new one.
    pub(super) const ALIPAY_FORM: &str = "notify_time=2023-11-15+06%3A13%3A20&notify_type=trade_status_sync&notify_id=2023111500222061320012341234&app_id=2021000000000001&charset=utf-8&version=1.0&trade_no=2023111522001400001234567890&out_trade_no=order-7&trade_status=TRADE_SUCCESS&total_amount=88.88&subject=%E5%92%96%E5%95%A1+%26+%E8%8C%B6&passback_params=&sign=MUDBlCroKTZ9VxrPq9mZ6La5hwKETVJxzKb2%2Bo%2Br6mDvgR2Xq4uC7%2FRWTzn9PermcuQ8PyBfXSBMeDNKGi8JKW3mK8xyckw2UAxsMPS7%2B7Zal3MK6pH8s6xjyEb0mNNLnMjar65NHs9BJwv5ZGWnR9yHxcd3n0Xaf0TXZCSnWNv%2FTdswBriXg02z%2FaXDhwEXp6P0AUadVS43RW0zJiCR1X0dZ8y%2BmqXaIEpiWCWtS1lvvYdxbmj5t1YbarcHhcDlzRhvyOZ4Sd0jI89mjUAtkcU9LzZn0YkdzVSMI2jFxNdZABbDaoPjI6Ph%2Fa0Pcn9YNIhlB2hHWPRG7aiu0kj5Ng%3D%3D&sign_type=RSA2";
    pub(super) const ALIPAY_FORM_NEW: &str = "notify_time=2023-11-15+06%3A13%3A20&notify_type=trade_status_sync&notify_id=2023111500222061320012341234&app_id=2021000000000001&charset=utf-8&version=1.0&trade_no=2023111522001400001234567890&out_trade_no=order-7&trade_status=TRADE_SUCCESS&total_amount=88.88&subject=%E5%92%96%E5%95%A1+%26+%E8%8C%B6&passback_params=&sign=QEMt8xF9zhZ%2F1Zukv1LxhVF6lusC2EJRwwKKODiM0SxvW0rpN3TBIJjKGOtmiPw5u0k4O%2B4x7XQcywD6mM3npq%2FimXz%2BTGMU%2FVRl1iHnlN1xc8AFri6YEBihPW3ipHnAfOSc%2BkXfReFWbzTb8J481oeBJPx9wb%2FBZrAIgfXwxWlju1A7dWe2wS5X2Cpd07fkluptpciIKoNFmvoPCoekZjUBybw2R6ehGX9o3N9Kbu3yKe77SMYiRYCiDWH5Ag3LwmAo7LutRZoITfjrHt%2F%2F%2BZoj5T%2BQ3I4SRdA7gZKp9DekBGNk756ukkbzjKVNTQtcZZ4ZuQXNn3htRQsCF5DoMA%3D%3D&sign_type=RSA2";
    /// A WeChat Pay notification at 1_700_000_000, nonce
    /// `5K8264ILTKCH16CQ2502SI8ZNMTM67VS`, APIv3 key `APIV3`.
    pub(super) const APIV3: &[u8] = b"idem-test-apiv3-key-32-bytes-ok!";
    pub(super) const WX_BODY: &str = r#"{"id":"EV-2018022511223320873","create_time":"2023-11-15T06:13:20+08:00","resource_type":"encrypt-resource","event_type":"TRANSACTION.SUCCESS","summary":"paid 8888","resource":{"original_type":"transaction","algorithm":"AEAD_AES_256_GCM","ciphertext":"WVzgMVOo3rOTnpXjRd0WVJbN3JoHgxYRw0vaT8fwR6FenTdfJhlQvmxTsgQguAM1nw6ptknNYmnpodAbW+xvmhOlm00tYNRX9zK8ROD8d7lXxzK4gzpFs+GJb4FS8FjQiFzcz/B63jE6578vY+Gssvquws6+olvsPIFq0Le9P7JcbdUyh1KdyiLv1iW3q2Eypu4yzjv8eb5y76Q=","associated_data":"transaction","nonce":"fdasflkja484"}}"#;
    pub(super) const WX_PLAIN: &str = r#"{"transaction_id":"4200000000202311150000000001","out_trade_no":"order-7","trade_state":"SUCCESS","amount":{"total":8888,"currency":"CNY"}}"#;
    pub(super) const WX_SIG: &str = "XIaEN7J8vWDiWOkq0yvLqZzKCKASMnTUnsVkDK5Q3v59cKCCfekJv0FTfzKfDl5r/z3VFOOiCu3o6vb0k8UEQvGfNHP23uK/98BU8/jdNlIUBwcNtw69W0137gRldNLQpgJ49sG7kvy7vZ4lJtQFHyAET+AwtPlpbSFHdN9DR2sPwqRVijTEDz7SeRoK7P2ehptO8irOH7+SHAJSnc2e0iTAcjNrGkCllwsRx0taJ1Gy5yq9S5r5SpSbq3DVc0OBJLZmv22O+Mn8+eBw4AtzXtpn3pRSuwwcqbn6HkmpHZRuXqzVnHR+MsHwFet9cUpOr/Kifn4omLKVQi6y+3cH6w==";
    pub(super) const WX_SIG_NEW: &str = "eiH3SV/vAnv7xxZRVWznhyRHANGHb4z0J+Y78aUB6g5+Vdq0CxLLZVECj02QYLiE90fdIebNq3HJ8TV+n3oOfahkTBmiegxl6hgWtaZ0MKfs70Tq9QrXdGj0iN7bkiYB6xF9Oz+Yeyxl01MFb6bFE0KAc5VRDX7IzgRwok3CDtCxikKf/8GtSY2sZsysgZtG0W+4KCffvisYhgdc5xCHbh89S3fepGdCTB88j02LLxrfSIRiWNycyBWhuGKA5QPZCy2GXtlVHfKNtzbp+Px4RFC0wKYY/+qhg8sGofP8sNRD7VJppVr8Mzt9w2wMIhW0Ra/YfM9KoJmVigP13ghsRA==";
}

#[test]
fn alipay_rsa2_form_rotation_and_answers() {
    use rsa_vectors::*;
    let form = body(ALIPAY_FORM);
    let old = Alipay::new(OLD_B64).unwrap();
    let v = old.verify(&HeaderMap::new(), &form, NOW).unwrap();
    assert_eq!(v.serial.as_deref(), Some("2023111500222061320012341234"));
    assert_eq!(v.timestamp, None);
    assert_eq!(v.payload, form);
    // The same key as PEM; `trade_no` as the serial.
    let by_trade = Alipay::new(OLD_PEM).unwrap().serial("trade_no", |_| Ok(()));
    let v = by_trade.verify(&HeaderMap::new(), &form, NOW).unwrap();
    assert_eq!(v.serial.as_deref(), Some("2023111522001400001234567890"));
    // Signed with the new key: the rolling endpoint only.
    let rolled = body(ALIPAY_FORM_NEW);
    let rolling = Alipay::new(OLD_B64).unwrap().key(NEW_PEM).unwrap();
    assert!(rolling.verify(&HeaderMap::new(), &rolled, NOW).is_ok());
    assert!(rolling.verify(&HeaderMap::new(), &form, NOW).is_ok());
    assert_eq!(
        old.verify(&HeaderMap::new(), &rolled, NOW),
        Err(CallbackError::BadSignature)
    );
    // Tampered; the empty parameter is not signed, a filled one is.
    let tampered = ALIPAY_FORM.replace("total_amount=88.88", "total_amount=0.01");
    assert_eq!(
        old.verify(&HeaderMap::new(), &body(&tampered), NOW),
        Err(CallbackError::BadSignature)
    );
    let filled = ALIPAY_FORM.replace("passback_params=", "passback_params=x");
    assert_eq!(
        old.verify(&HeaderMap::new(), &body(&filled), NOW),
        Err(CallbackError::BadSignature)
    );
    // Malformed: 400.
    let unsigned: String = ALIPAY_FORM
        .split('&')
        .filter(|p| !p.starts_with("sign="))
        .collect::<Vec<_>>()
        .join("&");
    assert_eq!(
        old.verify(&HeaderMap::new(), &body(&unsigned), NOW),
        Err(CallbackError::MissingSignature)
    );
    for bad in [
        format!("{unsigned}&sign=not*base64"),
        ALIPAY_FORM.replace("sign_type=RSA2", "sign_type=RSA"),
        ALIPAY_FORM.replace("charset=utf-8", "charset=gbk"),
        format!("{ALIPAY_FORM}&notify_id=again"),
        format!("{ALIPAY_FORM}&x=%FF"),
    ] {
        let err = old.verify(&HeaderMap::new(), &body(&bad), NOW).unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST, "{bad}: {err}");
    }
    // Alipay's answers: `success`, else `failure`.
    let ok = old.accepted();
    assert_eq!(ok.status(), StatusCode::OK);
    let refused = old.refused(&CallbackError::BadSignature).unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert!(Alipay::new("not a key").is_err());
    // The content: sorted, `sign`, `sign_type` and empty values left out.
    let params = Alipay::parse_form(b"b=2&sign=x&a=1&sign_type=RSA2&c=&d=%26").unwrap();
    assert_eq!(Alipay::signed_content(&params), "a=1&b=2&d=&");
}

#[test]
fn wechat_pay_signed_encrypted_rotation_and_answers() {
    use rsa_vectors::*;
    let wx = WeChatPay::new("PUB_KEY_ID_OLD", OLD_PEM, APIV3).unwrap();
    let h = |sig: &str, serial: &str, ts: &str| {
        headers(&[
            ("wechatpay-timestamp", ts),
            ("wechatpay-nonce", "5K8264ILTKCH16CQ2502SI8ZNMTM67VS"),
            ("wechatpay-signature", sig),
            ("wechatpay-serial", serial),
            ("wechatpay-signature-type", "WECHATPAY2-SHA256-RSA2048"),
        ])
    };
    let b = body(WX_BODY);
    let ok = h(WX_SIG, "PUB_KEY_ID_OLD", "1700000000");
    let v = wx.verify(&ok, &b, NOW).unwrap();
    assert_eq!(v.serial.as_deref(), Some("4200000000202311150000000001"));
    assert_eq!(v.timestamp, Some(NOW));
    assert_eq!(v.payload, body(WX_PLAIN));
    let by_id = wx
        .clone()
        .serial(WeChatPaySerial::NotificationId, |_| Ok(()));
    let v = by_id.verify(&ok, &b, NOW).unwrap();
    assert_eq!(v.serial.as_deref(), Some("EV-2018022511223320873"));
    // Tolerance: 300 s either way.
    assert!(wx.verify(&ok, &b, NOW + 300).is_ok());
    assert_eq!(
        wx.verify(&ok, &b, NOW + 301),
        Err(CallbackError::StaleTimestamp { age_secs: 301 })
    );
    // The key named by Wechatpay-Serial: rolled in, unknown, the other one.
    let rolling = wx.clone().key("PUB_KEY_ID_NEW", NEW_PEM).unwrap();
    let new = h(WX_SIG_NEW, "PUB_KEY_ID_NEW", "1700000000");
    assert!(rolling.verify(&new, &b, NOW).is_ok());
    assert!(rolling.verify(&ok, &b, NOW).is_ok());
    assert_eq!(wx.verify(&new, &b, NOW), Err(CallbackError::BadSignature));
    let misnamed = h(WX_SIG_NEW, "PUB_KEY_ID_OLD", "1700000000");
    assert_eq!(
        rolling.verify(&misnamed, &b, NOW),
        Err(CallbackError::BadSignature)
    );
    // The timestamp and the body are signed.
    let moved = h(WX_SIG, "PUB_KEY_ID_OLD", "1700000001");
    assert_eq!(wx.verify(&moved, &b, NOW), Err(CallbackError::BadSignature));
    let tampered = body(&WX_BODY.replace("paid 8888", "paid 1"));
    assert_eq!(
        wx.verify(&ok, &tampered, NOW),
        Err(CallbackError::BadSignature)
    );
    // Another APIv3 key: the signature holds, the resource does not open.
    let other = WeChatPay::new("PUB_KEY_ID_OLD", OLD_PEM, &[7; 32]).unwrap();
    assert!(matches!(
        other.verify(&ok, &b, NOW),
        Err(CallbackError::MalformedBody(_))
    ));
    assert!(WeChatPay::new("PUB_KEY_ID_OLD", OLD_PEM, b"short").is_err());
    // Malformed headers, WeChat Pay's signature probe among them: 400.
    let mut probe = ok.clone();
    probe.insert(
        "wechatpay-signature",
        HeaderValue::from_static("WECHATPAY/SIGNTEST/abc"),
    );
    assert_eq!(
        wx.verify(&probe, &b, NOW).unwrap_err().status(),
        StatusCode::BAD_REQUEST
    );
    for name in [
        "wechatpay-timestamp",
        "wechatpay-nonce",
        "wechatpay-signature",
        "wechatpay-serial",
    ] {
        let mut missing = ok.clone();
        missing.remove(name);
        let err = wx.verify(&missing, &b, NOW).unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST, "{name}: {err}");
    }
    let mut md5 = ok.clone();
    md5.insert(
        "wechatpay-signature-type",
        HeaderValue::from_static("WECHATPAY2-MD5"),
    );
    assert_eq!(
        wx.verify(&md5, &b, NOW),
        Err(CallbackError::MalformedSignature)
    );
    // WeChat Pay's answers: 200, or a 4xx with code FAIL.
    assert_eq!(wx.accepted().status(), StatusCode::OK);
    let refused = wx.refused(&CallbackError::BadSignature).unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        refused.headers()["content-type"],
        HeaderValue::from_static("application/json")
    );
}

/// Adyen's documented example (its HMAC key and the item of its
/// documentation and libraries' tests): `coqCmt/…`.
#[test]
fn adyen_documented_example() {
    let key = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
    let item = r#"{"pspReference":"7914073381342284","originalReference":"","merchantAccountCode":"TestMerchant","merchantReference":"TestPayment-1407325143704","amount":{"value":1130,"currency":"EUR"},"eventCode":"AUTHORISATION","success":"true","eventDate":"2019-05-06T17:15:34.121+02:00","paymentMethod":"visa","reason":"033899:1111:03/2030","additionalData":{"hmacSignature":"SIG"}}"#;
    let item_value: serde_json::Value = serde_json::from_str(item).unwrap();
    assert_eq!(
        Adyen::signed_content(&item_value),
        "7914073381342284::TestMerchant:TestPayment-1407325143704:1130:EUR:AUTHORISATION:true"
    );
    let adyen = Adyen::new(key).unwrap();
    let sig = adyen.sign(&item_value);
    assert_eq!(sig, "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0=");
    let notification = |item: &str| {
        body(&format!(
            r#"{{"live":"false","notificationItems":[{{"NotificationRequestItem":{item}}}]}}"#
        ))
    };
    let signed = item.replace("SIG", &sig);
    let v = adyen
        .verify(&HeaderMap::new(), &notification(&signed), NOW)
        .unwrap();
    assert_eq!(v.serial.as_deref(), Some("7914073381342284:AUTHORISATION"));
    assert_eq!(v.timestamp, None);
    let payload: serde_json::Value = serde_json::from_slice(&v.payload).unwrap();
    assert_eq!(payload["pspReference"], "7914073381342284");
    // An unsigned field changed: still valid; a signed one: refused.
    let reason = signed.replace("033899", "000000");
    assert!(
        adyen
            .verify(&HeaderMap::new(), &notification(&reason), NOW)
            .is_ok()
    );
    let amount = signed.replace("1130", "1");
    assert_eq!(
        adyen.verify(&HeaderMap::new(), &notification(&amount), NOW),
        Err(CallbackError::BadSignature)
    );
    // A key roll: the new key's signature, accepted by the rolling endpoint.
    let rolling = Adyen::new("0011").unwrap().secret(key).unwrap();
    assert!(
        rolling
            .verify(&HeaderMap::new(), &notification(&signed), NOW)
            .is_ok()
    );
    assert_eq!(
        Adyen::new("0011")
            .unwrap()
            .verify(&HeaderMap::new(), &notification(&signed), NOW),
        Err(CallbackError::BadSignature)
    );
    assert!(Adyen::new("not hex").is_err());
    // Malformed: 400.
    for bad in [
        notification(&item.replace("SIG", "garbage")),
        notification(&item.replace(r#","additionalData":{"hmacSignature":"SIG"}"#, "")),
        body(r#"{"live":"false","notificationItems":[]}"#),
        body(&format!(
            r#"{{"notificationItems":[{{"NotificationRequestItem":{signed}}},{{"NotificationRequestItem":{signed}}}]}}"#
        )),
        body("[accepted]"),
    ] {
        let err = adyen.verify(&HeaderMap::new(), &bad, NOW).unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST, "{err}");
    }
    assert_eq!(adyen.accepted().status(), StatusCode::OK);
    assert!(adyen.refused(&CallbackError::BadSignature).is_none());
}

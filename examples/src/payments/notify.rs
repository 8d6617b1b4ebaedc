//! The platforms' side: each success notification built and signed the way
//! its platform does it, with the crates idem-axum's presets verify with.
//!
//! - **Stripe**: a JSON event (`payment_intent.succeeded`, or
//!   `checkout.session.completed` for an order of odd id), signed at every
//!   attempt: `Stripe-Signature: t=<now>,v1=<hex HMAC-SHA256 of
//!   "{t}.{body}">`, one `v1` per active endpoint secret.
//! - **Alipay**: a form (`trade_status=TRADE_SUCCESS`…) whose `sign` is the
//!   base64 SHA256withRSA of the other parameters but `sign_type` and the
//!   empty ones, sorted by name, `k=v&…`; signed once, resent as it is.
//! - **WeChat Pay v3**: a JSON notification (`TRANSACTION.SUCCESS`) whose
//!   `resource` is the transaction encrypted with AES-256-GCM under the
//!   merchant's APIv3 key; signed at every attempt: `Wechatpay-Signature`,
//!   the base64 SHA256withRSA of `"{timestamp}\n{nonce}\n{body}\n"` under
//!   the platform key `Wechatpay-Serial` names.

use super::keys::{self, RsaSigner};
use super::protocol::{ALIPAY, STRIPE, WECHATPAY};
use super::{ALIPAY_PATH, STRIPE_PATH, WECHATPAY_PATH};
use base64::Engine as _;
use hmac::{KeyInit as _, Mac as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The simulated platforms' signing keys.
#[derive(Debug, Clone)]
pub struct PlatformKeys {
    /// Stripe's active endpoint secrets: one `v1` each.
    pub stripe_secrets: Vec<Vec<u8>>,
    /// Alipay's signing key.
    pub alipay: Arc<RsaSigner>,
    /// The WeChat Pay platform key that signs, and the name
    /// `Wechatpay-Serial` gives it.
    pub wechatpay: (String, Arc<RsaSigner>),
    /// The merchant's APIv3 key, which WeChat Pay encrypts resources under.
    pub apiv3_key: [u8; 32],
}

impl PlatformKeys {
    /// The demo's keys ([`keys`]): Stripe in the middle of a secret roll
    /// (both secrets), WeChat Pay signing under its first platform key.
    pub fn demo() -> Self {
        let (serial, private, _) = keys::WECHATPAY_KEYS[0];
        PlatformKeys {
            stripe_secrets: vec![keys::STRIPE_SECRET.into(), keys::STRIPE_NEXT_SECRET.into()],
            alipay: Arc::new(keys::rsa_signer(keys::ALIPAY_PRIVATE_PEM)),
            wechatpay: (serial.into(), Arc::new(keys::rsa_signer(private))),
            apiv3_key: *keys::WECHATPAY_APIV3_KEY,
        }
    }

    /// WeChat Pay signing under its `i`-th platform key (0 or 1): the other
    /// side of a certificate rotation.
    pub fn wechatpay_key(mut self, i: usize) -> Self {
        let (serial, private, _) = keys::WECHATPAY_KEYS[i];
        self.wechatpay = (serial.into(), Arc::new(keys::rsa_signer(private)));
        self
    }

    /// A forger's keys: a guessed Stripe secret, Alipay's notifications
    /// signed with a key that is not Alipay's, WeChat Pay's signed with its
    /// second key while `Wechatpay-Serial` names the first.
    pub fn forged(&self) -> Self {
        let (first, _, _) = keys::WECHATPAY_KEYS[0];
        let (_, second, _) = keys::WECHATPAY_KEYS[1];
        PlatformKeys {
            stripe_secrets: vec![b"whsec_guessed".to_vec()],
            alipay: Arc::new(keys::rsa_signer(second)),
            wechatpay: (first.into(), Arc::new(keys::rsa_signer(second))),
            apiv3_key: self.apiv3_key,
        }
    }
}

/// One payment as its platform knows it: notified once, whatever the
/// number of attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// [`STRIPE`], [`ALIPAY`] or [`WECHATPAY`].
    pub platform: &'static str,
    /// The platform's serial: the event id, `trade_no` or `transaction_id`.
    pub serial: String,
    /// The merchant's order (its `out_trade_no`, metadata or reference).
    pub order_id: i64,
    /// The amount paid, in fen.
    pub amount_cents: i64,
}

/// A notification as its platform sends it: the same body at every attempt,
/// headers signed per attempt where the platform signs a timestamp.
#[derive(Debug, Clone)]
pub struct Notification {
    /// The merchant's route for this platform.
    pub path: &'static str,
    /// The body's media type.
    pub content_type: &'static str,
    /// The body.
    pub body: Vec<u8>,
    signing: Signing,
}

#[derive(Debug, Clone)]
enum Signing {
    Stripe(Vec<Vec<u8>>),
    /// Alipay's signature is in the form.
    InBody,
    WeChatPay(String, Arc<RsaSigner>),
}

impl Notification {
    /// The platform's notification of `charge`, signed with `keys`.
    pub fn new(keys: &PlatformKeys, charge: &Charge, now: i64) -> Self {
        let (path, content_type, body, signing) = match charge.platform {
            STRIPE => (
                STRIPE_PATH,
                "application/json",
                stripe_event(charge, now),
                Signing::Stripe(keys.stripe_secrets.clone()),
            ),
            ALIPAY => (
                ALIPAY_PATH,
                "application/x-www-form-urlencoded; charset=utf-8",
                alipay_form(&keys.alipay, charge, now),
                Signing::InBody,
            ),
            WECHATPAY => (
                WECHATPAY_PATH,
                "application/json",
                wechatpay_notification(&keys.apiv3_key, charge, now),
                Signing::WeChatPay(keys.wechatpay.0.clone(), keys.wechatpay.1.clone()),
            ),
            other => panic!("no platform {other}"),
        };
        Notification {
            path,
            content_type,
            body,
            signing,
        }
    }

    /// This notification with `body` instead, its headers signed over it as
    /// the platform signs (Alipay's form is sent as it is): to send what no
    /// platform would.
    pub fn with_body(mut self, body: Vec<u8>) -> Self {
        self.body = body;
        self
    }

    /// The signature headers of an attempt at `now` (Unix seconds).
    pub fn headers(&self, now: i64) -> Vec<(&'static str, String)> {
        match &self.signing {
            Signing::Stripe(secrets) => {
                let mut value = format!("t={now}");
                for secret in secrets {
                    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret)
                        .expect("HMAC takes any key");
                    mac.update(format!("{now}.").as_bytes());
                    mac.update(&self.body);
                    value.push_str(",v1=");
                    value.push_str(&hex::encode(mac.finalize().into_bytes()));
                }
                vec![("stripe-signature", value)]
            }
            Signing::InBody => Vec::new(),
            Signing::WeChatPay(serial, key) => {
                let nonce = format!("{:032X}", fresh());
                let mut message = format!("{now}\n{nonce}\n").into_bytes();
                message.extend_from_slice(&self.body);
                message.push(b'\n');
                vec![
                    ("wechatpay-timestamp", now.to_string()),
                    ("wechatpay-nonce", nonce),
                    ("wechatpay-serial", serial.clone()),
                    ("wechatpay-signature", rsa2(key, &message)),
                    (
                        "wechatpay-signature-type",
                        "WECHATPAY2-SHA256-RSA2048".into(),
                    ),
                ]
            }
        }
    }
}

/// A number no earlier call returned in this process, nor (with the
/// clock's nanoseconds as its start) in another: WeChat Pay's nonces.
fn fresh() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    if NEXT.load(Ordering::Relaxed) == 0 {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let nanos = now.map(|d| d.as_nanos() as u64).unwrap_or(1);
        let _ = NEXT.compare_exchange(0, nanos | 1, Ordering::Relaxed, Ordering::Relaxed);
    }
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The base64 SHA256withRSA (PKCS#1 v1.5) signature of `message`.
fn rsa2(key: &RsaSigner, message: &[u8]) -> String {
    use rsa::signature::{SignatureEncoding as _, Signer as _};
    base64::engine::general_purpose::STANDARD.encode(key.sign(message).to_bytes())
}

/// `unix` (seconds) in Beijing time (UTC+8), `YYYY-MM-DD`, `HH:MM:SS`.
fn beijing(unix: i64) -> (String, String) {
    let t = unix + 8 * 3600;
    let (days, secs) = (t.div_euclid(86_400), t.rem_euclid(86_400));
    // The proleptic Gregorian date of a day number (days since 1970-01-01),
    // by 400-year eras of 146,097 days starting on March 1st.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    (
        format!("{year:04}-{month:02}-{day:02}"),
        format!("{h:02}:{m:02}:{s:02}"),
    )
}

fn yuan(cents: i64) -> String {
    format!("{}.{:02}", cents / 100, cents % 100)
}

fn stripe_event(c: &Charge, now: i64) -> Vec<u8> {
    let reference = c.order_id.to_string();
    let suffix = c.serial.trim_start_matches("evt_");
    let (kind, object) = if c.order_id % 2 == 0 {
        let intent = serde_json::json!({
            "id": format!("pi_{suffix}"), "object": "payment_intent",
            "amount": c.amount_cents, "amount_received": c.amount_cents, "currency": "cny",
            "status": "succeeded", "metadata": { "order_id": reference },
        });
        ("payment_intent.succeeded", intent)
    } else {
        let session = serde_json::json!({
            "id": format!("cs_{suffix}"), "object": "checkout.session", "mode": "payment",
            "amount_total": c.amount_cents, "currency": "cny", "status": "complete",
            "payment_status": "paid", "client_reference_id": reference,
        });
        ("checkout.session.completed", session)
    };
    let event = serde_json::json!({
        "id": c.serial, "object": "event", "api_version": "2025-06-30.basil", "created": now,
        "type": kind, "livemode": false, "pending_webhooks": 1,
        "data": { "object": object },
    });
    serde_json::to_vec(&event).expect("JSON")
}

fn alipay_form(key: &RsaSigner, c: &Charge, now: i64) -> Vec<u8> {
    let (date, time) = beijing(now);
    let at = format!("{date} {time}");
    let mut params: Vec<(&str, String)> = vec![
        ("notify_time", at.clone()),
        ("notify_type", "trade_status_sync".into()),
        ("notify_id", format!("{:x}", fresh())),
        ("app_id", keys::ALIPAY_APP_ID.into()),
        ("charset", "utf-8".into()),
        ("version", "1.0".into()),
        ("trade_no", c.serial.clone()),
        ("out_trade_no", c.order_id.to_string()),
        ("trade_status", "TRADE_SUCCESS".into()),
        ("total_amount", yuan(c.amount_cents)),
        ("receipt_amount", yuan(c.amount_cents)),
        ("subject", format!("订单 {}", c.order_id)),
        ("gmt_payment", at),
        ("passback_params", String::new()),
    ];
    // Alipay's procedure: `sign`, `sign_type` and empty values left out,
    // sorted by name, `k=v` joined by `&`, the values as they are.
    let mut signed: Vec<&(&str, String)> = params.iter().filter(|(_, v)| !v.is_empty()).collect();
    signed.sort();
    let content: Vec<String> = signed.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let sign = rsa2(key, content.join("&").as_bytes());
    params.push(("sign", sign));
    params.push(("sign_type", "RSA2".into()));
    let mut form = form_urlencoded::Serializer::new(String::new());
    form.extend_pairs(params.iter().map(|(k, v)| (*k, v.as_str())));
    form.finish().into_bytes()
}

fn wechatpay_notification(apiv3_key: &[u8; 32], c: &Charge, now: i64) -> Vec<u8> {
    use aes_gcm::aead::{Aead as _, KeyInit as _, Payload};
    let (date, time) = beijing(now);
    let at = format!("{date}T{time}+08:00");
    let transaction = serde_json::json!({
        "mchid": keys::WECHATPAY_MCHID, "appid": "wx0000000000demo42",
        "out_trade_no": c.order_id.to_string(), "transaction_id": c.serial,
        "trade_type": "JSAPI", "trade_state": "SUCCESS", "trade_state_desc": "支付成功",
        "bank_type": "OTHERS", "success_time": at, "payer": { "openid": "o-demo-payer" },
        "amount": {
            "total": c.amount_cents, "payer_total": c.amount_cents,
            "currency": "CNY", "payer_currency": "CNY",
        },
    });
    // The nonce: 12 ASCII characters, never twice under one key.
    let nonce = format!("{:012x}", fresh() & 0xFFFF_FFFF_FFFF);
    let aad = "transaction";
    let cipher = aes_gcm::Aes256Gcm::new(&(*apiv3_key).into());
    let plain = serde_json::to_vec(&transaction).expect("JSON");
    let payload = Payload {
        msg: &plain,
        aad: aad.as_bytes(),
    };
    let nonce_bytes = aes_gcm::Nonce::try_from(nonce.as_bytes()).expect("12 bytes");
    let ciphertext = cipher
        .encrypt(&nonce_bytes, payload)
        .expect("AES-GCM encrypts");
    let notification = serde_json::json!({
        "id": format!("EV-{}", c.serial), "create_time": at,
        "resource_type": "encrypt-resource", "event_type": "TRANSACTION.SUCCESS",
        "summary": "支付成功",
        "resource": {
            "original_type": "transaction", "algorithm": "AEAD_AES_256_GCM",
            "ciphertext": base64::engine::general_purpose::STANDARD.encode(ciphertext),
            "associated_data": aad, "nonce": nonce,
        },
    });
    serde_json::to_vec(&notification).expect("JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beijing_time() {
        // 2000-03-01 00:00:00 UTC; 1970-01-01 00:00 UTC; 2024-02-29 23:59:59 UTC.
        assert_eq!(
            beijing(951_868_800),
            ("2000-03-01".into(), "08:00:00".into())
        );
        assert_eq!(beijing(0), ("1970-01-01".into(), "08:00:00".into()));
        assert_eq!(
            beijing(1_709_251_199),
            ("2024-03-01".into(), "07:59:59".into())
        );
    }

    #[test]
    fn yuan_amounts() {
        assert_eq!(yuan(1999), "19.99");
        assert_eq!(yuan(5), "0.05");
        assert_eq!(yuan(100), "1.00");
    }
}

//! The signature presets (`idem_runtime::http::scheme`) against the
//! platforms' own code, over real HTTP, on PostgreSQL, SQLite and MariaDB:
//! each callback is signed by the platform's SDK, run as a subprocess
//! (never a copy of its procedure written here), and checked by that SDK
//! before it is sent where the SDK can verify:
//!
//! | platform | signed by | checked by |
//! |---|---|---|
//! | Stripe | `stripe.WebhookSignature.generate_signature_header` (Python `stripe`) | `stripe.Webhook.construct_event` |
//! | Standard Webhooks | `standardwebhooks.Webhook(secret).sign` (Python) | `Webhook.verify` |
//! | GitHub | `sign` of `@octokit/webhooks-methods` (Node) | its `verify` |
//! | Shopify | the documented procedure (Python `hmac`, `base64`): no Shopify SDK signs or checks a webhook outside an app's framework | — |
//! | Paddle Billing | `PaddleSignature.calculate_hmac` of `paddle-python-sdk` over the documented `"{ts}:{body}"` | its `Verifier().verify` |
//! | Alipay | the documented procedure (Python `cryptography`: SHA256withRSA over the sorted form, `sign_type=RSA2`): Alipay's SDKs are the merchant's side and sign no notification | `AliPay(...).verify` of `python-alipay-sdk` |
//! | WeChat Pay API v3 | the documented procedure (Python `cryptography`: the resource under AES-256-GCM, SHA256withRSA over `"{ts}\n{nonce}\n{body}\n"`), for the same reason | `Core(..., public_key=…, public_key_id=…).callback` of `wechatpayv3`: signature and decryption |
//! | Adyen (standard notifications) | `generate_notification_sig` of the Python `Adyen` SDK (`Adyen.util`), the item's `additionalData.hmacSignature` | its `is_valid_hmac_notification` |
//!
//! Then, for every platform: a callback is booked once; the same callback
//! replayed is a duplicate (one row); a tampered body, a wrong secret, a
//! stale timestamp (where the platform signs one) and a malformed header
//! are refused and book nothing; a second event is booked on its own; a
//! callback signed with the new secret during a key roll is accepted.
//! Alipay's and WeChat Pay's keys are RSA key pairs (`keys/`, test keys),
//! and Alipay's malformed callback is a form whose `sign` is not base64,
//! or has none (Adyen's: an item whose `hmacSignature` is not, or is
//! missing).
//!
//! The SDKs (`.ci/run` installs them): Python `stripe`, `standardwebhooks`,
//! `paddle-python-sdk`, `cryptography`, `python-alipay-sdk`, `wechatpayv3`
//! and `Adyen`; Node `@octokit/webhooks-methods` in
//! `$IDEM_SDK_NODE` (default `/opt/idem-sdk/node`). A missing SDK skips the
//! test locally and fails it under `CI=true`.

use crate::common::http;

use axum::Router;
use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem_runtime::http::SignedCallback;
use idem_runtime::http::scheme::{
    Adyen, Alipay, GitHub, Paddle, Shopify, StandardWebhooks, Stripe, WeChatPay,
};
use idem_runtime::{Error, Outcome, idempotent};
use idem_testkit::{ids, sql, unique, unreachable};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The secret in use, and the next one, rolled in.
const OLD: &str = "whsec_b2xkLXNlY3JldC1vZi10aGUtcGxhdGZvcm0=";
const NEW: &str = "whsec_bmV3LXNlY3JldC1vZi10aGUtcGxhdGZvcm0=";
/// A secret the platform never had.
const WRONG: &str = "whsec_Z3Vlc3NlZC1ieS1hbi1hdHRhY2tlcg==";

/// The RSA platforms' (Alipay, WeChat Pay) key pairs, `old.pem`,
/// `new.pem`, `wrong.pem` and their `.pub.pem`: test keys generated once
/// (keys/README.md), standing for `OLD`, `NEW` and `WRONG`.
const KEYS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/http/keys");
/// The WeChat Pay merchant's APIv3 key (32 bytes).
const APIV3: &str = "idem-test-apiv3-key-32-bytes-ok!";

/// The key pair standing for `secret`, as a path without its extension.
fn rsa_key(secret: &str) -> String {
    let name = match secret {
        OLD => "old",
        NEW => "new",
        _ => "wrong",
    };
    format!("{KEYS}/{name}")
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Platform {
    Stripe,
    Standard,
    GitHub,
    Shopify,
    Paddle,
    Alipay,
    WeChat,
    Adyen,
}

impl Platform {
    fn path(self) -> &'static str {
        match self {
            Platform::Stripe => "/stripe",
            Platform::Standard => "/standard",
            Platform::GitHub => "/github",
            Platform::Shopify => "/shopify",
            Platform::Paddle => "/paddle",
            Platform::Alipay => "/alipay",
            Platform::WeChat => "/wechat",
            Platform::Adyen => "/adyen",
        }
    }

    fn signs_a_timestamp(self) -> bool {
        !matches!(
            self,
            Platform::GitHub | Platform::Shopify | Platform::Alipay | Platform::Adyen
        )
    }

    /// The body's media type: Alipay posts a form.
    fn content_type(self) -> &'static str {
        match self {
            Platform::Alipay => "application/x-www-form-urlencoded",
            _ => "application/json",
        }
    }

    /// The SDK's name, for the skip message.
    fn sdk(self) -> &'static str {
        match self {
            Platform::Stripe => "the Python SDK `stripe`",
            Platform::Standard => "the Python SDK `standardwebhooks`",
            Platform::GitHub => "the Node package `@octokit/webhooks-methods`",
            Platform::Shopify => "Python",
            Platform::Paddle => "the Python SDK `paddle-python-sdk`",
            Platform::Alipay => "the Python SDK `python-alipay-sdk` (module `alipay`)",
            Platform::WeChat => "the Python SDK `wechatpayv3`",
            Platform::Adyen => "the Python SDK `Adyen`",
        }
    }
}

/// Python: the payload on stdin, `secret ts id verify` in argv, the
/// headers out as `name: value` lines. `verify` is `1` when the SDK must
/// check what it signed (a fresh callback under the right secret). Alipay
/// and WeChat Pay build their notification from the event (`secret` is
/// then a key pair's path, `rsa_key`) and write it out as `=body …`: the
/// platform's procedure with `cryptography` (neither SDK signs a
/// notification: they are the merchant's side), checked by the SDK's own
/// verifier.
const PYTHON: &str = r#"
import sys, json
secret, ts, msg_id, verify = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
platform = sys.argv[5]
payload = sys.stdin.buffer.read()
if platform == "stripe":
    import stripe
    h = stripe.WebhookSignature.generate_signature_header(payload.decode(), secret, timestamp=ts)
    if verify:
        stripe.Webhook.construct_event(payload, h, secret, tolerance=300)
    print("stripe-signature: " + h)
elif platform == "standard":
    from datetime import datetime, timezone
    from standardwebhooks import Webhook
    wh = Webhook(secret)
    sig = wh.sign(msg_id, datetime.fromtimestamp(ts, tz=timezone.utc), payload)
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-signature": sig}
    if verify:
        wh.verify(payload, headers)
    for k, v in headers.items():
        print(k + ": " + v)
elif platform == "shopify":
    import base64, hashlib, hmac
    print("x-shopify-hmac-sha256: " + base64.b64encode(hmac.new(secret.encode(), payload, hashlib.sha256).digest()).decode())
elif platform == "paddle":
    from paddle_billing.Notifications import Secret, Verifier
    from paddle_billing.Notifications.PaddleSignature import PaddleSignature
    h1 = PaddleSignature.calculate_hmac(secret, f"{ts}:".encode() + payload).hexdigest()
    header = f"ts={ts};h1={h1}"
    if verify:
        class Request:
            def __init__(self):
                self.headers = {"Paddle-Signature": header}
                self.body = payload
        assert Verifier(maximum_variance=60).verify(Request(), Secret(secret)), "Paddle's Verifier refused"
    print("paddle-signature: " + header)
elif platform in ("alipay", "wechat"):
    import base64, os, secrets, time
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding
    event = json.loads(payload)
    key = serialization.load_pem_private_key(open(secret + ".pem", "rb").read(), None)
    public = open(secret + ".pub.pem").read()
    merchant = open(os.path.join(os.path.dirname(secret), "wrong.pem")).read()
    rsa2 = lambda m: base64.b64encode(key.sign(m, padding.PKCS1v15(), hashes.SHA256())).decode()
if platform == "alipay":
    from urllib.parse import urlencode
    params = {
        "notify_time": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts + 8 * 3600)),
        "notify_type": "trade_status_sync", "notify_id": event["id"],
        "app_id": "2021000000000001", "charset": "utf-8", "version": "1.0",
        "trade_no": "2026" + str(event["amount"]), "out_trade_no": "order-" + event["id"],
        "trade_status": "TRADE_SUCCESS", "total_amount": str(event["amount"]),
        "subject": "咖啡 & 茶", "passback_params": "",
    }
    # Alipay's procedure: sorted, `sign`, `sign_type` and empty values out.
    sign = rsa2("&".join(f"{k}={v}" for k, v in sorted(params.items()) if v).encode())
    if verify:
        from alipay import AliPay
        sdk = AliPay(appid=params["app_id"], app_private_key_string=merchant, alipay_public_key_string=public)
        # The SDK leaves out `sign_type` (it checks it), not empty values.
        data = {k: v for k, v in params.items() if v}
        data["sign_type"] = "RSA2"
        assert sdk.verify(data, sign), "AliPay.verify refused"
    params["sign"], params["sign_type"] = sign, "RSA2"
    print("=body " + urlencode(params))
elif platform == "wechat":
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    apiv3 = "idem-test-apiv3-key-32-bytes-ok!"
    serial = {"old": "PUB_KEY_ID_OLD", "new": "PUB_KEY_ID_NEW"}.get(os.path.basename(secret), "PUB_KEY_ID_OLD")
    resource = json.dumps({
        "transaction_id": event["id"], "out_trade_no": "order-" + event["id"], "trade_state": "SUCCESS",
        "amount": {"total": event["amount"], "currency": "CNY"},
    }, separators=(",", ":"))
    aes_nonce = secrets.token_hex(6)
    ciphertext = AESGCM(apiv3.encode()).encrypt(aes_nonce.encode(), resource.encode(), b"transaction")
    body = json.dumps({
        "id": "EV-" + event["id"], "create_time": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(ts)),
        "resource_type": "encrypt-resource", "event_type": "TRANSACTION.SUCCESS",
        "summary": "paid " + str(event["amount"]),
        "resource": {
            "original_type": "transaction", "algorithm": "AEAD_AES_256_GCM",
            "ciphertext": base64.b64encode(ciphertext).decode(), "associated_data": "transaction", "nonce": aes_nonce,
        },
    }, separators=(",", ":"))
    nonce = secrets.token_hex(16).upper()
    headers = {
        "Wechatpay-Timestamp": str(ts), "Wechatpay-Nonce": nonce, "Wechatpay-Serial": serial,
        "Wechatpay-Signature": rsa2(f"{ts}\n{nonce}\n{body}\n".encode()),
        "Wechatpay-Signature-Type": "WECHATPAY2-SHA256-RSA2048",
    }
    if verify:
        from wechatpayv3.core import Core
        core = Core(mchid="1900000001", cert_serial_no="MERCHANT", private_key=merchant, apiv3_key=apiv3,
                    public_key=public, public_key_id=serial)
        got = core.callback(headers, body)
        assert got and got["resource"]["transaction_id"] == event["id"], "wechatpayv3 refused"
    for k, v in headers.items():
        print(k + ": " + v)
    print("=body " + body)
elif platform == "adyen":
    from Adyen.util import generate_notification_sig, is_valid_hmac_notification
    event = json.loads(payload)
    # The HMAC key in hex, as Adyen's Customer Area shows it.
    key = secret.encode().hex().upper()
    item = {
        "pspReference": event["id"], "originalReference": "", "merchantAccountCode": "IdemTestECOM",
        "merchantReference": "order-" + event["id"], "amount": {"value": event["amount"], "currency": "EUR"},
        "eventCode": "AUTHORISATION", "success": "true", "eventDate": "2026-12-05T12:00:00+01:00",
        "paymentMethod": "visa", "operations": ["CANCEL", "CAPTURE", "REFUND"], "reason": "033899:1111:03/2030",
    }
    item["additionalData"] = {"hmacSignature": generate_notification_sig(item, key).decode()}
    notification = {"live": "false", "notificationItems": [{"NotificationRequestItem": item}]}
    if verify:
        assert is_valid_hmac_notification(notification, key), "Adyen's is_valid_hmac_notification refused"
    print("=body " + json.dumps(notification, separators=(",", ":")))
"#;

/// Node (an ES module: resolved from `$IDEM_SDK_NODE`, its working
/// directory).
const NODE: &str = r#"
import { sign, verify } from "@octokit/webhooks-methods";
import { readFileSync } from "node:fs";
const [secret, check] = process.argv.slice(1);
const payload = readFileSync(0, "utf8");
const sig = await sign(secret, payload);
if (check === "1" && !(await verify(secret, payload, sig))) throw new Error("verify refused");
console.log("x-hub-signature-256: " + sig);
"#;

/// A callback as the platform sends it.
#[derive(Debug, Clone)]
struct Signed {
    headers: Vec<(String, String)>,
    /// The event's body, or the notification built from it (Alipay's
    /// form, WeChat Pay's encrypted resource).
    body: Vec<u8>,
}

/// The callback `platform`'s SDK sends for `body`, or `None` (skipped)
/// when the SDK is not installed.
fn sdk_headers(
    platform: Platform,
    secret: &str,
    ts: i64,
    msg_id: &str,
    verify: bool,
    body: &[u8],
) -> Option<Signed> {
    let check = if verify { "1" } else { "0" };
    let mut cmd = match platform {
        Platform::GitHub => {
            let dir =
                std::env::var("IDEM_SDK_NODE").unwrap_or_else(|_| "/opt/idem-sdk/node".into());
            let mut c = Command::new("node");
            c.current_dir(dir)
                .args(["--input-type=module", "-e", NODE, secret, check]);
            c
        }
        _ => {
            let name = match platform {
                Platform::Stripe => "stripe",
                Platform::Standard => "standard",
                Platform::Shopify => "shopify",
                Platform::Alipay => "alipay",
                Platform::WeChat => "wechat",
                Platform::Adyen => "adyen",
                _ => "paddle",
            };
            let secret = match platform {
                Platform::Alipay | Platform::WeChat => rsa_key(secret),
                _ => secret.to_owned(),
            };
            let mut c = Command::new("python3");
            c.args(["-c", PYTHON, &secret, &ts.to_string(), msg_id, check, name]);
            c
        }
    };
    let child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            unreachable(platform.sdk(), e);
            return None;
        }
    };
    child.stdin.take().unwrap().write_all(body).unwrap();
    let out = child.wait_with_output().expect("the SDK ran");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        // The SDK absent: skipped (failed under CI). Anything else: the
        // SDK refused what it signed, a failure.
        let absent = [
            "ModuleNotFoundError",
            "ERR_MODULE_NOT_FOUND",
            "No such file",
            "ENOENT",
        ];
        if absent.iter().any(|a| stderr.contains(a)) {
            unreachable(platform.sdk(), stderr.lines().last().unwrap_or_default());
            return None;
        }
        panic!("{} failed: {stderr}", platform.sdk());
    }
    let out = String::from_utf8(out.stdout).unwrap();
    let headers = out
        .lines()
        .filter(|l| !l.starts_with("=body "))
        .filter_map(|l| l.split_once(": "))
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    let built = out.lines().find_map(|l| l.strip_prefix("=body "));
    let body = built.map_or_else(|| body.to_vec(), |b| b.as_bytes().to_vec());
    Some(Signed { headers, body })
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The schemes of one merchant's service, each rolling from `OLD` to `NEW`.
#[derive(Clone)]
struct Schemes {
    stripe: Stripe,
    standard: StandardWebhooks,
    github: GitHub,
    shopify: Shopify,
    paddle: Paddle,
    alipay: Alipay,
    wechat: WeChatPay,
    adyen: Adyen,
}

fn schemes() -> Schemes {
    Schemes {
        stripe: Stripe::new(OLD).secret(NEW),
        standard: StandardWebhooks::new(OLD).unwrap().secret(NEW).unwrap(),
        github: GitHub::new(OLD).secret(NEW),
        shopify: Shopify::new(OLD).secret(NEW),
        // Paddle's default is 5 s: a loaded test machine may take longer
        // between its SDK's signature and the request.
        paddle: Paddle::new(OLD)
            .secret(NEW)
            .tolerance(Duration::from_secs(60)),
        alipay: Alipay::new(include_str!("keys/old.pub.pem"))
            .unwrap()
            .key(include_str!("keys/new.pub.pem"))
            .unwrap(),
        wechat: WeChatPay::new(
            "PUB_KEY_ID_OLD",
            include_str!("keys/old.pub.pem"),
            APIV3.as_bytes(),
        )
        .unwrap()
        .key("PUB_KEY_ID_NEW", include_str!("keys/new.pub.pem"))
        .unwrap(),
        // Adyen's HMAC keys are hex: the secrets' bytes, in hex.
        adyen: Adyen::new(&hex::encode(OLD))
            .unwrap()
            .secret(&hex::encode(NEW))
            .unwrap(),
    }
}

macro_rules! backend_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            use super::*;
            type Db = $db;

            #[idempotent(key = "platform:{serial}", strategy = record, biz_type = "http_platform_test", fingerprint = [serial])]
            async fn book(tx: &mut sqlx::Transaction<'_, Db>, table: &str, serial: &str) -> Result<i64, sqlx::Error> {
                let insert = sql($dialect, "INSERT INTO {t} (serial) VALUES (?)");
                sqlx::query(sqlx::AssertSqlSafe(insert.0.replace("{t}", table)))
                    .bind(serial)
                    .execute(&mut **tx)
                    .await?;
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
                    .fetch_one(&mut **tx)
                    .await
            }

            #[derive(Clone)]
            struct App {
                pool: sqlx::Pool<Db>,
                table: String,
                schemes: Schemes,
            }

            impl FromRef<App> for Stripe {
                fn from_ref(a: &App) -> Self { a.schemes.stripe.clone() }
            }
            impl FromRef<App> for StandardWebhooks {
                fn from_ref(a: &App) -> Self { a.schemes.standard.clone() }
            }
            impl FromRef<App> for GitHub {
                fn from_ref(a: &App) -> Self { a.schemes.github.clone() }
            }
            impl FromRef<App> for Shopify {
                fn from_ref(a: &App) -> Self { a.schemes.shopify.clone() }
            }
            impl FromRef<App> for Paddle {
                fn from_ref(a: &App) -> Self { a.schemes.paddle.clone() }
            }
            impl FromRef<App> for Alipay {
                fn from_ref(a: &App) -> Self { a.schemes.alipay.clone() }
            }
            impl FromRef<App> for WeChatPay {
                fn from_ref(a: &App) -> Self { a.schemes.wechat.clone() }
            }
            impl FromRef<App> for Adyen {
                fn from_ref(a: &App) -> Self { a.schemes.adyen.clone() }
            }

            /// Books the callback under its serial; the platform's answer,
            /// with `x-booked: executed` or `duplicate` for the test.
            async fn booked<V: idem_runtime::http::SignatureScheme>(app: &App, cb: SignedCallback<V>) -> Response {
                let how = match book(&app.pool, &app.table, cb.serial()).await {
                    Ok(Outcome::Executed(_)) => "executed",
                    Ok(Outcome::Duplicate(_)) => "duplicate",
                    Err(Error::KeyConflict { .. }) => return StatusCode::CONFLICT.into_response(),
                    Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
                };
                let mut answer = cb.accepted();
                answer.headers_mut().insert("x-booked", how.parse().unwrap());
                answer
            }

            async fn stripe(State(app): State<App>, cb: SignedCallback<Stripe>) -> Response { booked(&app, cb).await }
            async fn standard(State(app): State<App>, cb: SignedCallback<StandardWebhooks>) -> Response { booked(&app, cb).await }
            async fn github(State(app): State<App>, cb: SignedCallback<GitHub>) -> Response { booked(&app, cb).await }
            async fn shopify(State(app): State<App>, cb: SignedCallback<Shopify>) -> Response { booked(&app, cb).await }
            async fn paddle(State(app): State<App>, cb: SignedCallback<Paddle>) -> Response { booked(&app, cb).await }
            async fn alipay(State(app): State<App>, cb: SignedCallback<Alipay>) -> Response { booked(&app, cb).await }
            async fn wechat(State(app): State<App>, cb: SignedCallback<WeChatPay>) -> Response { booked(&app, cb).await }
            async fn adyen(State(app): State<App>, cb: SignedCallback<Adyen>) -> Response { booked(&app, cb).await }

            struct Fixture {
                base: String,
                pool: sqlx::Pool<Db>,
                table: String,
                platform: Platform,
            }

            async fn fixture(platform: Platform) -> Option<Fixture> {
                let pool: sqlx::Pool<Db> = $pool?;
                let table = unique("http_platform");
                let ddl = "CREATE TABLE {t} (serial VARCHAR(128) NOT NULL)";
                sqlx::query(sqlx::AssertSqlSafe(ddl.replace("{t}", &table)))
                    .execute(&pool)
                    .await
                    .expect("create table");
                let app = App { pool: pool.clone(), table: table.clone(), schemes: schemes() };
                let router = Router::new()
                    .route("/stripe", post(stripe))
                    .route("/standard", post(standard))
                    .route("/github", post(github))
                    .route("/shopify", post(shopify))
                    .route("/paddle", post(paddle))
                    .route("/alipay", post(alipay))
                    .route("/wechat", post(wechat))
                    .route("/adyen", post(adyen))
                    .with_state(app);
                Some(Fixture { base: http::serve(router).await, pool, table, platform })
            }

            impl Fixture {
                async fn push(&self, body: &[u8], headers: &[(String, String)]) -> (u16, String) {
                    let mut r = http::client()
                        .post(format!("{}{}", self.base, self.platform.path()))
                        .header("content-type", self.platform.content_type())
                        .body(body.to_vec());
                    for (n, v) in headers {
                        r = r.header(n.as_str(), v.as_str());
                    }
                    let resp = r.send().await.expect("send");
                    let status = resp.status().as_u16();
                    let booked = resp.headers().get("x-booked").map(|v| v.to_str().unwrap().to_owned());
                    let text = resp.text().await.expect("body");
                    (status, booked.unwrap_or(text))
                }

                /// Rows booked.
                async fn effects(&self) -> i64 {
                    let q = format!("SELECT COUNT(*) FROM {}", self.table);
                    sqlx::query_scalar(sqlx::AssertSqlSafe(q)).fetch_one(&self.pool).await.expect("count")
                }

                /// Rows booked under `serial`.
                async fn booked(&self, serial: &str) -> i64 {
                    let q = sql($dialect, "SELECT COUNT(*) FROM {t} WHERE serial = ?");
                    sqlx::query_scalar(sqlx::AssertSqlSafe(q.0.replace("{t}", &self.table)))
                        .bind(serial)
                        .fetch_one(&self.pool)
                        .await
                        .expect("count")
                }

                async fn records(&self, serial: &str) -> i64 {
                    let q = sql($dialect, "SELECT COUNT(*) FROM idem_record WHERE biz_type = 'http_platform_test' AND idempotency_key = ?");
                    // The key as the macro writes it: the serial percent-encoded
                    // (Adyen's `psp:EVENT` holds a separator).
                    let mut key = String::from("platform:");
                    idem_runtime::escape_part(serial, &mut key);
                    sqlx::query_scalar(q).bind(key).fetch_one(&self.pool).await.expect("count")
                }
            }

            /// An event: its id (in the body as Stripe's `id` and
            /// Paddle's `event_id`; the message id of Standard Webhooks)
            /// and its body.
            fn event(amount: i64) -> (String, Vec<u8>) {
                let id = format!("evt_{}", ids(1));
                let body = format!(r#"{{"id":"{id}","event_id":"{id}","type":"payment.succeeded","amount":{amount}}}"#);
                (id, body.into_bytes())
            }

            /// The serial the service books `id`'s callback under.
            fn serial(platform: Platform, id: &str, body: &[u8]) -> String {
                match platform {
                    Platform::GitHub | Platform::Shopify => {
                        use sha2::Digest;
                        format!("sha256-{}", hex::encode(sha2::Sha256::digest(body)))
                    }
                    Platform::Standard => format!("msg_{id}"),
                    Platform::Adyen => format!("{id}:AUTHORISATION"),
                    _ => id.to_owned(),
                }
            }

            /// `signed` with its signature malformed (400), and without
            /// it (400): in its headers, Alipay's `sign` in the form, or
            /// Adyen's `hmacSignature` in the item.
            fn unsigned(platform: Platform, signed: &Signed) -> [Signed; 2] {
                if platform == Platform::Adyen {
                    let with = |sig: Option<&str>| {
                        let mut v: serde_json::Value = serde_json::from_slice(&signed.body).unwrap();
                        let data = &mut v["notificationItems"][0]["NotificationRequestItem"]["additionalData"];
                        match sig {
                            Some(s) => data["hmacSignature"] = s.into(),
                            None => *data = serde_json::json!({}),
                        }
                        Signed { headers: vec![], body: v.to_string().into_bytes() }
                    };
                    return [with(Some("garbage")), with(None)];
                }
                if platform == Platform::Alipay {
                    let form = String::from_utf8(signed.body.clone()).unwrap();
                    let without: Vec<&str> = form.split('&').filter(|p| !p.starts_with("sign=")).collect();
                    let without = without.join("&");
                    let garbage = format!("{without}&sign=garbage");
                    return [
                        Signed { headers: vec![], body: garbage.into_bytes() },
                        Signed { headers: vec![], body: without.into_bytes() },
                    ];
                }
                let malformed = signed
                    .headers
                    .iter()
                    .map(|(n, v)| match n.as_str() {
                        "webhook-timestamp" | "webhook-id" => (n.clone(), v.clone()),
                        _ => (n.clone(), "garbage".into()),
                    })
                    .collect();
                [
                    Signed { headers: malformed, body: signed.body.clone() },
                    Signed { headers: vec![], body: signed.body.clone() },
                ]
            }

            async fn scenario(platform: Platform) {
                let Some(f) = fixture(platform).await else { return };
                let sign = |secret: &str, ts: i64, id: &str, verify: bool, body: &[u8]| {
                    sdk_headers(platform, secret, ts, &format!("msg_{id}"), verify, body)
                };
                // Booked once; replayed: a duplicate, one row.
                let (id, event_body) = event(1999);
                let Some(first) = sign(OLD, now(), &id, true, &event_body) else { return };
                assert_eq!(f.push(&first.body, &first.headers).await, (200, "executed".into()));
                assert_eq!(f.push(&first.body, &first.headers).await, (200, "duplicate".into()));
                let key = serial(platform, &id, &first.body);
                assert_eq!(f.booked(&key).await, 1);
                assert_eq!(f.records(&key).await, 1);

                // A tampered body under the genuine headers: 401.
                let tampered = String::from_utf8(first.body.clone()).unwrap().replace("1999", "1");
                let (status, text) = f.push(tampered.as_bytes(), &first.headers).await;
                assert_eq!(status, 401, "{text}");
                // Signed with a secret the service does not hold: 401.
                let (other, other_body) = event(5);
                let forged = sign(WRONG, now(), &other, false, &other_body).unwrap();
                let (status, text) = f.push(&forged.body, &forged.headers).await;
                assert_eq!(status, 401, "{text}");
                // Signed an hour ago (captured and sent again): 401.
                if platform.signs_a_timestamp() {
                    let stale = sign(OLD, now() - 3600, &other, false, &other_body).unwrap();
                    let (status, text) = f.push(&stale.body, &stale.headers).await;
                    assert_eq!(status, 401, "{text}");
                    assert!(text.contains("ago"), "{text}");
                }
                // A malformed signature, none at all: 400.
                let genuine = sign(OLD, now(), &other, false, &other_body).unwrap();
                for refused in unsigned(platform, &genuine) {
                    let (status, text) = f.push(&refused.body, &refused.headers).await;
                    assert_eq!(status, 400, "{text}");
                }
                assert_eq!(f.effects().await, 1, "nothing refused was booked");
                assert_eq!(f.records(&serial(platform, &other, &genuine.body)).await, 0);

                // A second event, on its own.
                let (second, second_body) = event(2500);
                let h = sign(OLD, now(), &second, true, &second_body).unwrap();
                assert_eq!(f.push(&h.body, &h.headers).await, (200, "executed".into()));
                // The key roll: signed with the new secret alone.
                let (rolled, rolled_body) = event(3000);
                let h = sign(NEW, now(), &rolled, true, &rolled_body).unwrap();
                assert_eq!(f.push(&h.body, &h.headers).await, (200, "executed".into()));
                assert_eq!(f.push(&h.body, &h.headers).await, (200, "duplicate".into()));
                assert_eq!(f.booked(&serial(platform, &rolled, &h.body)).await, 1);
                assert_eq!(f.effects().await, 3);
            }

            #[tokio::test]
            async fn stripe_sdk_signed() { scenario(Platform::Stripe).await }
            #[tokio::test]
            async fn standard_webhooks_sdk_signed() { scenario(Platform::Standard).await }
            #[tokio::test]
            async fn github_octokit_signed() { scenario(Platform::GitHub).await }
            #[tokio::test]
            async fn shopify_documented_signature() { scenario(Platform::Shopify).await }
            #[tokio::test]
            async fn paddle_sdk_signed() { scenario(Platform::Paddle).await }
            #[tokio::test]
            async fn alipay_sdk_verified() { scenario(Platform::Alipay).await }
            #[tokio::test]
            async fn wechat_pay_sdk_verified() { scenario(Platform::WeChat).await }
            #[tokio::test]
            async fn adyen_sdk_signed() { scenario(Platform::Adyen).await }
        }
    };
}

idem_testkit::for_each_backend!(backend_tests; postgres(4), sqlite(4), mariadb(4));

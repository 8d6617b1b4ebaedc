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
//!
//! Then, for every platform: a callback is booked once; the same callback
//! replayed is a duplicate (one row); a tampered body, a wrong secret, a
//! stale timestamp (where the platform signs one) and a malformed header
//! are refused and book nothing; a second event is booked on its own; a
//! callback signed with the new secret during a key roll is accepted.
//!
//! The SDKs (`.ci/run` installs them): Python `stripe`, `standardwebhooks`
//! and `paddle-python-sdk`; Node `@octokit/webhooks-methods` in
//! `$IDEM_SDK_NODE` (default `/opt/idem-sdk/node`). A missing SDK skips the
//! test locally and fails it under `CI=true`.

use crate::common::http;

use axum::Router;
use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem_runtime::http::SignedCallback;
use idem_runtime::http::scheme::{GitHub, Paddle, Shopify, StandardWebhooks, Stripe};
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

#[derive(Debug, Clone, Copy, PartialEq)]
enum Platform {
    Stripe,
    Standard,
    GitHub,
    Shopify,
    Paddle,
}

impl Platform {
    fn path(self) -> &'static str {
        match self {
            Platform::Stripe => "/stripe",
            Platform::Standard => "/standard",
            Platform::GitHub => "/github",
            Platform::Shopify => "/shopify",
            Platform::Paddle => "/paddle",
        }
    }

    fn signs_a_timestamp(self) -> bool {
        !matches!(self, Platform::GitHub | Platform::Shopify)
    }

    /// The SDK's name, for the skip message.
    fn sdk(self) -> &'static str {
        match self {
            Platform::Stripe => "the Python SDK `stripe`",
            Platform::Standard => "the Python SDK `standardwebhooks`",
            Platform::GitHub => "the Node package `@octokit/webhooks-methods`",
            Platform::Shopify => "Python",
            Platform::Paddle => "the Python SDK `paddle-python-sdk`",
        }
    }
}

/// Python: the payload on stdin, `secret ts id verify` in argv, the
/// headers out as `name: value` lines. `verify` is `1` when the SDK must
/// check what it signed (a fresh callback under the right secret).
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

/// The headers `platform`'s SDK sends with `body`, or `None` (skipped)
/// when the SDK is not installed.
fn sdk_headers(
    platform: Platform,
    secret: &str,
    ts: i64,
    msg_id: &str,
    verify: bool,
    body: &[u8],
) -> Option<Vec<(String, String)>> {
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
                _ => "paddle",
            };
            let mut c = Command::new("python3");
            c.args(["-c", PYTHON, secret, &ts.to_string(), msg_id, check, name]);
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
    let headers = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    Some(headers)
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
                    .with_state(app);
                Some(Fixture { base: http::serve(router).await, pool, table, platform })
            }

            impl Fixture {
                async fn push(&self, body: &[u8], headers: &[(String, String)]) -> (u16, String) {
                    let mut r = http::client()
                        .post(format!("{}{}", self.base, self.platform.path()))
                        .header("content-type", "application/json")
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
                    sqlx::query_scalar(q).bind(format!("platform:{serial}")).fetch_one(&self.pool).await.expect("count")
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
                    _ => id.to_owned(),
                }
            }

            async fn scenario(platform: Platform) {
                let Some(f) = fixture(platform).await else { return };
                let sign = |secret: &str, ts: i64, id: &str, verify: bool, body: &[u8]| {
                    sdk_headers(platform, secret, ts, &format!("msg_{id}"), verify, body)
                };
                // Booked once; replayed: a duplicate, one row.
                let (id, body) = event(1999);
                let Some(first) = sign(OLD, now(), &id, true, &body) else { return };
                assert_eq!(f.push(&body, &first).await, (200, "executed".into()));
                assert_eq!(f.push(&body, &first).await, (200, "duplicate".into()));
                let key = serial(platform, &id, &body);
                assert_eq!(f.booked(&key).await, 1);
                assert_eq!(f.records(&key).await, 1);

                // A tampered body under the genuine headers: 401.
                let tampered = String::from_utf8(body.clone()).unwrap().replace("1999", "1");
                let (status, text) = f.push(tampered.as_bytes(), &first).await;
                assert_eq!(status, 401, "{text}");
                // Signed with a secret the service does not hold: 401.
                let (other, other_body) = event(5);
                let forged = sign(WRONG, now(), &other, false, &other_body).unwrap();
                assert_eq!(f.push(&other_body, &forged).await.0, 401);
                // Signed an hour ago (captured and sent again): 401.
                if platform.signs_a_timestamp() {
                    let stale = sign(OLD, now() - 3600, &other, false, &other_body).unwrap();
                    let (status, text) = f.push(&other_body, &stale).await;
                    assert_eq!(status, 401, "{text}");
                    assert!(text.contains("ago"), "{text}");
                }
                // A malformed signature header: 400.
                let malformed: Vec<(String, String)> = first
                    .iter()
                    .map(|(n, v)| match n.as_str() {
                        "webhook-timestamp" | "webhook-id" => (n.clone(), v.clone()),
                        _ => (n.clone(), "garbage".into()),
                    })
                    .collect();
                assert_eq!(f.push(&other_body, &malformed).await.0, 400);
                assert_eq!(f.push(&other_body, &[]).await.0, 400);
                assert_eq!(f.effects().await, 1, "nothing refused was booked");
                assert_eq!(f.records(&serial(platform, &other, &other_body)).await, 0);

                // A second event, on its own.
                let (second, second_body) = event(2500);
                let h = sign(OLD, now(), &second, true, &second_body).unwrap();
                assert_eq!(f.push(&second_body, &h).await, (200, "executed".into()));
                // The key roll: signed with the new secret alone.
                let (rolled, rolled_body) = event(3000);
                let h = sign(NEW, now(), &rolled, true, &rolled_body).unwrap();
                assert_eq!(f.push(&rolled_body, &h).await, (200, "executed".into()));
                assert_eq!(f.push(&rolled_body, &h).await, (200, "duplicate".into()));
                assert_eq!(f.booked(&serial(platform, &rolled, &rolled_body)).await, 1);
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
        }
    };
}

idem_testkit::for_each_backend!(backend_tests; postgres(4), sqlite(4), mariadb(4));

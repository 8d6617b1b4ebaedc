//! Signed third-party callbacks over real HTTP (reqwest against an axum
//! server on loopback), on PostgreSQL, SQLite and MariaDB: the platform's
//! pushes of one callback, side by side or after a lost answer, book it
//! once; a forged or tampered signature, a stale or future timestamp, a
//! missing signature and a crafted serial are refused before the database
//! (no effect, no record); a platform that names its deliveries in a header
//! the signature does not cover: one signed delivery replayed under other
//! delivery ids books once.

use crate::common::http;

use axum::Router;
use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem_runtime::http::{CallbackVerifier, SerialFrom, SignedCallback};
use idem_runtime::{Error, Outcome, idempotent};
use idem_testkit::{ids, sql, unique};
use serde::{Deserialize, Serialize};
use std::time::Duration;

const SECRET: &[u8] = b"platform-and-merchant";

/// The platform's event.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Event {
    event_id: String,
    amount: i64,
}

/// What booking it answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Booked {
    row: i64,
    amount: i64,
}

/// The platform's serials: `evt_` and 1 to 20 digits.
fn event_id(s: &str) -> Result<(), String> {
    match s.strip_prefix("evt_") {
        Some(d) if (1..=20).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()) => Ok(()),
        _ => Err(format!("`{}` is not evt_<digits>", s.escape_default())),
    }
}

fn verifier() -> CallbackVerifier {
    CallbackVerifier::new(SECRET.to_vec())
        .tolerance(Duration::from_secs(300))
        .serial(SerialFrom::JsonField("event_id"), event_id)
}

/// The header a platform names its deliveries in, outside the signature
/// (GitHub's `X-GitHub-Delivery`, Shopify's `X-Shopify-Webhook-Id`).
const DELIVERY: &str = "x-delivery-id";

/// Such a platform: it signs the timestamp and the body, not the header;
/// the key is what it signs.
fn delivery_verifier() -> CallbackVerifier {
    CallbackVerifier::new(SECRET.to_vec()).serial(SerialFrom::BodyDigest, |_| Ok(()))
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

macro_rules! backend_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            use super::*;
            type Db = $db;

            #[idempotent(key = "http-cb:{ev.event_id}", strategy = record, biz_type = "http_cb_test", fingerprint = [ev])]
            async fn book(tx: &mut sqlx::Transaction<'_, Db>, table: &str, ev: &Event) -> Result<Booked, sqlx::Error> {
                insert_booking(tx, table, ev).await
            }

            /// The same booking, keyed by the verifier's serial alone.
            #[idempotent(key = "http-cb-serial:{serial}", strategy = record, biz_type = "http_cb_test", fingerprint = [ev])]
            async fn book_serial(tx: &mut sqlx::Transaction<'_, Db>, table: &str, serial: &str, ev: &Event) -> Result<Booked, sqlx::Error> {
                insert_booking(tx, table, ev).await
            }

            async fn insert_booking(tx: &mut sqlx::Transaction<'_, Db>, table: &str, ev: &Event) -> Result<Booked, sqlx::Error> {
                let insert = sql($dialect, "INSERT INTO {t} (event_id, amount) VALUES (?, ?)");
                sqlx::query(sqlx::AssertSqlSafe(insert.0.replace("{t}", table)))
                    .bind(&ev.event_id)
                    .bind(ev.amount)
                    .execute(&mut **tx)
                    .await?;
                let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
                    .fetch_one(&mut **tx)
                    .await?;
                Ok(Booked { row: n, amount: ev.amount })
            }

            #[derive(Clone)]
            struct App {
                pool: sqlx::Pool<Db>,
                table: String,
                verifier: CallbackVerifier,
            }

            impl FromRef<App> for CallbackVerifier {
                fn from_ref(app: &App) -> Self {
                    app.verifier.clone()
                }
            }

            /// Only verified callbacks with a valid serial get here.
            async fn paid(State(app): State<App>, cb: SignedCallback) -> Response {
                let ev: Event = match cb.json() {
                    Ok(ev) => ev,
                    Err(answer) => return answer,
                };
                assert_eq!(ev.event_id, cb.serial());
                answered(book(&app.pool, &app.table, &ev).await)
            }

            /// `/deliveries`: keyed by the serial, wherever the verifier
            /// reads it.
            async fn delivered(State(app): State<App>, cb: SignedCallback) -> Response {
                let ev: Event = match cb.json() {
                    Ok(ev) => ev,
                    Err(answer) => return answer,
                };
                answered(book_serial(&app.pool, &app.table, cb.serial(), &ev).await)
            }

            fn answered(booked: Result<Outcome<Booked>, Error>) -> Response {
                match booked {
                    Ok(Outcome::Executed(b) | Outcome::Duplicate(Some(b))) => {
                        serde_json::to_string(&b).unwrap().into_response()
                    }
                    Ok(Outcome::Duplicate(None)) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                    Err(Error::KeyConflict { .. }) => StatusCode::CONFLICT.into_response(),
                    Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
                }
            }

            struct Fixture {
                base: String,
                pool: sqlx::Pool<Db>,
                table: String,
            }

            async fn fixture() -> Option<Fixture> {
                fixture_with(verifier()).await
            }

            async fn fixture_with(verifier: CallbackVerifier) -> Option<Fixture> {
                let pool: sqlx::Pool<Db> = $pool?;
                let table = unique("http_cb");
                let ddl = "CREATE TABLE {t} (event_id VARCHAR(64) NOT NULL, amount BIGINT NOT NULL)";
                sqlx::query(sqlx::AssertSqlSafe(ddl.replace("{t}", &table)))
                    .execute(&pool)
                    .await
                    .expect("create table");
                let app = App { pool: pool.clone(), table: table.clone(), verifier };
                let router = Router::new()
                    .route("/callbacks", post(paid))
                    .route("/deliveries", post(delivered))
                    .with_state(app);
                Some(Fixture { base: http::serve(router).await, pool, table })
            }

            impl Fixture {
                /// Pushes `body` with these signature and timestamp headers.
                async fn push(&self, body: &[u8], sig: Option<&str>, ts: Option<i64>) -> (u16, String) {
                    self.push_to("/callbacks", body, sig, ts, &[]).await
                }

                /// The same to `path`, with `extra` headers.
                async fn push_to(&self, path: &str, body: &[u8], sig: Option<&str>, ts: Option<i64>, extra: &[(&str, &str)]) -> (u16, String) {
                    let mut r = http::client()
                        .post(format!("{}{path}", self.base))
                        .header("content-type", "application/json")
                        .body(body.to_vec());
                    for (name, value) in extra {
                        r = r.header(*name, *value);
                    }
                    if let Some(sig) = sig {
                        r = r.header("x-signature", sig);
                    }
                    if let Some(ts) = ts {
                        r = r.header("x-timestamp", ts.to_string());
                    }
                    let resp = r.send().await.expect("send");
                    (resp.status().as_u16(), resp.text().await.expect("body"))
                }

                /// Pushes `body` signed now with the shared secret.
                async fn push_signed(&self, body: &[u8]) -> (u16, String) {
                    let ts = now();
                    self.push(body, Some(&verifier().sign(ts, body)), Some(ts)).await
                }

                async fn effects(&self, event: &str) -> i64 {
                    let q = sql($dialect, "SELECT COUNT(*) FROM {t} WHERE event_id = ?");
                    sqlx::query_scalar(sqlx::AssertSqlSafe(q.0.replace("{t}", &self.table)))
                        .bind(event)
                        .fetch_one(&self.pool)
                        .await
                        .expect("count")
                }

                async fn records(&self, event: &str) -> i64 {
                    let q = sql($dialect, "SELECT COUNT(*) FROM idem_record WHERE biz_type = 'http_cb_test' AND idempotency_key = ?");
                    sqlx::query_scalar(q).bind(format!("http-cb:{event}")).fetch_one(&self.pool).await.expect("count")
                }
            }

            fn event(amount: i64) -> (String, Vec<u8>) {
                let id = format!("evt_{}", ids(1));
                let body = serde_json::to_vec(&Event { event_id: id.clone(), amount }).unwrap();
                (id, body)
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn concurrent_pushes_book_once() {
                let Some(f) = fixture().await else { return };
                let f = std::sync::Arc::new(f);
                let (id, body) = event(1999);
                let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(8));
                let mut tasks = Vec::new();
                for _ in 0..8 {
                    let (f, body, b) = (f.clone(), body.clone(), barrier.clone());
                    tasks.push(tokio::spawn(async move {
                        b.wait().await;
                        f.push_signed(&body).await
                    }));
                }
                let mut answers = Vec::new();
                for t in tasks {
                    answers.push(t.await.unwrap());
                }
                assert!(answers.iter().all(|a| a.0 == 200 && a.1 == answers[0].1), "{answers:?}");
                assert_eq!(f.effects(&id).await, 1);
                assert_eq!(f.records(&id).await, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_lost_answer_and_the_platforms_retry_book_once() {
                let Some(f) = fixture().await else { return };
                let (id, body) = event(500);
                let ts = now();
                let lost = http::client()
                    .post(format!("{}/callbacks", f.base))
                    .header("x-signature", verifier().sign(ts, &body))
                    .header("x-timestamp", ts.to_string())
                    .header(http::LOSE, "1")
                    .timeout(Duration::from_millis(700))
                    .body(body.clone())
                    .send()
                    .await;
                assert!(lost.is_err_and(|e| e.is_timeout()));
                // The platform signs each push anew.
                let first = f.push_signed(&body).await;
                let second = f.push_signed(&body).await;
                assert_eq!(first.0, 200, "{first:?}");
                assert_eq!(first, second);
                assert_eq!(f.effects(&id).await, 1);
            }

            #[tokio::test]
            async fn forged_tampered_and_unsigned_callbacks_are_refused() {
                let Some(f) = fixture().await else { return };
                let (id, body) = event(700);
                let ts = now();
                let forged = CallbackVerifier::new(b"guessed".to_vec()).sign(ts, &body);
                let (status, text) = f.push(&body, Some(&forged), Some(ts)).await;
                assert_eq!(status, 401, "{text}");
                assert!(text.contains("does not match"), "{text}");
                // The genuine signature of another body.
                let genuine = verifier().sign(ts, &body);
                let tampered = String::from_utf8(body.clone()).unwrap().replace("700", "7");
                assert_eq!(f.push(tampered.as_bytes(), Some(&genuine), Some(ts)).await.0, 401);
                // A genuine signature with the timestamp moved forward.
                assert_eq!(f.push(&body, Some(&genuine), Some(ts + 1)).await.0, 401);
                // Missing or malformed headers: 400.
                assert_eq!(f.push(&body, None, Some(ts)).await.0, 400);
                assert_eq!(f.push(&body, Some("not hex"), Some(ts)).await.0, 400);
                assert_eq!(f.push(&body, Some(&genuine), None).await.0, 400);
                assert_eq!(f.effects(&id).await, 0);
                assert_eq!(f.records(&id).await, 0);
            }

            #[tokio::test]
            async fn stale_and_future_callbacks_are_refused() {
                let Some(f) = fixture().await else { return };
                let (id, body) = event(800);
                // Correctly signed, an hour old: a captured callback sent again.
                let old = now() - 3600;
                let (status, text) = f.push(&body, Some(&verifier().sign(old, &body)), Some(old)).await;
                assert_eq!(status, 401, "{text}");
                assert!(text.contains("ago"), "{text}");
                let ahead = now() + 3600;
                assert_eq!(f.push(&body, Some(&verifier().sign(ahead, &body)), Some(ahead)).await.0, 401);
                assert_eq!(f.effects(&id).await, 0);
                assert_eq!(f.records(&id).await, 0);
                // Within the tolerance it is booked.
                assert_eq!(f.push_signed(&body).await.0, 200);
                assert_eq!(f.effects(&id).await, 1);
            }

            #[tokio::test]
            async fn a_delivery_replayed_under_other_delivery_ids_books_once() {
                let Some(f) = fixture_with(delivery_verifier()).await else { return };
                let (id, body) = event(1200);
                let first = format!("dlv_{}", ids(1));
                let ts = now();
                let sig = delivery_verifier().sign(ts, &body);
                let mut answers = vec![f.push_to("/deliveries", &body, Some(&sig), Some(ts), &[(DELIVERY, &first)]).await];
                // Its signed bytes captured and sent again within the
                // tolerance, each time under another delivery id.
                for n in 0..2 {
                    let other = format!("{first}_{n}");
                    answers.push(f.push_to("/deliveries", &body, Some(&sig), Some(ts), &[(DELIVERY, &other)]).await);
                }
                // The platform's own retry, signed anew.
                let ts = now();
                let sig = delivery_verifier().sign(ts, &body);
                answers.push(f.push_to("/deliveries", &body, Some(&sig), Some(ts), &[(DELIVERY, &first)]).await);
                assert!(answers.iter().all(|a| a.0 == 200 && a.1 == answers[0].1), "{answers:?}");
                assert_eq!(f.effects(&id).await, 1, "{answers:?}");
            }

            #[tokio::test]
            async fn crafted_serials_are_refused_before_the_database() {
                let Some(f) = fixture().await else { return };
                let long = format!("evt_{}", "9".repeat(300));
                for serial in ["../../admin", "evt_", "EVT_1", long.as_str(), "evt_1 OR 1=1"] {
                    let body = serde_json::to_vec(&Event { event_id: serial.into(), amount: 1 }).unwrap();
                    let (status, text) = f.push_signed(&body).await;
                    assert_eq!(status, 400, "{serial}: {text}");
                    assert_eq!(f.effects(serial).await, 0);
                }
                // Another payload under a booked serial: 409, nothing booked.
                let (id, body) = event(900);
                assert_eq!(f.push_signed(&body).await.0, 200);
                let other = serde_json::to_vec(&Event { event_id: id.clone(), amount: 1 }).unwrap();
                assert_eq!(f.push_signed(&other).await.0, 409);
                assert_eq!(f.effects(&id).await, 1);
            }
        }
    };
}

idem_testkit::for_each_backend!(backend_tests; postgres(8), sqlite(8), mariadb(8));

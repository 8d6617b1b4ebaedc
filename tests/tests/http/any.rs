//! `Idempotency-Key` requests over `sqlx::Any` (one application for every
//! database, the dialect chosen by the pool's URL), over real HTTP
//! (reqwest against an axum server on loopback) on PostgreSQL, SQLite and
//! MariaDB: by hand (`begin` … `finish`) and behind the layer
//! (`RequestTx<Any>`), with a `record` handler and an outbox message in the
//! request's transaction, a request with a key runs once and its retry gets
//! the first answer replayed, byte for byte. (The HTTP layer's futures must
//! be `Send` over `Any`, whose connection is not `Sync`: a reference to the
//! call held across an await breaks the build, here and in the layer.)

use crate::common::http;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem_runtime::Dialect;
use idem_runtime::http::{IDEMPOTENT_REPLAYED, Idempotency, IdempotentRequest, RequestTx};
use idem_runtime::outbox::enqueue;
use idem_runtime::{CallerTx, idempotent};
use idem_testkit::{ids, sql, unique};
use sqlx::{Any, AnyConnection, AnyPool};

/// The caller: the `x-api-key` header.
fn api_key(parts: &axum::http::request::Parts) -> Option<String> {
    parts
        .headers
        .get("x-api-key")?
        .to_str()
        .ok()
        .map(str::to_owned)
}

#[derive(Clone)]
struct App {
    pool: AnyPool,
    dialect: Dialect,
    table: String,
    policy: Idempotency,
}

impl App {
    /// The rows `route` wrote, committed.
    async fn rows(&self, route: &str) -> i64 {
        let q = sql(self.dialect, "SELECT COUNT(*) FROM {t} WHERE route = ?");
        sqlx::query_scalar(sqlx::AssertSqlSafe(q.0.replace("{t}", &self.table)))
            .bind(route)
            .fetch_one(&self.pool)
            .await
            .expect("count")
    }

    /// The outbox messages `route` enqueued, committed.
    async fn messages(&self, route: &str) -> i64 {
        let q = sql(
            self.dialect,
            "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND msg_id = ?",
        );
        sqlx::query_scalar(q)
            .bind(&self.table)
            .bind(route)
            .fetch_one(&self.pool)
            .await
            .expect("count")
    }
}

/// What a request books.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Booking {
    table: String,
    numbered: bool,
    route: String,
}

/// The `record` handler run inside the request's transaction: one row of
/// `route` per execution.
#[idempotent(key = "http-any:{b.table}:{b.route}", strategy = record, biz_type = "http_any_book")]
async fn book(tx: &mut AnyConnection, b: &Booking) -> Result<(), sqlx::Error> {
    let dialect = if b.numbered {
        Dialect::Postgres
    } else {
        Dialect::Sqlite
    };
    let insert = sql(dialect, "INSERT INTO {t} (route) VALUES (?)");
    sqlx::query(sqlx::AssertSqlSafe(insert.0.replace("{t}", &b.table)))
        .bind(&b.route)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The effects, in the request's transaction: the record call and an
/// outbox message; then the route's rows seen from inside it.
async fn effect(
    app: &App,
    tx: &mut CallerTx<Any>,
    route: &str,
) -> Result<i64, idem_runtime::Error> {
    let b = Booking {
        table: app.table.clone(),
        numbered: app.dialect == Dialect::Postgres,
        route: route.into(),
    };
    let _outcome = book(&mut *tx, &b).await?;
    let msg = serde_json::json!({ "route": route });
    enqueue(tx.transaction()?, &app.table, route, &msg).await?;
    let count = sql(app.dialect, "SELECT COUNT(*) FROM {t} WHERE route = ?");
    Ok(
        sqlx::query_scalar(sqlx::AssertSqlSafe(count.0.replace("{t}", &app.table)))
            .bind(route)
            .fetch_one(tx.conn()?)
            .await?,
    )
}

/// 201 with the rows seen and a value unique to this execution.
fn created(n: i64) -> Response {
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let body = format!("{{\"rows\":{n},\"execution\":\"{nonce}\"}}");
    (StatusCode::CREATED, body).into_response()
}

/// `POST /by-hand`: `begin`, the effect in `call.tx()`, `finish`.
async fn by_hand(State(app): State<App>, req: IdempotentRequest) -> Response {
    let mut call = match app.policy.begin(&app.pool, &req).await {
        Ok(call) => call,
        Err(answer) => return answer,
    };
    match effect(&app, call.tx(), "by-hand").await {
        Ok(n) => call.finish(created(n)).await,
        Err(e) => {
            call.abandon((StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
                .await
        }
    }
}

/// `POST /layered`: a plain handler behind the layer.
async fn layered(State(app): State<App>, mut tx: RequestTx<Any>) -> Response {
    match effect(&app, &mut tx, "layered").await {
        Ok(n) => created(n),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

/// The app on `pool`, served; its base URL.
async fn serve(dialect: Dialect, pool: AnyPool) -> (String, App) {
    let table = unique("http_any");
    let ddl = format!("CREATE TABLE {table} (route VARCHAR(32) NOT NULL)");
    sqlx::query(sqlx::AssertSqlSafe(ddl))
        .execute(&pool)
        .await
        .expect("create table");
    // One scope per test: its records never meet another test's.
    let scope: &'static str = Box::leak(unique("http_any").into_boxed_str());
    let policy = Idempotency::new(scope, api_key);
    let app = App {
        pool: pool.clone(),
        dialect,
        table,
        policy: policy.clone(),
    };
    let router = Router::new()
        .route("/by-hand", post(by_hand))
        .route("/layered", post(layered).layer(policy.layer(&pool)))
        .with_state(app.clone());
    (http::serve(router).await, app)
}

/// A request with a fresh key, then its retry: executed once, the answer
/// replayed byte for byte.
async fn runs_once_then_replays(base: &str, path: &str) {
    let key = format!("\"any-{}\"", ids(1));
    let send = || {
        http::client()
            .post(format!("{base}{path}"))
            .header("x-api-key", "caller-1")
            .header("idempotency-key", &key)
            .body("{}")
            .send()
    };
    let first = send().await.expect("send");
    let (status, replayed) = (
        first.status().as_u16(),
        first.headers().contains_key(IDEMPOTENT_REPLAYED),
    );
    let first = first.text().await.expect("body");
    assert_eq!((status, replayed), (201, false), "{path}: {first}");
    assert!(first.starts_with("{\"rows\":1,"), "{path}: {first}");
    let again = send().await.expect("send");
    assert_eq!(again.status().as_u16(), 201, "{path}");
    assert_eq!(again.headers()[IDEMPOTENT_REPLAYED], "true", "{path}");
    assert_eq!(again.text().await.expect("body"), first, "{path}");
}

macro_rules! any_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_keyed_request_runs_once_and_is_replayed_by_hand_and_behind_the_layer() {
                let Some(pool): Option<sqlx::Pool<$db>> = $pool else {
                    return;
                };
                let (base, app) = serve($dialect, pool).await;
                runs_once_then_replays(&base, "/by-hand").await;
                runs_once_then_replays(&base, "/layered").await;
                assert_eq!(app.rows("by-hand").await, 1);
                assert_eq!(app.rows("layered").await, 1);
                assert_eq!(app.messages("by-hand").await, 1);
                assert_eq!(app.messages("layered").await, 1);
            }
        }
    };
}

// Through `sqlx::Any` only, the modules named after the databases.
idem_testkit::for_each_backend!(any_tests;
    any_postgres(4) as postgres,
    any_sqlite(4) as sqlite,
    any_mariadb(4) as mariadb,
);

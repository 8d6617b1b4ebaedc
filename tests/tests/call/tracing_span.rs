//! Every call emits a `tracing` span `idempotent` with the handler, the
//! strategy, the key and the outcome.

use idem_runtime::{Outcome, idempotent};
use sqlx::{Sqlite, Transaction};
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Collects every field of every `idempotent` span, as `name=value`.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<String>>>);

struct Fields<'a>(&'a mut Vec<String>);
impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push(format!("{}={:?}", field.name(), value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push(format!("{}={}", field.name(), value));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        if attrs.metadata().name() == "idempotent" {
            attrs.record(&mut Fields(&mut self.0.lock().unwrap()));
        }
    }
    fn on_record(&self, _: &Id, values: &Record<'_>, _: Context<'_, S>) {
        values.record(&mut Fields(&mut self.0.lock().unwrap()));
    }
}

struct Msg {
    id: String,
}

#[idempotent(key = "ping:{msg.id}", strategy = unique_insert, constraint = "ping.id")]
async fn ping(tx: &mut Transaction<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO ping (id) VALUES (?)")
        .bind(&msg.id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn span_carries_key_and_outcome() {
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let pool = idem_testkit::sqlite(2).await;
    sqlx::query("CREATE TABLE ping (id TEXT PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    let msg = Msg { id: "p-1".into() };
    assert_eq!(ping(&pool, &msg).await.unwrap(), Outcome::Executed(()));
    assert_eq!(ping(&pool, &msg).await.unwrap(), Outcome::Duplicate(None));
    assert!(ping(&pool, &Msg { id: String::new() }).await.is_err());
    let seen = capture.0.lock().unwrap().clone();
    for expected in [
        "handler=ping",
        "strategy=unique_insert",
        "key=ping:p-1",
        "outcome=executed",
        "outcome=duplicate",
        "outcome=invalid_key",
    ] {
        assert!(
            seen.iter().any(|f| f == expected),
            "{expected} missing from {seen:?}"
        );
    }
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ping")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

//! The payment-callback service over real HTTP (an ephemeral loopback port)
//! on the local PostgreSQL. A test whose server is down prints SKIPPED, or
//! fails when CI=true (`idem_testkit::postgres`).
//!
//! Past 500 lines on purpose: one service's scenarios, sharing one fixture,
//! read best in one file, in order.

use idem_examples::payments::{
    self, Attempt, Callback, ErrorBody, Fault, Faults, Platform, Receipt, SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
};
use sqlx::PgPool;
use std::time::Duration;

const SECRET: &[u8] = b"test-shared-secret";

/// The platform's signature of `body` sent at `timestamp`.
fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    payments::verifier(secret.to_vec()).sign(timestamp, body)
}

fn unix_now() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.unwrap().as_secs() as i64
}

struct Service {
    pool: PgPool,
    base: String,
}

/// The service on 127.0.0.1:0, optionally behind a fault injector.
async fn start(faults: Option<&Faults>) -> Option<Service> {
    let pool = idem_testkit::postgres(32).await?;
    payments::migrate(&pool).await.expect("migrate");
    let mut app = payments::app(pool.clone(), SECRET);
    if let Some(f) = faults {
        app = f.wrap(app);
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    Some(Service {
        pool,
        base: format!("http://{addr}"),
    })
}

impl Service {
    /// A platform that tries once (no retries) unless told otherwise.
    fn platform(&self, max_retries: u32) -> Platform {
        Platform {
            max_retries,
            timeout: Duration::from_secs(10),
            backoff: Duration::from_millis(10),
            ..Platform::new(&self.base, SECRET)
        }
    }

    /// A fresh order awaiting `amount` cents, and a fresh serial for it.
    async fn order(&self, amount: i64) -> (i64, String) {
        let id = idem_testkit::ids(1);
        payments::create_order(&self.pool, id, amount)
            .await
            .expect("create order");
        (id, payments::serial(id as u64))
    }

    async fn ledger_rows(&self, order_id: i64) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM pay_payments WHERE order_id = $1")
            .bind(order_id)
            .fetch_one(&self.pool)
            .await
            .expect("count ledger")
    }

    async fn ledger_amount(&self, order_id: i64) -> Vec<(String, i64)> {
        sqlx::query_as("SELECT serial, amount_cents FROM pay_payments WHERE order_id = $1")
            .bind(order_id)
            .fetch_all(&self.pool)
            .await
            .expect("read ledger")
    }

    async fn order_state(&self, order_id: i64) -> (String, Option<String>) {
        sqlx::query_as("SELECT status, paid_serial FROM pay_orders WHERE id = $1")
            .bind(order_id)
            .fetch_one(&self.pool)
            .await
            .expect("read order")
    }

    /// Idempotency records of this order (`biz_no` is the order id).
    async fn records(&self, order_id: i64) -> i64 {
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM idem_record WHERE biz_type = 'payment_callback' AND biz_no = $1",
        )
        .bind(order_id.to_string())
        .fetch_one(&self.pool)
        .await
        .expect("count records")
    }

    async fn records_with_key(&self, key: &str) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM idem_record WHERE idempotency_key = $1")
            .bind(key)
            .fetch_one(&self.pool)
            .await
            .expect("count records")
    }

    /// POSTs `body` with `signature` and `timestamp` once; the status and
    /// body.
    async fn post_raw(
        &self,
        body: &[u8],
        signature: Option<&str>,
        timestamp: i64,
    ) -> (u16, String) {
        let mut req = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .post(format!("{}{}", self.base, payments::CALLBACK_PATH))
            .header("content-type", "application/json")
            .header(TIMESTAMP_HEADER, timestamp)
            .body(body.to_vec());
        if let Some(s) = signature {
            req = req.header(SIGNATURE_HEADER, s);
        }
        let resp = req.send().await.expect("send");
        let status = resp.status().as_u16();
        (status, resp.text().await.expect("body"))
    }
}

fn code_of(body: &str) -> String {
    serde_json::from_str::<ErrorBody>(body)
        .unwrap_or_else(|e| panic!("not an error body ({e}): {body}"))
        .code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_callback_and_its_retry_pay_once_and_answer_the_same_body() {
    let Some(svc) = start(None).await else { return };
    let (order, serial) = svc.order(1999).await;
    let cb = Callback::success(&serial, order, 1999);
    let platform = svc.platform(0);

    let first = platform.deliver(&cb).await.expect("first delivery");
    assert_eq!(
        (first.status, first.attempts, first.replayed),
        (200, 1, false)
    );
    let receipt: Receipt = serde_json::from_str(&first.body).unwrap();
    assert_eq!(receipt.serial, serial);
    assert_eq!((receipt.order_id, receipt.amount_cents), (order, 1999));
    assert_eq!(receipt.order_status, "PAID");

    let retry = platform.deliver(&cb).await.expect("retry");
    assert_eq!((retry.status, retry.replayed), (200, true));
    assert_eq!(
        retry.body, first.body,
        "the retry gets the stored body, byte for byte"
    );

    assert_eq!(svc.ledger_rows(order).await, 1);
    assert_eq!(
        svc.order_state(order).await,
        ("PAID".into(), Some(serial.clone()))
    );
    assert_eq!(
        svc.records_with_key(&format!("pay-callback:{serial}"))
            .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_duplicates_book_one_payment() {
    let Some(svc) = start(None).await else { return };
    let (order, serial) = svc.order(4200).await;
    let cb = Callback::success(&serial, order, 4200);
    let platform = svc.platform(0);

    let results = idem_testkit::concurrently(20, || {
        let (p, cb) = (platform.clone(), cb.clone());
        async move { p.deliver(&cb).await }
    })
    .await;
    let bodies: Vec<String> = results
        .into_iter()
        .map(|r| {
            let d = r.expect("every duplicate is acknowledged");
            assert_eq!((d.status, d.attempts), (200, 1));
            d.body
        })
        .collect();
    assert!(
        bodies.iter().all(|b| *b == bodies[0]),
        "all 20 answers carry the same body: {bodies:#?}"
    );
    assert_eq!(svc.ledger_rows(order).await, 1);
    assert_eq!(svc.records(order).await, 1);
    assert_eq!(svc.order_state(order).await.0, "PAID");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_signature_or_a_stale_timestamp_is_refused_and_writes_nothing() {
    let Some(svc) = start(None).await else { return };
    let (order, serial) = svc.order(500).await;
    let cb = Callback::success(&serial, order, 500);
    let body = serde_json::to_vec(&cb).unwrap();

    // Signed with another secret (a forger), by the platform: it retries,
    // and gets 401 every time.
    let forger = Platform {
        secret: b"not-the-secret".to_vec(),
        ..svc.platform(2)
    };
    let gave_up = forger.deliver(&cb).await.expect_err("never acknowledged");
    assert_eq!(gave_up.history, vec![Attempt::Status(401); 3]);
    assert_eq!(
        code_of(gave_up.last_body.as_deref().unwrap()),
        "BAD_SIGNATURE"
    );

    // Tampered: the right signature of another body (the amount changed).
    let now = unix_now();
    let signature = sign(SECRET, now, &body);
    let tampered = serde_json::to_vec(&Callback::success(&serial, order, 1)).unwrap();
    let (status, text) = svc.post_raw(&tampered, Some(&signature), now).await;
    assert_eq!((status, code_of(&text).as_str()), (401, "BAD_SIGNATURE"));
    // Missing, not hex: 400; truncated (hex, but not the HMAC): 401.
    for (sig, expected) in [
        (None, 400),
        (Some("zz-not-hex"), 400),
        (Some(&signature[..20]), 401),
    ] {
        let (status, text) = svc.post_raw(&body, sig, now).await;
        assert_eq!(
            (status, code_of(&text).as_str()),
            (expected, "BAD_SIGNATURE"),
            "{sig:?}"
        );
    }
    // The signature is over the raw bytes: the same JSON re-serialized with
    // other whitespace is another body.
    let spaced = serde_json::to_vec_pretty(&cb).unwrap();
    assert_eq!(svc.post_raw(&spaced, Some(&signature), now).await.0, 401);
    // The signature covers the timestamp: moving it breaks the signature.
    assert_eq!(svc.post_raw(&body, Some(&signature), now + 1).await.0, 401);
    // A genuine callback signed an hour ago (captured, sent again): 401.
    let old = now - 3600;
    let (status, text) = svc
        .post_raw(&body, Some(&sign(SECRET, old, &body)), old)
        .await;
    assert_eq!((status, code_of(&text).as_str()), (401, "BAD_SIGNATURE"));
    assert!(text.contains("ago"), "{text}");
    // Over the body limit: refused before the signature is even computed.
    let huge = vec![b' '; payments::MAX_BODY + 1];
    assert_eq!(svc.post_raw(&huge, Some(&signature), now).await.0, 413);

    assert_eq!(
        svc.records_with_key(&format!("pay-callback:{serial}"))
            .await,
        0
    );
    assert_eq!(svc.records(order).await, 0);
    assert_eq!(svc.ledger_rows(order).await, 0);
    assert_eq!(
        svc.order_state(order).await,
        ("PENDING_PAYMENT".into(), None)
    );

    // The genuine callback still goes through afterwards.
    let ok = svc
        .platform(0)
        .deliver(&cb)
        .await
        .expect("genuine callback");
    assert_eq!((ok.status, ok.replayed), (200, false));
    assert_eq!(svc.ledger_rows(order).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_serial_is_400_and_writes_nothing() {
    let Some(svc) = start(None).await else { return };
    let (order, serial) = svc.order(700).await;
    let long = format!("PAY{}", "1".repeat(300));
    let bad = [
        "../../x",
        "",
        "PAY123",
        &long,
        "pay00000000000000000001",
        "PAY0000000000000000000x",
        "PAY0000000000000000000\n1",
        "PAY０００００００００００００００００００１", // full-width digits
        "XYZ00000000000000000001",
    ];
    let platform = svc.platform(0);
    for s in bad {
        let cb = Callback::success(s, order, 700);
        let gave_up = platform.deliver(&cb).await.expect_err("rejected");
        assert_eq!(gave_up.last_status, Some(400), "{s:?}");
        assert_eq!(
            code_of(gave_up.last_body.as_deref().unwrap()),
            "BAD_SERIAL",
            "{s:?}"
        );
        if !s.is_empty() && s.len() < 100 {
            let key = format!("pay-callback:{s}");
            assert_eq!(svc.records_with_key(&key).await, 0, "{s:?}");
        }
    }
    assert_eq!(svc.records(order).await, 0);
    assert_eq!(svc.ledger_rows(order).await, 0);
    assert_eq!(
        svc.order_state(order).await,
        ("PENDING_PAYMENT".into(), None)
    );
    // A well-formed serial for the same order is accepted.
    let ok = platform
        .deliver(&Callback::success(&serial, order, 700))
        .await
        .expect("valid serial");
    assert_eq!(ok.status, 200);
    assert_eq!(svc.ledger_rows(order).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_serial_with_another_amount_is_409() {
    let Some(svc) = start(None).await else { return };
    let (order, serial) = svc.order(3000).await;
    let platform = svc.platform(0);
    let first = platform
        .deliver(&Callback::success(&serial, order, 3000))
        .await
        .expect("paid");
    assert_eq!(first.status, 200);

    for (order_id, amount) in [(order, 3001), (order, 1), (order + 1, 3000)] {
        let gave_up = platform
            .deliver(&Callback::success(&serial, order_id, amount))
            .await
            .expect_err("conflict");
        assert_eq!(gave_up.last_status, Some(409), "{order_id} {amount}");
        assert_eq!(
            code_of(gave_up.last_body.as_deref().unwrap()),
            "SERIAL_REUSED"
        );
    }
    assert_eq!(svc.ledger_amount(order).await, vec![(serial.clone(), 3000)]);
    assert_eq!(
        svc.order_state(order).await,
        ("PAID".into(), Some(serial.clone()))
    );
    assert_eq!(svc.records(order).await, 1);
    // The genuine retry is still a duplicate with the stored body.
    let again = platform
        .deliver(&Callback::success(&serial, order, 3000))
        .await
        .expect("retry");
    assert_eq!((again.body, again.replayed), (first.body, true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_order_state_is_verified_in_the_same_transaction() {
    let Some(svc) = start(None).await else { return };
    let platform = svc.platform(0);
    let (order, serial) = svc.order(800).await;

    // The amount contradicts the order: 422, nothing written (not even the
    // idempotency record: the corrected callback must not be a duplicate).
    let gave_up = platform
        .deliver(&Callback::success(&serial, order, 799))
        .await
        .expect_err("amount mismatch");
    assert_eq!(gave_up.last_status, Some(422));
    assert_eq!(
        code_of(gave_up.last_body.as_deref().unwrap()),
        "AMOUNT_MISMATCH"
    );
    assert_eq!(
        (svc.records(order).await, svc.ledger_rows(order).await),
        (0, 0)
    );

    let ok = platform
        .deliver(&Callback::success(&serial, order, 800))
        .await
        .expect("paid");
    assert_eq!((ok.status, ok.replayed), (200, false));

    // Another serial for the paid order: a second payment, refused.
    let other = payments::serial(idem_testkit::ids(1) as u64);
    let gave_up = platform
        .deliver(&Callback::success(&other, order, 800))
        .await
        .expect_err("already paid");
    assert_eq!(gave_up.last_status, Some(409));
    assert_eq!(
        code_of(gave_up.last_body.as_deref().unwrap()),
        "ORDER_ALREADY_PAID"
    );
    assert_eq!(svc.ledger_amount(order).await, vec![(serial.clone(), 800)]);
    assert_eq!(svc.records(order).await, 1);

    // No such order; a cancelled order; a non-success status.
    let ghost = idem_testkit::ids(1);
    let gave_up = platform
        .deliver(&Callback::success(
            payments::serial(ghost as u64),
            ghost,
            100,
        ))
        .await
        .expect_err("unknown order");
    assert_eq!(gave_up.last_status, Some(422));
    assert_eq!(
        code_of(gave_up.last_body.as_deref().unwrap()),
        "UNKNOWN_ORDER"
    );

    let (cancelled, cserial) = svc.order(100).await;
    sqlx::query("UPDATE pay_orders SET status = 'CANCELLED' WHERE id = $1")
        .bind(cancelled)
        .execute(&svc.pool)
        .await
        .unwrap();
    let gave_up = platform
        .deliver(&Callback::success(&cserial, cancelled, 100))
        .await
        .expect_err("cancelled");
    assert_eq!(gave_up.last_status, Some(409));
    assert_eq!(
        code_of(gave_up.last_body.as_deref().unwrap()),
        "ORDER_NOT_PAYABLE"
    );
    assert_eq!(
        (
            svc.records(cancelled).await,
            svc.ledger_rows(cancelled).await
        ),
        (0, 0)
    );

    let (pending, pserial) = svc.order(100).await;
    let failed = Callback {
        status: "FAILED".into(),
        ..Callback::success(&pserial, pending, 100)
    };
    let gave_up = platform.deliver(&failed).await.expect_err("not a success");
    assert_eq!(gave_up.last_status, Some(422));
    assert_eq!(
        (svc.records(pending).await, svc.ledger_rows(pending).await),
        (0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paid_order_whose_record_was_archived_answers_from_its_state() {
    let Some(svc) = start(None).await else { return };
    let platform = svc.platform(0);
    let (order, serial) = svc.order(650).await;
    let first = platform
        .deliver(&Callback::success(&serial, order, 650))
        .await
        .expect("paid");
    // The record is archived (deleted) before a very late retry arrives.
    sqlx::query("DELETE FROM idem_record WHERE idempotency_key = $1")
        .bind(format!("pay-callback:{serial}"))
        .execute(&svc.pool)
        .await
        .unwrap();
    let late = platform
        .deliver(&Callback::success(&serial, order, 650))
        .await
        .expect("late retry");
    // Answered from the order's state and the ledger: the same receipt.
    assert_eq!(late.body, first.body);
    assert_eq!(svc.ledger_rows(order).await, 1);
    // ...but not with another amount.
    sqlx::query("DELETE FROM idem_record WHERE idempotency_key = $1")
        .bind(format!("pay-callback:{serial}"))
        .execute(&svc.pool)
        .await
        .unwrap();
    let gave_up = platform
        .deliver(&Callback::success(&serial, order, 651))
        .await
        .expect_err("other amount");
    assert_eq!(gave_up.last_status, Some(409));
    assert_eq!(svc.ledger_amount(order).await, vec![(serial, 650)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_platform_retries_lost_and_failed_answers_until_200() {
    // The first request commits but its answer is held back past the
    // platform's time-out (the lost response); the second commits nothing
    // new and a gateway answers 503; the third gets through.
    let faults = Faults::script(
        [Fault::LoseResponse, Fault::UnavailableAfter],
        Duration::from_secs(4),
    );
    let Some(svc) = start(Some(&faults)).await else {
        return;
    };
    let (order, serial) = svc.order(12_345).await;
    let cb = Callback::success(&serial, order, 12_345);
    let platform = Platform {
        max_retries: 6,
        timeout: Duration::from_millis(1000),
        backoff: Duration::from_millis(20),
        ..Platform::new(&svc.base, SECRET)
    };
    let d = platform.deliver(&cb).await.expect("delivered in the end");
    // Normally [TimedOut, 503, 200]; on a loaded machine a slow answer may
    // add time-outs, never another status.
    assert_eq!(
        d.history.first(),
        Some(&Attempt::TimedOut),
        "{:?}",
        d.history
    );
    assert_eq!(
        d.history.last(),
        Some(&Attempt::Status(200)),
        "{:?}",
        d.history
    );
    assert!(
        d.history[1..d.history.len() - 1]
            .iter()
            .all(|a| matches!(a, Attempt::TimedOut | Attempt::Status(503))),
        "{:?}",
        d.history
    );
    assert_eq!(d.status, 200);
    assert_eq!(d.attempts as usize, d.history.len());
    assert!(
        d.replayed,
        "the payment was booked by the first, lost, attempt"
    );
    let [_, lost, unavailable_after, unavailable_before] = faults.counts();
    assert_eq!((lost, unavailable_after, unavailable_before), (1, 1, 0));

    // The body is the stored receipt of the first attempt.
    let receipt: Receipt = serde_json::from_str(&d.body).unwrap();
    let (db_serial, db_amount, db_paid_at): (String, i64, String) = sqlx::query_as(
        r#"SELECT serial, amount_cents,
                  to_char(paid_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
             FROM pay_payments WHERE order_id = $1"#,
    )
    .bind(order)
    .fetch_one(&svc.pool)
    .await
    .unwrap();
    assert_eq!(
        (
            receipt.serial.as_str(),
            receipt.amount_cents,
            receipt.paid_at.as_str()
        ),
        (db_serial.as_str(), db_amount, db_paid_at.as_str())
    );
    let again = platform.deliver(&cb).await.expect("another retry");
    assert_eq!(again.body, d.body);

    assert_eq!(svc.ledger_rows(order).await, 1);
    assert_eq!(svc.records(order).await, 1);
    assert_eq!(svc.order_state(order).await, ("PAID".into(), Some(serial)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_platform_retries_connection_errors_and_gives_up() {
    // Nothing listens on this port any more.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let platform = Platform {
        max_retries: 2,
        timeout: Duration::from_millis(500),
        backoff: Duration::from_millis(5),
        ..Platform::new(format!("http://{addr}"), SECRET)
    };
    let gave_up = platform
        .deliver(&Callback::success(payments::serial(1), 1, 1))
        .await
        .expect_err("nobody answers");
    assert_eq!(gave_up.attempts, 3);
    assert!(
        gave_up
            .history
            .iter()
            .all(|a| matches!(a, Attempt::Failed(_))),
        "{:?}",
        gave_up.history
    );
    assert_eq!(gave_up.last_status, None);
}

#[test]
fn serials_and_signatures() {
    assert_eq!(payments::serial(42), "PAY00000000000000000042");
    assert!(payments::check_serial(&payments::serial(u64::MAX)).is_ok());
    assert!(payments::validate_serial("pay-callback:PAY00000000000000000042").is_ok());
    assert!(payments::validate_serial("PAY00000000000000000042").is_err());
    assert!(payments::check_serial("PAY0000000000000000042").is_err());
    let v = payments::verifier(b"k".to_vec());
    let sig = sign(b"k", 1_000, b"body");
    assert_eq!(sig.len(), 64);
    let headers = |sig: &str, ts: i64| {
        let mut h = axum::http::HeaderMap::new();
        h.insert(SIGNATURE_HEADER, sig.parse().unwrap());
        h.insert(TIMESTAMP_HEADER, ts.into());
        h
    };
    assert!(v.verify_at(&headers(&sig, 1_000), b"body", 1_000).is_ok());
    assert!(
        v.verify_at(&headers(&sig.to_uppercase(), 1_000), b"body", 1_200)
            .is_ok()
    );
    assert!(v.verify_at(&headers(&sig, 1_000), b"body!", 1_000).is_err());
    assert!(v.verify_at(&headers(&sig, 1_001), b"body", 1_000).is_err());
    assert!(v.verify_at(&headers(&sig, 1_000), b"body", 1_301).is_err());
    let other = payments::verifier(b"k2".to_vec());
    assert!(
        other
            .verify_at(&headers(&sig, 1_000), b"body", 1_000)
            .is_err()
    );
    assert!(
        v.verify_at(&axum::http::HeaderMap::new(), b"body", 1_000)
            .is_err()
    );
}

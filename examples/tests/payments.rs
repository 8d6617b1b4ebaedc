//! The payment-callback service over real HTTP (an ephemeral loopback port)
//! on the local PostgreSQL, its three routes called by the simulated
//! platforms (Stripe, Alipay, WeChat Pay), each notification signed as its
//! platform signs it. A test whose server is down prints SKIPPED, or fails
//! when CI=true (`idem_testkit::postgres`). Effects are counted in the
//! database.
//!
//! Past 500 lines on purpose: one service's scenarios, sharing one fixture,
//! read best in one file, in order.

use idem_examples::payments::{
    self, ALIPAY, Attempt, Charge, ErrorBody, Fault, Faults, Notification, PLATFORMS, Platform,
    PlatformKeys, Receipt, STRIPE, WECHATPAY,
};
use sqlx::PgPool;
use std::time::Duration;

struct Service {
    pool: PgPool,
    base: String,
}

/// The service on 127.0.0.1:0, optionally behind a fault injector.
async fn start(faults: Option<&Faults>) -> Option<Service> {
    let pool = idem_testkit::postgres(32).await?;
    payments::migrate(&pool).await.expect("migrate");
    let mut app = payments::app(pool.clone(), payments::Merchant::demo());
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
    /// The platforms, trying once (no retries) unless told otherwise.
    fn platform(&self, max_retries: u32) -> Platform {
        Platform {
            max_retries,
            timeout: Duration::from_secs(10),
            backoff: Duration::from_millis(10),
            ..Platform::new(&self.base)
        }
    }

    /// A fresh order awaiting `amount` cents, and its charge on `platform`
    /// under a fresh serial.
    async fn order(&self, platform: &'static str, amount: i64) -> Charge {
        let id = idem_testkit::ids(1);
        payments::create_order(&self.pool, id, amount)
            .await
            .expect("create order");
        charge(platform, id, amount)
    }

    async fn ledger(&self, order_id: i64) -> Vec<(String, String, i64)> {
        sqlx::query_as(
            "SELECT platform, serial, amount_cents FROM merchant_payments WHERE order_id = $1",
        )
        .bind(order_id)
        .fetch_all(&self.pool)
        .await
        .expect("read ledger")
    }

    async fn order_state(&self, order_id: i64) -> (String, Option<String>) {
        sqlx::query_as("SELECT status, paid_by FROM merchant_orders WHERE id = $1")
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

    /// The stored receipt of `charge`'s key, if any.
    async fn stored(&self, c: &Charge) -> Option<String> {
        let key = format!("pay-callback:{}:{}", c.platform, c.serial);
        sqlx::query_scalar("SELECT result FROM idem_record WHERE idempotency_key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .expect("read record")
    }

    /// Nothing booked for `order`: no record, no ledger row, still pending.
    async fn untouched(&self, order: i64) {
        assert_eq!(self.records(order).await, 0, "order {order}");
        assert_eq!(self.ledger(order).await, vec![], "order {order}");
        let state = self.order_state(order).await;
        assert_eq!(state, ("PENDING_PAYMENT".into(), None), "order {order}");
    }

    /// Paid once, by `c`.
    async fn paid_once_by(&self, c: &Charge) {
        let row = (c.platform.to_string(), c.serial.clone(), c.amount_cents);
        assert_eq!(self.ledger(c.order_id).await, vec![row]);
        assert_eq!(self.records(c.order_id).await, 1);
        let by = format!("{}:{}", c.platform, c.serial);
        assert_eq!(
            self.order_state(c.order_id).await,
            ("PAID".into(), Some(by))
        );
    }

    /// POSTs `notification` once, signed at `signed_at`: the status, the
    /// content type and the body.
    async fn post(&self, n: &Notification, signed_at: i64) -> (u16, String, String) {
        let mut req = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .post(format!("{}{}", self.base, n.path))
            .header("content-type", n.content_type)
            .body(n.body.clone());
        for (name, value) in n.headers(signed_at) {
            req = req.header(name, value);
        }
        let resp = req.send().await.expect("send");
        let status = resp.status().as_u16();
        let kind = resp.headers().get("content-type");
        let kind = kind
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        (status, kind, resp.text().await.expect("body"))
    }
}

fn charge(platform: &'static str, order_id: i64, amount_cents: i64) -> Charge {
    let serial = payments::serial(platform, idem_testkit::ids(1) as u64);
    Charge {
        platform,
        serial,
        order_id,
        amount_cents,
    }
}

fn code_of(body: &str) -> String {
    serde_json::from_str::<ErrorBody>(body)
        .unwrap_or_else(|e| panic!("not an error body ({e}): {body}"))
        .code
}

/// A refusal by the platform's preset, in the platform's format.
fn assert_preset_refusal(platform: &str, status: u16, (got, kind, body): &(u16, String, String)) {
    assert_eq!(*got, status, "{platform}: {body}");
    match platform {
        STRIPE => assert_eq!(kind, "application/problem+json", "{body}"),
        ALIPAY => assert_eq!(body, "failure"),
        _ => assert_eq!(code_of(body), "FAIL"),
    }
}

/// The platform's success answer: Alipay's `success`, Stripe's and WeChat
/// Pay's the receipt.
fn assert_success(c: &Charge, body: &str) {
    if c.platform == ALIPAY {
        assert_eq!(body, "success");
        return;
    }
    let receipt: Receipt = serde_json::from_str(body).unwrap();
    assert_eq!(
        (receipt.platform.as_str(), &receipt.serial),
        (c.platform, &c.serial)
    );
    assert_eq!(
        (receipt.order_id, receipt.amount_cents),
        (c.order_id, c.amount_cents)
    );
    assert_eq!(receipt.order_status, "PAID");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_platforms_callback_and_its_retry_pay_once() {
    let Some(svc) = start(None).await else { return };
    for p in PLATFORMS {
        let c = svc.order(p, 1999).await;
        let platform = svc.platform(0);
        let first = platform.deliver(&c).await.expect("first delivery");
        assert_eq!(
            (first.status, first.attempts, first.replayed),
            (200, 1, false)
        );
        assert_success(&c, &first.body);
        // Alipay resends its form as it is; Stripe and WeChat Pay sign anew.
        let retry = platform.deliver(&c).await.expect("retry");
        assert_eq!((retry.status, retry.replayed), (200, true), "{p}");
        assert_eq!(
            retry.body, first.body,
            "{p}: the retry gets the stored answer"
        );
        svc.paid_once_by(&c).await;
        let stored: Receipt = serde_json::from_str(&svc.stored(&c).await.unwrap()).unwrap();
        assert_eq!((stored.serial, stored.amount_cents), (c.serial, 1999));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_duplicates_book_one_payment_on_each_platform() {
    let Some(svc) = start(None).await else { return };
    for p in PLATFORMS {
        let c = svc.order(p, 4200).await;
        let platform = svc.platform(0);
        let notification = platform.notification(&c);
        let results = idem_testkit::concurrently(20, || {
            let (platform, n) = (platform.clone(), notification.clone());
            async move { platform.deliver_notification(&n).await }
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
        assert!(bodies.iter().all(|b| *b == bodies[0]), "{p}: {bodies:#?}");
        svc.paid_once_by(&c).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_tampered_stale_and_unsigned_callbacks_are_refused_and_write_nothing() {
    let Some(svc) = start(None).await else { return };
    let now = payments::unix_now();
    for p in PLATFORMS {
        let c = svc.order(p, 500).await;
        let platform = svc.platform(0);
        // Signed with keys that are not the platform's: 401, retried and
        // refused every time.
        let forger = Platform {
            keys: platform.keys.forged(),
            ..svc.platform(2)
        };
        let gave_up = forger.deliver(&c).await.expect_err("never acknowledged");
        assert_eq!(gave_up.history, vec![Attempt::Status(401); 3], "{p}");
        let n = forger.notification(&c);
        assert_preset_refusal(p, 401, &svc.post(&n, now).await);
        // Tampered: the amount changed after the signature.
        let genuine = platform.notification(&c);
        let text = String::from_utf8(genuine.body.clone()).unwrap();
        let tampered = match p {
            ALIPAY => text.replace("total_amount=5.00", "total_amount=0.01"),
            _ => text.replace("\"id\":\"", "\"id\":\"x"),
        };
        assert_ne!(tampered, text, "{p}");
        let signed_over_genuine = genuine.headers(now);
        let mut req = reqwest::Client::new()
            .post(format!("{}{}", svc.base, genuine.path))
            .header("content-type", genuine.content_type)
            .body(tampered);
        for (name, value) in &signed_over_genuine {
            req = req.header(*name, value);
        }
        assert_eq!(req.send().await.unwrap().status(), 401, "{p}");
        // Signed an hour ago (captured, sent again): 401 where the platform
        // signs a time; Alipay signs none, its serial tells it apart.
        if p != ALIPAY {
            assert_preset_refusal(p, 401, &svc.post(&genuine, now - 3600).await);
        }
        // No signature: 400.
        let unsigned = reqwest::Client::new()
            .post(format!("{}{}", svc.base, genuine.path))
            .header("content-type", genuine.content_type)
            .body(if p == ALIPAY {
                b"trade_no=1".to_vec()
            } else {
                genuine.body.clone()
            })
            .send()
            .await
            .unwrap();
        assert_eq!(unsigned.status(), 400, "{p}");
        // Over the body limit: refused before the signature is computed.
        let huge = genuine
            .clone()
            .with_body(vec![b' '; payments::MAX_BODY + 1]);
        assert_eq!(svc.post(&huge, now).await.0, 413, "{p}");
        svc.untouched(c.order_id).await;
        // The genuine callback still goes through afterwards.
        let ok = platform.deliver(&c).await.expect("genuine callback");
        assert_eq!((ok.status, ok.replayed), (200, false));
        svc.paid_once_by(&c).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_serial_is_400_and_writes_nothing() {
    let Some(svc) = start(None).await else { return };
    let long = "1".repeat(300);
    for p in PLATFORMS {
        let c = svc.order(p, 700).await;
        let prefix = if p == STRIPE { "evt_" } else { "" };
        let bad = [
            "../../x".to_string(),
            format!("{prefix}{long}"),
            if p == STRIPE {
                "evt_".into()
            } else {
                "123".into()
            },
            format!("{prefix}00000000000000000000\n1"),
            format!("{prefix}０００００００００００００００００００１"),
            if p == STRIPE {
                "evt-00000000000000000001".into()
            } else {
                "2026000000000000000x".into()
            },
        ];
        for s in bad {
            let n = svc.platform(0).notification(&Charge {
                serial: s.clone(),
                ..c.clone()
            });
            assert_preset_refusal(p, 400, &svc.post(&n, payments::unix_now()).await);
        }
        svc.untouched(c.order_id).await;
        let ok = svc.platform(0).deliver(&c).await.expect("valid serial");
        assert_eq!(ok.status, 200);
        svc.paid_once_by(&c).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_serial_with_another_payment_is_409() {
    let Some(svc) = start(None).await else { return };
    for p in PLATFORMS {
        let c = svc.order(p, 3000).await;
        let platform = svc.platform(0);
        let first = platform.deliver(&c).await.expect("paid");
        for (order_id, amount_cents) in
            [(c.order_id, 3001), (c.order_id, 1), (c.order_id + 1, 3000)]
        {
            let other = Charge {
                order_id,
                amount_cents,
                ..c.clone()
            };
            let gave_up = platform.deliver(&other).await.expect_err("conflict");
            assert_eq!(
                gave_up.last_status,
                Some(409),
                "{p} {order_id} {amount_cents}"
            );
            assert_eq!(
                code_of(gave_up.last_body.as_deref().unwrap()),
                "SERIAL_REUSED"
            );
        }
        svc.paid_once_by(&c).await;
        // The genuine retry is still a duplicate with the stored answer.
        let again = platform.deliver(&c).await.expect("retry");
        assert_eq!((again.body, again.replayed), (first.body, true));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_order_state_is_verified_in_the_same_transaction() {
    let Some(svc) = start(None).await else { return };
    let platform = svc.platform(0);
    let refused = |c: Charge| {
        let platform = platform.clone();
        async move {
            let gave_up = platform.deliver(&c).await.expect_err("refused");
            let body = gave_up.last_body.unwrap_or_default();
            (gave_up.last_status.unwrap_or_default(), code_of(&body))
        }
    };
    for p in PLATFORMS {
        let c = svc.order(p, 800).await;
        // The amount contradicts the order: 422, nothing written (not even
        // the idempotency record: the corrected callback is no duplicate).
        let wrong = Charge {
            amount_cents: 799,
            ..c.clone()
        };
        assert_eq!(refused(wrong).await, (422, "AMOUNT_MISMATCH".into()));
        svc.untouched(c.order_id).await;
        let ok = platform.deliver(&c).await.expect("paid");
        assert_eq!((ok.status, ok.replayed), (200, false));
        // Another serial for the paid order, on every platform: a second
        // payment, refused.
        for q in PLATFORMS {
            let second = charge(q, c.order_id, 800);
            assert_eq!(
                refused(second).await,
                (409, "ORDER_ALREADY_PAID".into()),
                "{p} {q}"
            );
        }
        svc.paid_once_by(&c).await;
        // No such order; a cancelled order.
        let ghost = charge(p, idem_testkit::ids(1), 100);
        assert_eq!(refused(ghost).await, (422, "UNKNOWN_ORDER".into()));
        let cancelled = svc.order(p, 100).await;
        sqlx::query("UPDATE merchant_orders SET status = 'CANCELLED' WHERE id = $1")
            .bind(cancelled.order_id)
            .execute(&svc.pool)
            .await
            .unwrap();
        let order = cancelled.order_id;
        assert_eq!(refused(cancelled).await, (409, "ORDER_NOT_PAYABLE".into()));
        assert_eq!(
            (svc.records(order).await, svc.ledger(order).await),
            (0, vec![])
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_is_not_a_success_of_this_merchant_in_cny_is_422() {
    let Some(svc) = start(None).await else { return };
    let platform = svc.platform(0);
    let now = payments::unix_now();
    // Each genuine notification with one signed field changed, re-signed
    // where the platform signs a header (Stripe; WeChat Pay's resource is
    // encrypted: its cases are in payments_fuzz.rs).
    let c = svc.order(STRIPE, 900).await;
    let text = String::from_utf8(platform.notification(&c).body).unwrap();
    for (from, to, code) in [
        (
            "\"status\":\"succeeded\"",
            "\"status\":\"processing\"",
            "UNSUPPORTED_STATUS",
        ),
        (
            "\"payment_status\":\"paid\"",
            "\"payment_status\":\"unpaid\"",
            "UNSUPPORTED_STATUS",
        ),
        (
            "\"currency\":\"cny\"",
            "\"currency\":\"usd\"",
            "AMOUNT_MISMATCH",
        ),
    ] {
        if !text.contains(from) {
            continue; // the other kind of event (by the order id's parity)
        }
        let body = text.replace(from, to).into_bytes();
        let n = platform.notification(&c).with_body(body);
        let (status, _, answer) = svc.post(&n, now).await;
        assert_eq!((status, code_of(&answer).as_str()), (422, code), "{to}");
    }
    let kinds = text.replace("payment_intent.succeeded", "charge.refunded");
    let kinds = kinds.replace("checkout.session.completed", "charge.refunded");
    let n = platform.notification(&c).with_body(kinds.into_bytes());
    let (status, _, answer) = svc.post(&n, now).await;
    assert_eq!(
        (status, code_of(&answer).as_str()),
        (422, "UNSUPPORTED_STATUS")
    );
    svc.untouched(c.order_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rotated_keys_are_accepted_and_unknown_ones_refused() {
    let Some(svc) = start(None).await else { return };
    let base = svc.platform(0);
    let signed_with = |keys: PlatformKeys| Platform {
        keys,
        ..base.clone()
    };
    let demo = PlatformKeys::demo();
    let one_secret = |s: &str| PlatformKeys {
        stripe_secrets: vec![s.as_bytes().to_vec()],
        ..demo.clone()
    };
    use idem_examples::payments::keys::{STRIPE_NEXT_SECRET, STRIPE_SECRET};
    // Stripe before, during and after its secret roll; WeChat Pay under
    // either platform key.
    for (platform, keys) in [
        (STRIPE, one_secret(STRIPE_SECRET)),
        (STRIPE, demo.clone()),
        (STRIPE, one_secret(STRIPE_NEXT_SECRET)),
        (WECHATPAY, demo.clone()),
        (WECHATPAY, demo.clone().wechatpay_key(1)),
    ] {
        let c = svc.order(platform, 1234).await;
        let d = signed_with(keys).deliver(&c).await.expect("accepted");
        assert_eq!(d.status, 200);
        svc.paid_once_by(&c).await;
    }
    // A WeChat Pay serial the merchant does not hold: 401.
    let c = svc.order(WECHATPAY, 1234).await;
    let mut keys = demo.clone().wechatpay_key(1);
    keys.wechatpay.0 = "PUB_KEY_ID_UNKNOWN".into();
    let n = signed_with(keys).notification(&c);
    assert_preset_refusal(WECHATPAY, 401, &svc.post(&n, payments::unix_now()).await);
    svc.untouched(c.order_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paid_order_whose_record_was_archived_answers_from_its_state() {
    let Some(svc) = start(None).await else { return };
    let platform = svc.platform(0);
    for p in PLATFORMS {
        let c = svc.order(p, 650).await;
        let first = platform.deliver(&c).await.expect("paid");
        let key = format!("pay-callback:{p}:{}", c.serial);
        let archive = || {
            sqlx::query("DELETE FROM idem_record WHERE idempotency_key = $1")
                .bind(&key)
                .execute(&svc.pool)
        };
        // The record is archived (deleted) before a very late retry arrives:
        // answered from the order's state and the ledger, the same receipt.
        archive().await.unwrap();
        let late = platform.deliver(&c).await.expect("late retry");
        assert_eq!(late.body, first.body, "{p}");
        // ...but not with another amount.
        archive().await.unwrap();
        let other = Charge {
            amount_cents: 651,
            ..c.clone()
        };
        let gave_up = platform.deliver(&other).await.expect_err("other amount");
        assert_eq!(gave_up.last_status, Some(409));
        let row = (p.to_string(), c.serial.clone(), 650);
        assert_eq!(svc.ledger(c.order_id).await, vec![row]);
    }
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
    let c = svc.order(WECHATPAY, 12_345).await;
    let platform = Platform {
        max_retries: 6,
        timeout: Duration::from_millis(1000),
        backoff: Duration::from_millis(20),
        ..Platform::new(&svc.base)
    };
    let d = platform.deliver(&c).await.expect("delivered in the end");
    // Normally [TimedOut, 503, 200]; on a loaded machine a slow answer may
    // add time-outs, never another status.
    let h = &d.history;
    assert_eq!(h.first(), Some(&Attempt::TimedOut), "{h:?}");
    assert_eq!(h.last(), Some(&Attempt::Status(200)), "{h:?}");
    let between = &h[1..h.len() - 1];
    assert!(
        between
            .iter()
            .all(|a| matches!(a, Attempt::TimedOut | Attempt::Status(503))),
        "{h:?}"
    );
    assert_eq!(d.attempts as usize, h.len());
    assert!(
        d.replayed,
        "the payment was booked by the first, lost, attempt"
    );
    let [_, lost, unavailable_after, unavailable_before] = faults.counts();
    assert_eq!((lost, unavailable_after, unavailable_before), (1, 1, 0));

    // The body is the stored receipt of the first attempt.
    let receipt: Receipt = serde_json::from_str(&d.body).unwrap();
    let paid_at: String = sqlx::query_scalar(
        r#"SELECT to_char(paid_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
             FROM merchant_payments WHERE order_id = $1"#,
    )
    .bind(c.order_id)
    .fetch_one(&svc.pool)
    .await
    .unwrap();
    assert_eq!(receipt.paid_at, paid_at);
    let again = platform.deliver(&c).await.expect("another retry");
    assert_eq!(again.body, d.body);
    svc.paid_once_by(&c).await;
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
        ..Platform::new(format!("http://{addr}"))
    };
    let gave_up = platform
        .deliver(&charge(ALIPAY, 1, 1))
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

//! The README's and the guide's code, compiled and run.
//!
//! - Every ```rust block of `README.md` and of the guide's chapters
//!   (`idem-runtime/src/guide/*.md`, but the `*.doctest.md` files, which
//!   rustdoc runs as doctests) must be, byte for byte, a marked region of
//!   `src/readme/` or of the payment-callbacks example, `src/payments/`
//!   (`// README: <name>` … `// README: end`, without the
//!   region's common indentation), and every region must be shown by one
//!   of them: an edit that drifts from the compiled code fails here,
//!   listing the blocks.
//! - The flows those regions show run against the real servers:
//!   PostgreSQL (the handlers, the producer and relay, the archiver),
//!   Redis (the front cache), RabbitMQ and NATS JetStream (consumer and
//!   publisher); the README's quick start on SQLite in memory. A
//!   server that is down skips its test (SKIPPED), or fails it when
//!   `CI=true`. Effects are counted in the database.

use idem_examples::readme::state_machine::{DeductCoupon, deduct_coupon_for_order};
use idem_examples::readme::{
    acts_once, archive, by_hand, cache, console, http, kafka, nats, outbox, quick_start, rabbitmq,
    record, redis_streams, rocketmq, shards, transaction, unique_insert, using,
};
use idem_runtime::archive::RetentionPolicy;
use idem_runtime::outbox::{Relay, enqueue};
use idem_runtime::{Error, Outcome};
use idem_testkit::{ids, unique};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- drift

/// The ```rust blocks of a Markdown text: (line of the opening fence, text).
fn rust_blocks(markdown: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, Vec<&str>)> = None;
    for (n, line) in markdown.lines().enumerate() {
        match open.as_mut() {
            None if line.trim_start().starts_with("```rust") => open = Some((n + 1, Vec::new())),
            None => {}
            Some(_) if line.trim_start().starts_with("```") => {
                let (at, lines) = open.take().expect("open block");
                blocks.push((at, lines.join("\n")));
            }
            Some((_, lines)) => lines.push(line),
        }
    }
    assert!(open.is_none(), "a ```rust block is never closed");
    blocks
}

/// The marked regions of a source file: name → text without the common
/// indentation of its non-empty lines.
fn regions(path: &Path, source: &str, out: &mut BTreeMap<String, String>) {
    let mut open: Option<(String, Vec<&str>)> = None;
    for line in source.lines() {
        let marker = line.trim().strip_prefix("// README: ");
        match (open.take(), marker) {
            (None, Some("end")) => panic!("{}: `// README: end` without a region", path.display()),
            (None, Some(name)) => open = Some((name.to_string(), Vec::new())),
            (None, None) => {}
            (Some((name, lines)), Some("end")) => {
                let indent = lines
                    .iter()
                    .filter(|l| !l.trim().is_empty())
                    .map(|l| l.len() - l.trim_start().len())
                    .min()
                    .unwrap_or(0);
                let text: Vec<&str> = lines
                    .iter()
                    .map(|l| {
                        if l.trim().is_empty() {
                            ""
                        } else {
                            &l[indent..]
                        }
                    })
                    .collect();
                let name = format!("{}: {name}", path.file_name().unwrap().to_string_lossy());
                assert!(
                    out.insert(name.clone(), text.join("\n")).is_none(),
                    "region {name} twice"
                );
            }
            (Some((name, _)), Some(other)) => {
                panic!(
                    "{}: region {name} not ended before `// README: {other}`",
                    path.display()
                )
            }
            (Some((name, mut lines)), None) => {
                lines.push(line);
                open = Some((name, lines));
            }
        }
    }
    if let Some((name, _)) = open {
        panic!("{}: region {name} is never ended", path.display());
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// The guide's chapters whose ```rust blocks are regions: every `.md` of
/// `idem-runtime/src/guide/` but the `*.doctest.md` ones (doctests).
fn guide_chapters() -> Vec<PathBuf> {
    let dir = root().join("../idem-runtime/src/guide");
    let mut chapters: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("idem-runtime/src/guide")
        .map(|entry| entry.expect("entry").path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.ends_with(".md") && !name.ends_with(".doctest.md")
        })
        .collect();
    chapters.sort();
    chapters
}

/// The ```rust blocks a reader sees, by file: the README's and the
/// guide chapters'.
fn shown_blocks() -> Vec<(String, usize, String)> {
    let mut files = vec![root().join("../README.md")];
    files.extend(guide_chapters());
    let mut blocks = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a shown file");
        let name = file
            .strip_prefix(root().join(".."))
            .unwrap_or(&file)
            .display()
            .to_string();
        for (line, block) in rust_blocks(&text) {
            blocks.push((name.clone(), line, block));
        }
    }
    blocks
}

/// Where the regions are: the README's and the guide's own files, and the
/// payment-callbacks example, whose routes the guide shows as they are
/// (tested by `tests/payments.rs`).
const REGION_DIRS: [&str; 2] = ["src/readme", "src/payments"];

#[test]
fn every_readme_and_guide_rust_block_is_a_compiled_region() {
    let blocks = shown_blocks();
    let mut marked = BTreeMap::new();
    for dir in REGION_DIRS {
        for entry in std::fs::read_dir(root().join(dir)).expect(dir) {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "rs") {
                let source = std::fs::read_to_string(&path).expect("source");
                regions(&path, &source, &mut marked);
            }
        }
    }
    let mut drifted = Vec::new();
    let mut shown = Vec::new();
    for (file, line, block) in &blocks {
        match marked.iter().find(|(_, region)| *region == block) {
            Some((name, _)) => shown.push(name.clone()),
            None => drifted.push(format!(
                "  {file}:{line}: `{}`",
                block.lines().next().unwrap_or("")
            )),
        }
    }
    let unshown: Vec<_> = marked.keys().filter(|n| !shown.contains(n)).collect();
    assert!(
        drifted.is_empty() && unshown.is_empty(),
        "README.md, the guide and examples/src/readme/ disagree.\n\
         ```rust blocks that are no marked region (edit the region, then copy it):\n{}\n\
         regions that no README or guide block shows: {unshown:?}",
        drifted.join("\n")
    );
    let in_readme = blocks.iter().filter(|(f, ..)| f == "README.md").count();
    assert!(in_readme >= 1, "no rust block in README.md");
    assert!(
        guide_chapters().len() >= 10,
        "guide chapters: {:?}",
        guide_chapters()
    );
    assert!(
        blocks.len() >= 25,
        "only {} rust blocks found",
        blocks.len()
    );
}

/// The README's quick start, a whole program on SQLite: its asserts (the
/// call executed, its retry a duplicate) hold.
#[test]
fn the_quick_start_runs() {
    quick_start::run().expect("the quick start");
}

/// The guide's route proof, on SQLite: the payment handler behind relays
/// acts once when its relay dies mid-delivery and when its lease runs
/// out, each fault injected, every payment's ledger rows exactly one.
#[tokio::test]
async fn acts_once_proves_the_payment_route() {
    let report = acts_once::run_route().await.expect("the route run");
    let ran: Vec<_> = report.scenarios.iter().map(|s| s.scenario).collect();
    assert_eq!(ran, idem_test::Scenario::RELAY, "{report}");
    for scenario in &report.scenarios {
        assert_eq!(scenario.faults(), 4, "{report}");
        for action in &scenario.actions {
            assert_eq!(action.effect, 1, "{report}");
            assert!(
                action.keys.iter().all(|k| k.starts_with("pay:PAY")) && !action.keys.is_empty(),
                "{report}"
            );
        }
    }
}

/// The guide's "Prove your handlers act once", on SQLite: the payment
/// handler goes through every scenario, each injects its faults, and every
/// payment's ledger rows, counted in the run's database, are exactly one.
#[tokio::test]
async fn acts_once_proves_the_payment_handler() {
    let report = acts_once::run().await.expect("the acts_once run");
    assert!(report.acts_once(), "{report}");
    assert_eq!(report.handler, "record_payment");
    assert_eq!(
        report.scenarios.len(),
        idem_test::Scenario::CALLS.len(),
        "{report}"
    );
    for scenario in &report.scenarios {
        assert!(!scenario.actions.is_empty(), "{report}");
        for action in &scenario.actions {
            assert_eq!(
                action.effect,
                1,
                "{}: #{}: {report}",
                scenario.scenario.name(),
                action.action
            );
            assert!(
                action.keys.iter().all(|k| k.starts_with("pay:PAY")),
                "{report}"
            );
        }
        let faulted = scenario.scenario != idem_test::Scenario::Single;
        assert_eq!(
            scenario.faults() > 0,
            faulted,
            "{}: {report}",
            scenario.scenario.name()
        );
    }
}

#[test]
fn the_drift_check_sees_a_changed_block() {
    let mut marked = BTreeMap::new();
    let source =
        "fn f() {\n    // README: x\n    let a = 1;\n\n    let b = a;\n    // README: end\n}\n";
    regions(Path::new("x.rs"), source, &mut marked);
    assert_eq!(marked["x.rs: x"], "let a = 1;\n\nlet b = a;");
    let md = "text\n```rust\nlet a = 1;\n\nlet b = a;\n```\n```sql\nSELECT 1;\n```\n";
    assert_eq!(
        rust_blocks(md),
        vec![(2, "let a = 1;\n\nlet b = a;".to_string())]
    );
    assert_ne!(
        rust_blocks(&md.replace("b = a", "b = 2"))[0].1,
        marked["x.rs: x"]
    );
}

// ------------------------------------------------------------- fixtures

/// PostgreSQL with idem's tables (the README's `migrate` line) and the
/// README's, or `None` (skipped).
async fn pool() -> Option<PgPool> {
    let pool = idem_testkit::postgres(8).await?;
    using::create_idem_tables(pool.clone())
        .await
        .expect("migrate");
    idem_examples::readme::create_tables(&pool)
        .await
        .expect("tables");
    Some(pool)
}

async fn coupon(pool: &PgPool, status: &str) -> i64 {
    let id = ids(1);
    sqlx::query("INSERT INTO readme_coupon (id, status) VALUES ($1, $2)")
        .bind(id)
        .bind(status)
        .execute(pool)
        .await
        .expect("coupon");
    id
}

async fn deductions(pool: &PgPool, coupon: i64) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM readme_deduction WHERE coupon_id = $1")
        .bind(coupon)
        .fetch_one(pool)
        .await
        .expect("count")
}

async fn text(pool: &PgPool, query: &'static str, id: i64) -> Option<String> {
    sqlx::query_scalar(query)
        .bind(id)
        .fetch_optional(pool)
        .await
        .expect("query")
}

async fn coupon_status(pool: &PgPool, coupon: i64) -> String {
    text(
        pool,
        "SELECT status FROM readme_coupon WHERE id = $1",
        coupon,
    )
    .await
    .expect("coupon exists")
}

async fn outbox_status(pool: &PgPool, topic: &str, msg_id: &str) -> Option<String> {
    sqlx::query_scalar("SELECT status FROM idem_outbox WHERE topic = $1 AND msg_id = $2")
        .bind(topic)
        .bind(msg_id)
        .fetch_optional(pool)
        .await
        .expect("outbox status")
}

async fn enqueue_one(pool: &PgPool, topic: &str, msg_id: &str, msg: &DeductCoupon) {
    let mut tx = pool.begin().await.expect("begin");
    enqueue(&mut tx, topic, msg_id, &serde_json::to_value(msg).unwrap())
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
}

/// Waits (at most 20 s) until the message is `success`.
async fn delivered(pool: PgPool, topic: &'static str, msg_id: String) {
    let start = Instant::now();
    while outbox_status(&pool, topic, &msg_id).await.as_deref() != Some("success") {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{topic} {msg_id} not delivered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ------------------------------------------------------------ the flows

#[tokio::test]
async fn migrate_creates_idems_tables() {
    let Some(pool) = pool().await else { return };
    // Twice: the second run changes nothing.
    using::create_idem_tables(pool.clone())
        .await
        .expect("migrate again");
    for table in idem_runtime::TABLES {
        let found: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
            .bind(table)
            .fetch_one(&pool)
            .await
            .expect("to_regclass");
        assert!(found.is_some(), "{table} missing");
    }
}

/// The README's main flow: the producer snippet enqueues in the order's
/// transaction, the relay snippet delivers to the `state_machine` handler
/// keyed by the delivery: one deduction per message, `success` rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_and_relay_deliver_each_message_to_the_state_machine_handler_once() {
    let Some(pool) = pool().await else { return };
    for _ in 0..3 {
        let c = coupon(&pool, "UNUSED").await;
        let order = ids(1);
        sqlx::query("INSERT INTO readme_orders (id, status) VALUES ($1, 'PLACED')")
            .bind(order)
            .execute(&pool)
            .await
            .expect("order");
        let stop = delivered(
            pool.clone(),
            "readme.coupon.deduct",
            format!("order-{order}"),
        );
        outbox::pay_and_relay(pool.clone(), order, c, stop)
            .await
            .expect("pay and relay");
        assert_eq!(deductions(&pool, c).await, 1, "coupon {c}");
        assert_eq!(coupon_status(&pool, c).await, "USED");
        let paid = text(
            &pool,
            "SELECT status FROM readme_orders WHERE id = $1",
            order,
        )
        .await;
        assert_eq!(paid.as_deref(), Some("PAID"));
        let status = outbox_status(&pool, "readme.coupon.deduct", &format!("order-{order}")).await;
        assert_eq!(status.as_deref(), Some("success"));
    }
}

/// The options snippet: the order's keyed messages ran in enqueue order
/// with their tenant header; the reminder waits, due in half an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordering_keys_delays_and_headers_run_as_shown() {
    let Some(pool) = pool().await else { return };
    let order = ids(1);
    let stop = delivered(pool.clone(), "readme.order.paid", format!("paid-{order}"));
    idem_examples::readme::options::order_life(pool.clone(), order, stop)
        .await
        .expect("order life");
    let steps: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT step, tenant FROM readme_order_log WHERE order_id = $1 ORDER BY id")
            .bind(order)
            .fetch_all(&pool)
            .await
            .expect("steps");
    let acme = Some("acme".to_owned());
    assert_eq!(
        steps,
        [
            ("readme.order.created".to_owned(), acme.clone()),
            ("readme.order.paid".to_owned(), acme)
        ]
    );
    let due_in: f64 = sqlx::query_scalar(
        "SELECT CAST(EXTRACT(EPOCH FROM next_attempt_at - now()) AS DOUBLE PRECISION) \
         FROM idem_outbox WHERE topic = 'readme.order.remind' AND msg_id = $1 AND status = 'pending'",
    )
    .bind(format!("remind-{order}"))
    .fetch_one(&pool)
    .await
    .expect("the reminder waits");
    assert!((1700.0..=1800.0).contains(&due_in), "due in {due_in} s");
}

/// The fan-out snippet: one message, two subscribers (the coupon's state
/// machine and a notice record), each effect once, the message `success`;
/// the same message enqueued again under another id acts on neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_runs_each_subscriber_once() {
    let Some(pool) = pool().await else { return };
    let c = coupon(&pool, "UNUSED").await;
    let order = ids(1);
    let payload = serde_json::json!({ "coupon_id": c, "order_id": order });
    let mut tx = pool.begin().await.expect("begin");
    idem_runtime::outbox::enqueue(
        &mut tx,
        "readme.order.paid",
        &format!("paid-{order}"),
        &payload,
    )
    .await
    .expect("enqueue");
    tx.commit().await.expect("commit");
    let stop = delivered(pool.clone(), "readme.order.paid", format!("paid-{order}"));
    idem_examples::readme::fanout::fan_out(pool.clone(), stop).await;
    assert_eq!(deductions(&pool, c).await, 1);
    assert_eq!(coupon_status(&pool, c).await, "USED");
    let notices: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM readme_notice WHERE user_id = $1 AND text = 'paid'",
    )
    .bind(order)
    .fetch_one(&pool)
    .await
    .expect("notices");
    assert_eq!(notices, 1);
}

/// The outcome `match`: executed and duplicate are done, an illegal state
/// is dead-lettered.
#[tokio::test]
async fn the_outcome_match_tells_done_from_dead_letter() {
    let Some(pool) = pool().await else { return };
    let topic = unique("readme.outcome");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let relay = Relay::new(pool.clone()).route(&topic, move |d, msg: DeductCoupon| {
        let s = s.clone();
        async move {
            let id = d.msg_id.clone();
            let v = using::verdict(d, msg).await;
            s.lock().unwrap().push((id, v));
            Ok::<_, Error>(Outcome::Executed(()))
        }
    });
    let (unused, expired) = (
        coupon(&pool, "UNUSED").await,
        coupon(&pool, "EXPIRED").await,
    );
    let messages = [("m-1", unused), ("m-2", unused), ("m-3", expired)];
    for (msg_id, c) in messages {
        enqueue_one(
            &pool,
            &topic,
            msg_id,
            &DeductCoupon {
                coupon_id: c,
                order_id: c + 1,
            },
        )
        .await;
        assert_eq!(relay.run_once().await.expect("relay"), 1);
    }
    use using::Verdict::{DeadLetter, Done};
    let expected = vec![
        ("m-1".into(), Done),
        ("m-2".into(), Done),
        ("m-3".into(), DeadLetter),
    ];
    assert_eq!(*seen.lock().unwrap(), expected);
    assert_eq!(
        (
            deductions(&pool, unused).await,
            deductions(&pool, expired).await
        ),
        (1, 0)
    );
    assert_eq!(coupon_status(&pool, expired).await, "EXPIRED");
    for msg_id in ["m-1", "m-2"] {
        assert_eq!(
            outbox_status(&pool, &topic, msg_id).await.as_deref(),
            Some("success")
        );
    }
}

/// The code written by hand behaves as the generated code: one deduction
/// per coupon, the message marked in the same transaction, a duplicate
/// answered without running the body.
#[tokio::test]
async fn the_hand_written_handler_acts_once() {
    let Some(pool) = pool().await else { return };
    let topic = unique("readme.by_hand");
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let o = outcomes.clone();
    let relay = Relay::new(pool.clone()).route(&topic, move |d, msg: DeductCoupon| {
        let o = o.clone();
        async move {
            let r = by_hand::deduct_coupon(d.pool(), &d, &msg).await;
            o.lock().unwrap().push(format!("{r:?}"));
            r
        }
    });
    let (unused, expired) = (
        coupon(&pool, "UNUSED").await,
        coupon(&pool, "EXPIRED").await,
    );
    for (msg_id, c) in [("h-1", unused), ("h-2", unused), ("h-3", expired)] {
        enqueue_one(
            &pool,
            &topic,
            msg_id,
            &DeductCoupon {
                coupon_id: c,
                order_id: c + 1,
            },
        )
        .await;
        assert_eq!(relay.run_once().await.expect("relay"), 1);
    }
    let outcomes = outcomes.lock().unwrap().clone();
    assert_eq!(outcomes[..2], ["Ok(Executed(()))", "Ok(Duplicate(None))"]);
    assert!(outcomes[2].starts_with("Err(IllegalState"), "{outcomes:?}");
    assert_eq!(
        (
            deductions(&pool, unused).await,
            deductions(&pool, expired).await
        ),
        (1, 0)
    );
    assert_eq!(coupon_status(&pool, unused).await, "USED");
    for msg_id in ["h-1", "h-2"] {
        assert_eq!(
            outbox_status(&pool, &topic, msg_id).await.as_deref(),
            Some("success")
        );
    }
    // Not retryable: dead-lettered at once.
    assert_eq!(
        outbox_status(&pool, &topic, "h-3").await.as_deref(),
        Some("failed")
    );
}

/// `key_column` and the caller's transaction: the order and the deduction
/// commit together; another order on the used coupon is an illegal state,
/// and its order row rolls back with it.
#[tokio::test]
async fn place_order_commits_the_order_and_the_deduction_together() {
    let Some(pool) = pool().await else { return };
    let c = coupon(&pool, "UNUSED").await;
    let first = DeductCoupon {
        coupon_id: c,
        order_id: ids(1),
    };
    let outcome = transaction::place_order(&pool, &first)
        .await
        .expect("place order");
    assert_eq!(outcome, Outcome::Executed(()));
    let order = text(
        &pool,
        "SELECT status FROM readme_orders WHERE id = $1",
        first.order_id,
    )
    .await;
    assert_eq!(order.as_deref(), Some("PLACED"));
    assert_eq!(
        (deductions(&pool, c).await, coupon_status(&pool, c).await),
        (1, "USED".into())
    );
    let used_by = text(&pool, "SELECT used_by FROM readme_coupon WHERE id = $1", c).await;
    assert_eq!(used_by, Some(format!("coupon-deduct:{}", first.order_id)));

    // The same order's deduction again, on its own: a duplicate.
    let again = deduct_coupon_for_order(&pool, &first).await.expect("again");
    assert_eq!(again, Outcome::Duplicate(None));

    // Another order reusing the coupon: refused, and its order row with it.
    let second = DeductCoupon {
        coupon_id: c,
        order_id: ids(1),
    };
    let err = transaction::place_order(&pool, &second)
        .await
        .expect_err("coupon already used");
    assert!(matches!(err, Error::IllegalState { .. }), "{err:?}");
    let order = text(
        &pool,
        "SELECT status FROM readme_orders WHERE id = $1",
        second.order_id,
    )
    .await;
    assert_eq!(order, None, "the caller's write rolled back with the call");
    assert_eq!(deductions(&pool, c).await, 1);
}

#[tokio::test]
async fn the_record_handler_stores_its_receipt_and_replays_it() {
    let Some(pool) = pool().await else { return };
    let user = ids(1);
    let msg = record::Notice {
        msg_id: unique("readme-n"),
        user_id: user,
        text: "shipped".into(),
    };
    let first = record::send_notice(&pool, &msg).await.expect("send");
    let Outcome::Executed(receipt) = first else {
        panic!("{first:?}")
    };
    let again = record::send_notice(&pool, &msg).await.expect("send again");
    assert_eq!(again, Outcome::Duplicate(Some(receipt.clone())));
    let other = record::Notice {
        text: "cancelled".into(),
        ..msg.clone()
    };
    let err = record::send_notice(&pool, &other)
        .await
        .expect_err("another payload");
    assert!(matches!(err, Error::KeyConflict { .. }), "{err:?}");

    let sent: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM readme_notice WHERE user_id = $1")
        .bind(user)
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(sent, 1);
    let (biz_no, result): (String, Option<String>) = sqlx::query_as(
        "SELECT biz_no, result FROM idem_record WHERE idempotency_key = $1 AND biz_type = 'notice'",
    )
    .bind(format!("notice:{}", msg.msg_id))
    .fetch_one(&pool)
    .await
    .expect("the record");
    assert_eq!(biz_no, user.to_string());
    let stored: record::Receipt = serde_json::from_str(&result.expect("result")).unwrap();
    assert_eq!(stored, receipt);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_routes_run_once_per_key_and_per_callback() {
    let Some(pool) = pool().await else { return };
    let secret = b"readme-secret";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = http::app(pool.clone(), secret);
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::builder().no_proxy().build().unwrap();

    // The same transfer twice under one key: one row, the answer replayed.
    let body = unique("readme-transfer");
    let (caller, key) = (unique("caller"), format!("\"{}\"", unique("k")));
    let mut answers = Vec::new();
    for _ in 0..2 {
        let r = client
            .post(format!("{base}/transfers"))
            .header("x-api-key", &caller)
            .header("idempotency-key", &key)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let replayed = r.headers().contains_key("idempotent-replayed");
        answers.push((r.status().as_u16(), replayed, r.text().await.unwrap()));
    }
    assert_eq!(answers[0], (201, false, "transfer accepted".into()));
    assert_eq!(answers[1], (201, true, "transfer accepted".into()));
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM readme_transfer WHERE body = $1")
        .bind(body.as_bytes())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    // Without a key: 400.
    let r = client
        .post(format!("{base}/transfers"))
        .header("x-api-key", &caller)
        .send()
        .await;
    assert_eq!(r.unwrap().status(), 400);

    // A signed callback pushed twice: one notice; forged: 401.
    let event = format!("evt_{}", ids(1));
    let cb = format!("{{\"event_id\":\"{event}\"}}");
    for (sig_secret, expected) in [(&secret[..], 200), (&b"guess"[..], 401), (&secret[..], 200)] {
        let signer = idem_runtime::http::CallbackVerifier::new(sig_secret.to_vec());
        let mut req = client
            .post(format!("{base}/callbacks/notice"))
            .body(cb.clone());
        for (name, value) in signer.signed_headers(cb.as_bytes()) {
            req = req.header(name, value);
        }
        assert_eq!(req.send().await.unwrap().status(), expected);
    }
    let notices: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM readme_notice WHERE text = $1")
        .bind(&cb)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(notices, 1);
}

/// The sign-up routes, by hand and behind the layer: twice under one key,
/// one notice, one record of it and one outbox row, the answer replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_signup_routes_run_their_notice_and_outbox_message_once() {
    let Some(pool) = pool().await else { return };
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    for app in [
        http::signups_by_hand(pool.clone()),
        http::signups_layered(pool.clone()),
    ] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let user = ids(1);
        let (caller, key) = (unique("caller"), format!("\"{}\"", unique("k")));
        let send = |body: String| {
            client
                .post(format!("{base}/signups"))
                .header("x-api-key", &caller)
                .header("idempotency-key", &key)
                .header("content-type", "application/json")
                .body(body)
                .send()
        };
        let mut answers = Vec::new();
        for _ in 0..2 {
            let r = send(format!("{{\"user_id\":{user}}}")).await.unwrap();
            let replayed = r.headers().contains_key("idempotent-replayed");
            answers.push((r.status().as_u16(), replayed, r.text().await.unwrap()));
        }
        assert_eq!(answers[0], (201, false, "signed up".into()));
        assert_eq!(answers[1], (201, true, "signed up".into()));
        let notices: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM readme_notice WHERE user_id = $1")
                .bind(user)
                .fetch_one(&pool)
                .await
                .unwrap();
        let records: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM idem_record WHERE biz_type = 'notice' AND idempotency_key = $1",
        )
        .bind(format!("notice:welcome-{user}"))
        .fetch_one(&pool)
        .await
        .unwrap();
        let messages: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM idem_outbox WHERE topic = 'readme.signups' AND msg_id = $1",
        )
        .bind(user.to_string())
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!((notices, records, messages), (1, 1, 1));
    }
}

#[tokio::test]
async fn the_unique_insert_handler_records_a_payment_once() {
    let Some(pool) = pool().await else { return };
    let serial = format!("PAY{}", ids(1));
    let cb = unique_insert::Callback {
        serial: serial.clone(),
        amount: 1999,
    };
    let first = unique_insert::record_payment(&pool, &cb)
        .await
        .expect("record");
    let again = unique_insert::record_payment(&pool, &cb)
        .await
        .expect("again");
    assert_eq!(
        (first, again),
        (Outcome::Executed(()), Outcome::Duplicate(None))
    );
    let forged = unique_insert::Callback {
        serial: "../../admin".into(),
        amount: 1,
    };
    let err = unique_insert::record_payment(&pool, &forged)
        .await
        .expect_err("forged");
    assert!(matches!(err, Error::InvalidKey { .. }), "{err:?}");
    let rows: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM readme_payment WHERE serial IN ($1, '../../admin')",
    )
    .bind(&serial)
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(rows, 1);
}

/// The cache snippet on the real Redis: the first call executes and
/// writes the marker after its commit; the next is answered by the marker.
#[tokio::test]
async fn the_cache_answers_the_duplicate() {
    if !idem_testkit::redis_up().await {
        return;
    }
    let Some(pool) = pool().await else { return };
    let c = coupon(&pool, "UNUSED").await;
    let msg = DeductCoupon {
        coupon_id: c,
        order_id: ids(1),
    };
    let (first, outcome) = cache::deduct_cached(pool.clone(), msg.clone())
        .await
        .expect("first");
    assert_eq!(outcome, Outcome::Executed(()));
    let marker = first.marker_key(
        "deduct_coupon_for_order",
        &format!("coupon-deduct:{}", msg.order_id),
    );
    assert!(
        idem_testkit::redis_get(&marker).await.is_some(),
        "no marker {marker}"
    );
    let (second, outcome) = cache::deduct_cached(pool.clone(), msg)
        .await
        .expect("second");
    assert_eq!(outcome, Outcome::Duplicate(None));
    let hits = second.stats().hits();
    assert_eq!(hits, 1, "answered by the cache");
    assert_eq!(
        (deductions(&pool, c).await, coupon_status(&pool, c).await),
        (1, "USED".into())
    );
}

/// The RabbitMQ snippet: the relay publishes the outbox message, the
/// consumer's handler deducts once; a second message for the same coupon
/// is a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rabbitmq_consumer_deducts_what_the_relay_published() {
    let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
    if let Err(e) = idem_runtime::amqp::connect(url).await {
        idem_testkit::unreachable(&format!("RabbitMQ at {url}"), e);
        return;
    }
    let Some(pool) = pool().await else { return };
    let c = coupon(&pool, "UNUSED").await;
    let msg = DeductCoupon {
        coupon_id: c,
        order_id: ids(1),
    };
    let ids = [unique("readme-mq"), unique("readme-mq")];
    for msg_id in &ids {
        enqueue_one(&pool, "readme.mq.deduct", msg_id, &msg).await;
    }
    let db = pool.clone();
    let until = async move {
        let start = Instant::now();
        loop {
            let mut done = deductions(&db, c).await == 1;
            for msg_id in &ids {
                done &= outbox_status(&db, "readme.mq.deduct", msg_id)
                    .await
                    .as_deref()
                    == Some("success");
            }
            if done {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "not consumed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Time for a second deduction, if there were one.
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    rabbitmq::consume_and_publish(pool.clone(), until)
        .await
        .expect("consume");
    assert_eq!(
        (deductions(&pool, c).await, coupon_status(&pool, c).await),
        (1, "USED".into())
    );
}

/// The NATS JetStream snippet: the relay publishes the outbox message to
/// the stream, the consumer's handler deducts once; a second message for
/// the same coupon is a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nats_consumer_deducts_what_the_relay_published() {
    let url = "nats://127.0.0.1:4222";
    if let Err(e) = idem_runtime::nats::connect(url).await {
        idem_testkit::unreachable(&format!("nats-server at {url}"), e);
        return;
    }
    let Some(pool) = pool().await else { return };
    let c = coupon(&pool, "UNUSED").await;
    let msg = DeductCoupon {
        coupon_id: c,
        order_id: ids(1),
    };
    let ids = [unique("readme-js"), unique("readme-js")];
    for msg_id in &ids {
        enqueue_one(&pool, "readme.js.deduct", msg_id, &msg).await;
    }
    let db = pool.clone();
    let until = async move {
        let start = Instant::now();
        loop {
            let mut done = deductions(&db, c).await == 1;
            for msg_id in &ids {
                done &= outbox_status(&db, "readme.js.deduct", msg_id)
                    .await
                    .as_deref()
                    == Some("success");
            }
            if done {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "not consumed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Time for a second deduction, if there were one.
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    nats::consume_and_publish(pool.clone(), until)
        .await
        .expect("consume");
    assert_eq!(
        (deductions(&pool, c).await, coupon_status(&pool, c).await),
        (1, "USED".into())
    );
}

/// The Kafka snippet on a broker of the test's own: the relay publishes
/// two outbox messages for one coupon (two ids: a second delivery of the
/// same deduction) to the topic, the consumer's handler deducts once and
/// answers the second `Duplicate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kafka_consumer_deducts_what_the_relay_published() {
    let Some(broker) = idem_testkit::cluster::kafka::KafkaBroker::start() else {
        return;
    };
    let Some(pool) = pool().await else { return };
    let c = coupon(&pool, "UNUSED").await;
    let msg = DeductCoupon {
        coupon_id: c,
        order_id: ids(1),
    };
    let ids = [unique("readme-kafka"), unique("readme-kafka")];
    for msg_id in &ids {
        enqueue_one(&pool, "readme.kafka.deduct", msg_id, &msg).await;
    }
    let db = pool.clone();
    let until = async move {
        let start = Instant::now();
        loop {
            let mut done = deductions(&db, c).await == 1;
            for msg_id in &ids {
                done &= outbox_status(&db, "readme.kafka.deduct", msg_id)
                    .await
                    .as_deref()
                    == Some("success");
            }
            if done {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "not consumed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Time for a second deduction, if there were one.
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    kafka::consume_and_publish(pool.clone(), &broker.bootstrap(), until)
        .await
        .expect("consume");
    assert_eq!(
        (deductions(&pool, c).await, coupon_status(&pool, c).await),
        (1, "USED".into())
    );
}

/// The Redis Streams snippet on the shared Redis: the relay writes two
/// outbox messages for one coupon (two ids: a second delivery of the same
/// deduction) to the stream, the consumer's handler deducts once and
/// answers the second `Duplicate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_streams_consumer_deducts_what_the_relay_published() {
    if !idem_testkit::redis_up().await {
        return;
    }
    let Some(pool) = pool().await else { return };
    let c = coupon(&pool, "UNUSED").await;
    let msg = DeductCoupon {
        coupon_id: c,
        order_id: ids(1),
    };
    let ids = [unique("readme-rs"), unique("readme-rs")];
    for msg_id in &ids {
        enqueue_one(&pool, "readme.rs.deduct", msg_id, &msg).await;
    }
    let db = pool.clone();
    let until = async move {
        let start = Instant::now();
        loop {
            let mut done = deductions(&db, c).await == 1;
            for msg_id in &ids {
                done &= outbox_status(&db, "readme.rs.deduct", msg_id)
                    .await
                    .as_deref()
                    == Some("success");
            }
            if done {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "not consumed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Time for a second deduction, if there were one.
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    redis_streams::consume_and_publish(pool.clone(), &idem_testkit::redis_url(), until)
        .await
        .expect("consume");
    assert_eq!(
        (deductions(&pool, c).await, coupon_status(&pool, c).await),
        (1, "USED".into())
    );
}

/// The RocketMQ snippet on a name server and broker of the test's own: the
/// relay publishes two outbox messages for one coupon (two ids: a second
/// delivery of the same deduction) to the topic, the consumer's handler
/// deducts once and answers the second `Duplicate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rocketmq_consumer_deducts_what_the_relay_published() {
    let Some(cluster) = idem_testkit::cluster::rocketmq::RocketMq::start() else {
        return;
    };
    let Some(pool) = pool().await else { return };
    let topic = unique("readme_rocketmq");
    cluster.create_topic(&topic, 2).await;
    let c = coupon(&pool, "UNUSED").await;
    let msg = DeductCoupon {
        coupon_id: c,
        order_id: ids(1),
    };
    let ids = [unique("readme-rocketmq"), unique("readme-rocketmq")];
    for msg_id in &ids {
        enqueue_one(&pool, "readme.rocketmq.deduct", msg_id, &msg).await;
    }
    let db = pool.clone();
    let until = async move {
        let start = Instant::now();
        loop {
            let mut done = deductions(&db, c).await == 1;
            for msg_id in &ids {
                done &= outbox_status(&db, "readme.rocketmq.deduct", msg_id)
                    .await
                    .as_deref()
                    == Some("success");
            }
            if done {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "not consumed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Time for a second deduction, if there were one.
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    rocketmq::consume_and_publish(pool.clone(), &cluster.namesrv_addr(), &topic, until)
        .await
        .expect("consume");
    assert_eq!(
        (deductions(&pool, c).await, coupon_status(&pool, c).await),
        (1, "USED".into())
    );
}

/// The archiver snippet moves an expired record to history, and
/// `find_record` still finds it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archiver_moves_expired_records_and_find_record_finds_them() {
    let Some(pool) = pool().await else { return };
    // The snippet's key: `notice:m-9`, a `notice` record past its expiry
    // and a live one of another business type.
    for stmt in [
        "DELETE FROM idem_record WHERE idempotency_key = 'notice:m-9'",
        "DELETE FROM idem_record_history WHERE idempotency_key = 'notice:m-9'",
        "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, create_time, expire_time) \
         VALUES ('notice:m-9', 'notice', '5', 'f', now() - interval '8 days', now() - interval '1 day')",
        "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, create_time, expire_time) \
         VALUES ('notice:m-9', 'readme_sms', '5', 'f', now(), now() + interval '7 days')",
    ] {
        sqlx::query(stmt).execute(&pool).await.expect(stmt);
    }
    let (archiver, all, one) = archive::archive_and_find(pool.clone())
        .await
        .expect("archive");
    let types: Vec<_> = all.iter().map(|r| r.biz_type.as_str()).collect();
    assert_eq!(types, ["notice", "readme_sms"]);
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].biz_type, "notice");

    let start = Instant::now();
    loop {
        let found = idem_runtime::archive::find_record(&pool, "notice:m-9", Some("notice"))
            .await
            .expect("find");
        if found.first().is_some_and(|r| r.archived) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "not archived: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let report = archiver.shutdown().await;
    assert!(report.records >= 1, "{report:?}");
    let online: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM idem_record WHERE idempotency_key = 'notice:m-9'")
            .fetch_one(&pool)
            .await
            .expect("count");
    assert_eq!(online, 1, "the live record stays");
}

/// A dead letter of `topic` failed with `error`: its id.
async fn dead_letter(pool: &PgPool, topic: &str, error: &str) -> i64 {
    sqlx::query(
        "INSERT INTO idem_outbox (topic, msg_id, payload, status, attempts, last_error) \
         VALUES ($1, 'm1', '{}', 'failed', 3, $2)",
    )
    .bind(topic)
    .bind(error)
    .execute(pool)
    .await
    .expect("a dead letter");
    sqlx::query_scalar("SELECT id FROM idem_outbox WHERE topic = $1")
        .bind(topic)
        .fetch_one(pool)
        .await
        .expect("its id")
}

/// Requeues dead letter `id` by POSTing to `url` with `token` as a bearer,
/// and checks in the database that it is pending again.
async fn requeue_by_bearer(pool: &PgPool, url: &str, token: &str, id: i64) {
    let done = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("id={id}&max_id={id}"))
        .send()
        .await
        .expect("POST");
    assert_eq!(done.status(), 200);
    let status: String = sqlx::query_scalar("SELECT status FROM idem_outbox WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("its status");
    assert_eq!(status, "pending");
}

/// The console of the README: served on its admin port, its overview
/// shows the outbox, /metrics carries the recorder's counters and the
/// database's gauges, and the token opens a requeue.
#[tokio::test]
async fn the_console_serves_the_outbox_and_its_metrics() {
    let Some(pool) = pool().await else { return };
    let topic = format!("readme.console.{}", ids(1));
    let id = dead_letter(&pool, &topic, "boom").await;
    let token = "readme-console-token-0123".to_string();
    let at = console::serve_console(pool.clone(), "127.0.0.1:0", token.clone())
        .await
        .expect("serve");
    metrics::counter!("idem_readme_console_probe_total").increment(1);
    let http = reqwest::Client::new();
    let page = http
        .get(format!("http://{at}/dead-letters?topic={topic}"))
        .send()
        .await
        .expect("GET");
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("boom"));
    let metrics = http
        .get(format!("http://{at}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(&format!("idem_outbox_failed{{topic=\"{topic}\"}} 1")),
        "{metrics}"
    );
    assert!(
        metrics.contains("idem_readme_console_probe_total 1"),
        "{metrics}"
    );
    requeue_by_bearer(&pool, &format!("http://{at}/requeue"), &token, id).await;
    sqlx::query("DELETE FROM idem_outbox WHERE topic = $1")
        .bind(&topic)
        .execute(&pool)
        .await
        .unwrap();
}

/// The console merged into an application under `/ops/idem`: the
/// application's route stays its own, the pages are under the prefix, and
/// a requeue through it changes the row.
#[tokio::test]
async fn the_console_mounted_in_an_application() {
    let Some(pool) = pool().await else { return };
    let topic = format!("readme.mounted.{}", ids(1));
    let id = dead_letter(&pool, &topic, "mounted boom").await;
    let token = "readme-mounted-token-0123".to_string();
    let app = console::app_with_console(pool.clone(), token.clone()).expect("the app");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let http = reqwest::Client::new();
    let get = |path: String| {
        let http = http.clone();
        async move {
            let r = http
                .get(format!("http://{at}{path}"))
                .send()
                .await
                .expect("GET");
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(get("/".into()).await, (200, "the application".to_string()));
    let (status, page) = get(format!("/ops/idem/dead-letters?topic={topic}")).await;
    assert_eq!(status, 200);
    assert!(page.contains("mounted boom"), "{page}");
    assert!(page.contains(r#"href="/ops/idem/records""#), "{page}");
    requeue_by_bearer(&pool, &format!("http://{at}/ops/idem/requeue"), &token, id).await;
    server.abort();
    sqlx::query("DELETE FROM idem_outbox WHERE topic = $1")
        .bind(&topic)
        .execute(&pool)
        .await
        .unwrap();
}

/// The retention check passes for 7-day records, and its comment shows
/// what a 1-hour ttl gets with the README's relay settings.
#[tokio::test]
async fn the_retention_check_and_its_message() {
    let Some(pool) = pool().await else { return };
    let relay = Relay::new(pool)
        .batch_size(64)
        .concurrency(16)
        .lease(Duration::from_secs(30))
        .max_attempts(10)
        .backoff(Duration::from_millis(200), Duration::from_secs(60));
    archive::check_retention(&relay).expect("7 days are enough");
    let hour = Duration::from_secs(3600);
    let err = RetentionPolicy::for_relay(&relay.settings(), hour, hour)
        .check()
        .expect_err("1 h is not");
    println!("{err}");
    assert!(matches!(err, Error::Config { .. }), "{err:?}");
    // The guide block's comment, quotes and comment markers removed.
    let (_, _, block) = shown_blocks()
        .into_iter()
        .find(|(_, _, b)| b.contains("RetentionPolicy::for_relay("))
        .expect("the retention block");
    let comment: Vec<&str> = block
        .lines()
        .filter_map(|l| l.strip_prefix("//"))
        .map(str::trim)
        .collect();
    let comment = comment.join(" ");
    let shown = &comment[comment.find('"').expect("quote") + 1..comment.rfind('"').expect("quote")];
    assert_eq!(err.to_string(), shown);
}

/// The shards flow on three PostgreSQL databases: each customer's account,
/// its message and the record of its delivery in the customer's database,
/// none in another; the points awarded once although produced twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shards_keep_each_record_beside_its_account() {
    let mut pools = Vec::new();
    for i in 0..3 {
        let Some(pool) = idem_testkit::postgres_database(&format!("readme_shard_{i}"), 4).await
        else {
            return;
        };
        pools.push(pool);
    }
    let shards = shards::open(pools).await.expect("open");
    let base = ids(8);
    let awards: Vec<shards::Award> = (0..4)
        .map(|n| shards::Award {
            order_id: base + n,
            customer: base + 4 + n,
            points: 10,
        })
        .collect();
    for a in &awards {
        // A retried producer: the second enqueue finds the first.
        shards::order_paid(&shards, a).await.expect("produce");
        shards::order_paid(&shards, a).await.expect("produce again");
    }
    let relays = shards::relays(&shards);
    for a in &awards {
        let home = shards.pool_for(&a.customer).expect("shard").clone();
        delivered(home, "readme.award", format!("order-{}", a.order_id)).await;
    }
    for relay in relays {
        relay.shutdown().await;
    }
    for a in &awards {
        let home = shards.shard_of(&a.customer).expect("shard");
        for (i, pool) in shards.pools().iter().enumerate() {
            let points: Option<i64> =
                sqlx::query_scalar("SELECT points FROM readme_account WHERE customer = $1")
                    .bind(a.customer)
                    .fetch_optional(pool)
                    .await
                    .expect("points");
            let records: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM idem_record WHERE biz_type = 'readme_award' AND idempotency_key = $1",
            )
            .bind(format!("readme-award:readme.award:order-{}", a.order_id))
            .fetch_one(pool)
            .await
            .expect("records");
            if i == home {
                assert_eq!((points, records), (Some(10), 1), "customer {}", a.customer);
            } else {
                assert_eq!(
                    (points, records),
                    (None, 0),
                    "customer {} in shard {i}",
                    a.customer
                );
            }
        }
    }
}

/// The RabbitMQ fan-out snippet: one published message, two subscribers
/// of one queue, each acting once; the outbox message `success`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fanned_out_rabbitmq_consumer_runs_each_subscriber_once() {
    let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
    if let Err(e) = idem_runtime::amqp::connect(url).await {
        idem_testkit::unreachable(&format!("RabbitMQ at {url}"), e);
        return;
    }
    let Some(pool) = pool().await else { return };
    let c = coupon(&pool, "UNUSED").await;
    let msg = DeductCoupon {
        coupon_id: c,
        order_id: ids(1),
    };
    let msg_id = unique("readme-mq-fan");
    enqueue_one(&pool, "readme.mq.paid", &msg_id, &msg).await;
    let notices = |pool: PgPool, user: i64| async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM readme_notice WHERE user_id = $1 AND text = 'mq-paid'",
        )
        .bind(user)
        .fetch_one(&pool)
        .await
        .expect("notices")
    };
    let (db, order) = (pool.clone(), msg.order_id);
    let until = async move {
        let start = Instant::now();
        while deductions(&db, c).await < 1 || notices(db.clone(), order).await < 1 {
            assert!(start.elapsed() < Duration::from_secs(20), "not consumed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Time for a second effect, if there were one.
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    rabbitmq::consume_fanned_out(pool.clone(), until)
        .await
        .expect("consume");
    assert_eq!(
        (
            deductions(&pool, c).await,
            notices(pool.clone(), msg.order_id).await
        ),
        (1, 1)
    );
    assert_eq!(
        outbox_status(&pool, "readme.mq.paid", &msg_id)
            .await
            .as_deref(),
        Some("success")
    );
}

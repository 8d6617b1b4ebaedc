//! # Third-party payment callbacks, retried by the platform
//!
//! *Async Idempotency in Practice* (02.3, 05.2): a payment platform pushes
//! its callback again after any non-200 answer or time-out, whether or not
//! the merchant already booked the payment. The merchant keys the callback
//! by the platform's payment serial (validated: format, and the HMAC
//! signature over the timestamp and body, both checked by the runtime's
//! `idem_runtime::http` pieces)
//! and verifies the order's state in the same transaction.
//!
//! This example starts the merchant's service ([`idem_examples::payments`])
//! on `127.0.0.1` (`--port`, default 0: an ephemeral port, printed), places
//! `--orders` orders (default 100) and lets a simulated platform deliver
//! each order's success callback, with everything that makes platforms
//! repeat themselves:
//!
//! - **concurrent pushes**: each callback is pushed `--duplicates` times
//!   (default 3) at once, the way a platform's parallel retry workers
//!   overlap (`--workers`, default 32, deliveries in flight in all);
//! - **a lossy network**: a fault layer in front of the service lets the
//!   handler commit and then loses its answer (`--lose-rate`, default 0.1:
//!   held back past the platform's time-out) or replaces it with a 503
//!   (`--unavailable-rate`, default 0.1). The platform retries both;
//! - **hostile or broken callbacks**: a forged signature, malformed serials
//!   (`../../x`, 300 digits), the same serial with another amount, and a
//!   second serial for an order already paid. The platform retries those
//!   too (its policy: any non-200), and never gets a 200.
//!
//! It then prints the answers by status code and counts in the database:
//! orders paid, ledger rows, double payments (orders with more than one
//! payment, or a payment under a serial other than the order's), and the
//! idempotency records. It exits non-zero on any double payment, any order
//! left unpaid, or any hostile callback that got through.
//!
//! ```text
//! cargo run -p idem-examples --bin payment_callbacks
//! cargo run -p idem-examples --bin payment_callbacks -- --orders 500 --lose-rate 0.3
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p idem-examples --bin payment_callbacks
//! ```

use clap::Parser;
use idem_examples::payments::{self, Attempt, Callback, Faults, Platform};
use sqlx::postgres::PgPoolOptions;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SECRET: &[u8] = b"merchant-and-platform-shared-secret";

/// Third-party payment callbacks, retried by the platform, against the
/// merchant's idempotent endpoint.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "payment_callbacks",
    args_override_self = true,
    after_help = "DATABASE_URL selects the PostgreSQL database (default\n\
                  postgres://postgres@127.0.0.1:5432/test)."
)]
struct Options {
    /// The service's port on 127.0.0.1 (0: ephemeral).
    #[arg(long, value_name = "P", default_value_t = 0)]
    port: u16,
    /// Orders to pay.
    #[arg(long, value_name = "N", default_value_t = 100)]
    orders: usize,
    /// Concurrent pushes of each callback.
    #[arg(long, value_name = "D", default_value_t = 3)]
    duplicates: usize,
    /// Deliveries in flight at once.
    #[arg(long, value_name = "W", default_value_t = 32)]
    workers: usize,
    /// Fraction of answers lost after the commit.
    #[arg(long, value_name = "F", default_value_t = 0.1)]
    lose_rate: f64,
    /// Fraction of answers replaced by 503 after the commit.
    #[arg(long, value_name = "F", default_value_t = 0.1)]
    unavailable_rate: f64,
}

impl Options {
    fn check(self) -> Result<Self, BoxError> {
        if self.orders < 1 || self.duplicates < 1 || self.workers < 1 {
            return Err("--orders, --duplicates and --workers must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.lose_rate)
            || !(0.0..=1.0).contains(&self.unavailable_rate)
            || self.lose_rate + self.unavailable_rate > 0.9
        {
            return Err("the rates must be between 0 and 1, and add up to at most 0.9".into());
        }
        Ok(self)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// A hostile or broken callback, and the status it must be refused with.
struct Hostile {
    what: String,
    platform: Platform,
    callback: Callback,
    expected: u16,
}

async fn run() -> Result<bool, BoxError> {
    let opts = Options::parse().check()?;
    // `DATABASE_URL=` (set but empty) means unset.
    let url = idem_testkit::env_setting("DATABASE_URL")
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = PgPoolOptions::new()
        .max_connections(24)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&url)
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
    payments::migrate(&pool).await?;

    // The platform's patience, and the network between it and the merchant.
    let timeout = Duration::from_millis(1000);
    let faults = Faults::random(
        opts.lose_rate,
        opts.unavailable_rate,
        timeout + Duration::from_millis(500),
        0x5EED,
    );
    let app = faults.wrap(payments::app(pool.clone(), SECRET));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", opts.port)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("server stopped: {e}");
        }
    });
    let base = format!("http://{addr}");
    println!(
        "merchant service listening on {base}{}",
        payments::CALLBACK_PATH
    );
    println!("database: {url}");

    // Orders: ids unique across runs on a shared server. One extra order
    // stays unpaid: the hostile callbacks aim at it.
    let first = idem_testkit::ids(opts.orders as i64 + 1);
    let orders: Vec<(i64, i64)> = (0..opts.orders as i64)
        .map(|i| (first + i, 1_000 + (i * 37) % 9_000))
        .collect();
    let untouched = first + opts.orders as i64;
    for &(id, amount) in orders.iter().chain([&(untouched, 500)]) {
        payments::create_order(&pool, id, amount).await?;
    }
    let platform = Platform {
        max_retries: 10,
        timeout,
        backoff: Duration::from_millis(50),
        ..Platform::new(&base, SECRET)
    };
    println!(
        "platform: {} orders, each callback pushed {} times at once, {} deliveries in flight; \
         time-out {} ms, up to {} retries\nnetwork: {:.0}% of answers lost after the commit, \
         {:.0}% replaced by 503",
        opts.orders,
        opts.duplicates,
        opts.workers,
        timeout.as_millis(),
        platform.max_retries,
        opts.lose_rate * 100.0,
        opts.unavailable_rate * 100.0
    );

    // The genuine callbacks: every push of every order, `--workers` of
    // them in flight at a time (the platform's delivery workers); the
    // pushes of one order side by side.
    let started = Instant::now();
    let workers = std::sync::Arc::new(tokio::sync::Semaphore::new(opts.workers));
    let mut tasks = Vec::new();
    for &(id, amount) in &orders {
        let cb = Callback::success(payments::serial(id as u64), id, amount);
        for _ in 0..opts.duplicates {
            let (p, cb, workers) = (platform.clone(), cb.clone(), workers.clone());
            tasks.push(tokio::spawn(async move {
                let _worker = workers.acquire_owned().await.expect("never closed");
                (cb.order_id, p.deliver(&cb).await)
            }));
        }
    }
    let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
    let mut tally = |history: &[Attempt]| {
        for a in history {
            let k = match a {
                Attempt::Status(s) => s.to_string(),
                Attempt::TimedOut => "timed out".into(),
                Attempt::Failed(_) => "connection failed".into(),
            };
            *by_status.entry(k).or_default() += 1;
        }
    };
    let (mut acknowledged, mut given_up, mut replayed, mut retried) = (0, 0, 0, 0);
    let mut bodies: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for t in tasks {
        let (order, result) = t.await?;
        match result {
            Ok(d) => {
                tally(&d.history);
                acknowledged += 1;
                replayed += u64::from(d.replayed);
                retried += u64::from(d.attempts > 1);
                bodies.entry(order).or_default().push(d.body);
            }
            Err(g) => {
                tally(&g.history);
                given_up += 1;
                eprintln!("order {order}: the platform gave up: {g}");
            }
        }
    }
    let genuine_secs = started.elapsed().as_secs_f64();
    let same_bodies = bodies.values().all(|b| b.iter().all(|x| *x == b[0]));

    // The hostile and broken callbacks.
    let hostile_platform = Platform {
        max_retries: 2,
        ..platform.clone()
    };
    let (o1, a1) = orders[0];
    let (o2, a2) = orders[orders.len().min(2) - 1];
    let hostile = vec![
        Hostile {
            what: "forged signature".into(),
            platform: Platform {
                secret: b"guessed-secret".to_vec(),
                ..hostile_platform.clone()
            },
            callback: Callback::success(payments::serial(untouched as u64), untouched, 500),
            expected: 401,
        },
        Hostile {
            what: "serial \"../../x\"".into(),
            platform: hostile_platform.clone(),
            callback: Callback::success("../../x", untouched, 500),
            expected: 400,
        },
        Hostile {
            what: "serial of 300 digits".into(),
            platform: hostile_platform.clone(),
            callback: Callback::success(format!("PAY{}", "9".repeat(300)), untouched, 500),
            expected: 400,
        },
        Hostile {
            what: "same serial, other amount".into(),
            platform: hostile_platform.clone(),
            callback: Callback::success(payments::serial(o1 as u64), o1, a1 + 1),
            expected: 409,
        },
        Hostile {
            what: "second serial, paid order".into(),
            platform: hostile_platform.clone(),
            callback: Callback::success(payments::serial(untouched as u64), o2, a2),
            expected: 409,
        },
    ];
    let mut hostile_ok = true;
    let mut hostile_lines = Vec::new();
    for h in &hostile {
        let (history, through) = match h.platform.deliver(&h.callback).await {
            Ok(d) => (d.history, true),
            Err(g) => (g.history, false),
        };
        tally(&history);
        let seen = history
            .iter()
            .map(|a| match a {
                Attempt::Status(s) => s.to_string(),
                Attempt::TimedOut => "timeout".into(),
                Attempt::Failed(_) => "failed".into(),
            })
            .collect::<Vec<_>>()
            .join(" ");
        let ok = !through && history.contains(&Attempt::Status(h.expected));
        hostile_ok &= ok;
        hostile_lines.push(format!(
            "  {:<28} answers: {:<20} expected {}  {}",
            h.what,
            seen,
            h.expected,
            if ok { "ok" } else { "FAILED" }
        ));
    }

    // The database's word.
    let last = first + opts.orders as i64 - 1;
    let paid: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pay_orders WHERE id BETWEEN $1 AND $2 AND status = 'PAID'",
    )
    .bind(first)
    .bind(last)
    .fetch_one(&pool)
    .await?;
    let ledger: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM pay_payments WHERE order_id BETWEEN $1 AND $2")
            .bind(first)
            .bind(untouched)
            .fetch_one(&pool)
            .await?;
    // An order with more than one payment, or a payment whose serial or
    // amount is not the order's.
    let double: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pay_orders o WHERE o.id BETWEEN $1 AND $2 AND (
            (SELECT COUNT(*) FROM pay_payments p WHERE p.order_id = o.id) > 1
            OR EXISTS (SELECT 1 FROM pay_payments p WHERE p.order_id = o.id
                       AND (p.serial IS DISTINCT FROM o.paid_serial OR p.amount_cents <> o.amount_cents)))",
    )
    .bind(first)
    .bind(untouched)
    .fetch_one(&pool)
    .await?;
    let records: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM idem_record WHERE biz_type = 'payment_callback' \
         AND biz_no IN (SELECT id::text FROM pay_orders WHERE id BETWEEN $1 AND $2)",
    )
    .bind(first)
    .bind(untouched)
    .fetch_one(&pool)
    .await?;
    let (untouched_status, untouched_records, untouched_ledger): (String, i64, i64) =
        sqlx::query_as(
            "SELECT status,
                    (SELECT COUNT(*) FROM idem_record WHERE biz_type = 'payment_callback' AND biz_no = $2),
                    (SELECT COUNT(*) FROM pay_payments WHERE order_id = $1)
               FROM pay_orders WHERE id = $1",
        )
        .bind(untouched)
        .bind(untouched.to_string())
        .fetch_one(&pool)
        .await?;
    let [passed, lost, unavailable, _] = faults.counts();

    let total = opts.orders * opts.duplicates;
    println!();
    println!(
        "genuine callbacks      {total} deliveries in {genuine_secs:.1} s: {acknowledged} acknowledged \
         with 200, {given_up} given up"
    );
    println!(
        "                       {retried} needed retries; {replayed} answered with the stored \
         receipt; identical bodies per order: {}",
        if same_bodies { "yes" } else { "NO" }
    );
    println!(
        "network faults         {lost} answers lost after the commit, {unavailable} replaced by 503, \
         {passed} passed"
    );
    println!(
        "hostile callbacks      (each pushed up to {} times)",
        1 + hostile_platform.max_retries
    );
    for l in &hostile_lines {
        println!("{l}");
    }
    let answers = by_status
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect::<Vec<_>>()
        .join(", ");
    println!("attempts by answer     {answers}");
    println!();
    println!("orders PAID            {paid} / {}", opts.orders);
    println!("payment ledger rows    {ledger}");
    println!("double payments        {double}");
    println!("idempotency records    {records}");
    println!(
        "hostile target order   {untouched_status}, {untouched_records} records, \
         {untouched_ledger} ledger rows"
    );

    let ok = double == 0
        && paid == opts.orders as i64
        && ledger == opts.orders as i64
        && given_up == 0
        && same_bodies
        && hostile_ok
        && untouched_status == payments::PENDING_PAYMENT
        && untouched_records == 0
        && untouched_ledger == 0;
    println!();
    if ok {
        println!("OK: every order paid exactly once; every hostile callback refused");
    } else if double > 0 {
        println!("FAILED: {double} double payments");
    } else {
        println!("FAILED: see above");
    }
    Ok(ok)
}

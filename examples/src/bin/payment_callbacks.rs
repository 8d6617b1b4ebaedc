//! # Third-party payment callbacks, retried by the platform
//!
//! *Async Idempotency in Practice* (02.3, 05.2): a payment platform pushes
//! its callback again after any answer but its success answer, or a
//! time-out, whether or not the merchant already booked the payment. The
//! merchant keys the callback by the platform's payment serial (validated:
//! its format, and the platform's own signature, both checked by idem's
//! preset for that platform) and verifies the order's state in the same
//! transaction.
//!
//! This example starts the merchant's service ([`idem_examples::payments`])
//! on `127.0.0.1` (`--port`, default 0: an ephemeral port, printed), with
//! one route per platform: Stripe, Alipay and WeChat Pay v3. It places
//! `--orders` orders (default 99) and lets the simulated platforms deliver
//! each order's success notification, the orders taking turns on the three
//! platforms, each notification signed as its platform signs it (Stripe's
//! `t=…,v1=…` HMAC with two active secrets, as during a secret roll;
//! Alipay's RSA2 over the sorted form; WeChat Pay's SHA256withRSA under one
//! of two platform keys, a rotation, and its resource encrypted with
//! AES-256-GCM), with everything that makes platforms repeat themselves:
//!
//! - **concurrent pushes**: each notification is pushed `--duplicates`
//!   times (default 3) at once, the way a platform's parallel retry workers
//!   overlap (`--workers`, default 32, deliveries in flight in all);
//! - **a lossy network**: a fault layer in front of the service lets the
//!   handler commit and then loses its answer (`--lose-rate`, default 0.1:
//!   held back past the platform's time-out) or replaces it with a 503
//!   (`--unavailable-rate`, default 0.1). The platform retries both;
//! - **hostile or broken callbacks**, on each platform: a forged signature,
//!   malformed serials (`../../x`, 300 digits), an amount that is not the
//!   order's, the same serial with another amount, and a second serial for
//!   an order already paid. The platform retries those too (its policy),
//!   and never gets its success answer.
//!
//! It then prints the answers by status code and counts in the database:
//! orders paid (by platform), ledger rows, double payments (orders with
//! more than one payment, or a payment that is not the order's), and the
//! idempotency records. It exits non-zero on any double payment, any order
//! left unpaid, or any hostile callback that got through.
//!
//! ```text
//! cargo run -p idem-examples --bin payment_callbacks
//! cargo run -p idem-examples --bin payment_callbacks -- --orders 300 --lose-rate 0.3
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p idem-examples --bin payment_callbacks
//! ```

use clap::Parser;
use idem_examples::payments::{
    self, Attempt, Charge, Faults, GaveUp, Merchant, Notification, PLATFORMS, Platform,
};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
    #[arg(long, value_name = "N", default_value_t = 99)]
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
        if self.orders < 3 || self.duplicates < 1 || self.workers < 1 {
            return Err(
                "--orders must be at least 3, --duplicates and --workers at least 1".into(),
            );
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

/// The orders: `(id, amount)` of each order to pay, and one more order that
/// stays unpaid, the hostile callbacks' target.
struct Orders {
    paid: Vec<(i64, i64)>,
    untouched: i64,
}

impl Orders {
    /// The platform order `i` is paid on: they take turns.
    fn platform(i: usize) -> &'static str {
        PLATFORMS[i % PLATFORMS.len()]
    }

    /// The charge of order `i`, under its serial numbered by the order's id.
    fn charge(&self, i: usize) -> Charge {
        let (order_id, amount_cents) = self.paid[i];
        let platform = Self::platform(i);
        Charge {
            platform,
            serial: payments::serial(platform, order_id as u64),
            order_id,
            amount_cents,
        }
    }

    /// The first order paid on `platform`.
    fn first_on(&self, platform: &str) -> Charge {
        let i = (0..self.paid.len())
            .find(|&i| Self::platform(i) == platform)
            .expect("--orders is at least 3");
        self.charge(i)
    }
}

/// Every attempt's answer, by status (or time-out, or failed connection).
#[derive(Default)]
struct Tally(BTreeMap<String, u64>);

impl Tally {
    fn add(&mut self, history: &[Attempt]) {
        for a in history {
            *self.0.entry(answer_name(a)).or_default() += 1;
        }
    }
}

fn answer_name(a: &Attempt) -> String {
    match a {
        Attempt::Status(s) => s.to_string(),
        Attempt::TimedOut => "timed out".into(),
        Attempt::Failed(_) => "connection failed".into(),
    }
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
    let (base, faults) = serve(&opts, &pool, timeout).await?;
    println!("database: {url}");

    let orders = place_orders(&pool, opts.orders).await?;
    let platform = Platform {
        max_retries: 10,
        timeout,
        backoff: Duration::from_millis(50),
        ..Platform::new(&base)
    };
    println!(
        "platforms: {} orders taking turns on Stripe, Alipay and WeChat Pay, each notification \
         pushed {} times at once, {} deliveries in flight; time-out {} ms, up to {} retries\n\
         network: {:.0}% of answers lost after the commit, {:.0}% replaced by 503",
        opts.orders,
        opts.duplicates,
        opts.workers,
        timeout.as_millis(),
        platform.max_retries,
        opts.lose_rate * 100.0,
        opts.unavailable_rate * 100.0
    );

    let mut tally = Tally::default();
    let genuine = genuine(&opts, &orders, &platform, &mut tally).await?;
    let hostile_platform = Platform {
        max_retries: 2,
        ..platform.clone()
    };
    let (hostile_ok, hostile_lines) = hostile(&orders, &hostile_platform, &mut tally).await;
    let db = Database::read(&pool, &orders).await?;
    let [passed, lost, unavailable, _] = faults.counts();

    println!();
    genuine.print(opts.orders * opts.duplicates);
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
    let answers: Vec<String> = tally.0.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    println!("attempts by answer     {}", answers.join(", "));
    println!();
    db.print(opts.orders);

    let ok = db.holds(opts.orders) && genuine.given_up == 0 && genuine.same_bodies && hostile_ok;
    println!();
    if ok {
        println!("OK: every order paid exactly once; every hostile callback refused");
    } else if db.double > 0 {
        println!("FAILED: {} double payments", db.double);
    } else {
        println!("FAILED: see above");
    }
    Ok(ok)
}

/// The merchant's service on 127.0.0.1 behind the lossy network: its base
/// URL, and the network's fault counts.
async fn serve(
    opts: &Options,
    pool: &PgPool,
    timeout: Duration,
) -> Result<(String, Faults), BoxError> {
    let faults = Faults::random(
        opts.lose_rate,
        opts.unavailable_rate,
        timeout + Duration::from_millis(500),
        0x5EED,
    );
    let app = faults.wrap(payments::app(pool.clone(), Merchant::demo()));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", opts.port)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("server stopped: {e}");
        }
    });
    let base = format!("http://{addr}");
    println!(
        "merchant service listening on {base}: {}, {}, {}",
        payments::STRIPE_PATH,
        payments::ALIPAY_PATH,
        payments::WECHATPAY_PATH
    );
    Ok((base, faults))
}

/// Places the orders: ids unique across runs on a shared server.
async fn place_orders(pool: &PgPool, n: usize) -> Result<Orders, BoxError> {
    let first = idem_testkit::ids(n as i64 + 1);
    let paid: Vec<(i64, i64)> = (0..n as i64)
        .map(|i| (first + i, 1_000 + (i * 37) % 9_000))
        .collect();
    let untouched = first + n as i64;
    for &(id, amount) in paid.iter().chain([&(untouched, 500)]) {
        payments::create_order(pool, id, amount).await?;
    }
    Ok(Orders { paid, untouched })
}

/// What the genuine deliveries got.
struct Genuine {
    acknowledged: u64,
    given_up: u64,
    replayed: u64,
    retried: u64,
    same_bodies: bool,
    secs: f64,
}

impl Genuine {
    fn print(&self, total: usize) {
        println!(
            "genuine callbacks      {total} deliveries in {:.1} s: {} acknowledged, {} given up",
            self.secs, self.acknowledged, self.given_up
        );
        println!(
            "                       {} needed retries; {} answered with the stored receipt; \
             identical answers per order: {}",
            self.retried,
            self.replayed,
            if self.same_bodies { "yes" } else { "NO" }
        );
    }
}

/// The genuine notifications: every push of every order, `--workers` of
/// them in flight at a time (the platforms' delivery workers); the pushes
/// of one notification side by side. WeChat Pay signs half of its
/// notifications under its second platform key (a rotation).
async fn genuine(
    opts: &Options,
    orders: &Orders,
    platform: &Platform,
    tally: &mut Tally,
) -> Result<Genuine, BoxError> {
    let started = Instant::now();
    let rotated = Platform {
        keys: platform.keys.clone().wechatpay_key(1),
        ..platform.clone()
    };
    let workers = std::sync::Arc::new(tokio::sync::Semaphore::new(opts.workers));
    let mut tasks = Vec::new();
    for i in 0..orders.paid.len() {
        let charge = orders.charge(i);
        let signer = if (i / PLATFORMS.len()).is_multiple_of(2) {
            platform
        } else {
            &rotated
        };
        // One notification, pushed `--duplicates` times: the same body.
        let notification = signer.notification(&charge);
        for _ in 0..opts.duplicates {
            let (p, n, workers) = (signer.clone(), notification.clone(), workers.clone());
            tasks.push(tokio::spawn(async move {
                let _worker = workers.acquire_owned().await.expect("never closed");
                (charge.order_id, p.deliver_notification(&n).await)
            }));
        }
    }
    let mut g = Genuine {
        acknowledged: 0,
        given_up: 0,
        replayed: 0,
        retried: 0,
        same_bodies: true,
        secs: 0.0,
    };
    let mut bodies: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for t in tasks {
        let (order, result) = t.await?;
        match result {
            Ok(d) => {
                tally.add(&d.history);
                g.acknowledged += 1;
                g.replayed += u64::from(d.replayed);
                g.retried += u64::from(d.attempts > 1);
                bodies.entry(order).or_default().push(d.body);
            }
            Err(gave_up) => {
                tally.add(&gave_up.history);
                g.given_up += 1;
                eprintln!("order {order}: the platform gave up: {gave_up}");
            }
        }
    }
    g.secs = started.elapsed().as_secs_f64();
    g.same_bodies = bodies.values().all(|b| b.iter().all(|x| *x == b[0]));
    Ok(g)
}

/// A hostile or broken callback, and the status it must be refused with.
struct Hostile {
    what: String,
    platform: Platform,
    notification: Notification,
    expected: u16,
}

/// The hostile and broken callbacks of one platform.
fn hostile_of(orders: &Orders, p: &'static str, platform: &Platform) -> Vec<Hostile> {
    let fresh = || payments::serial(p, idem_testkit::ids(1) as u64);
    let on_untouched = |serial: String, amount_cents| Charge {
        platform: p,
        serial,
        order_id: orders.untouched,
        amount_cents,
    };
    let paid = orders.first_on(p);
    let long = match p {
        payments::STRIPE => format!("evt_{}", "9".repeat(300)),
        _ => "9".repeat(300),
    };
    let forger = Platform {
        keys: platform.keys.forged(),
        ..platform.clone()
    };
    let cases = [
        ("forged signature", &forger, on_untouched(fresh(), 500), 401),
        (
            "serial \"../../x\"",
            platform,
            on_untouched("../../x".into(), 500),
            400,
        ),
        (
            "serial of 300 digits",
            platform,
            on_untouched(long, 500),
            400,
        ),
        (
            "amount not the order's",
            platform,
            on_untouched(fresh(), 499),
            422,
        ),
        (
            "same serial, other amount",
            platform,
            Charge {
                amount_cents: paid.amount_cents + 1,
                ..paid.clone()
            },
            409,
        ),
        (
            "second serial, paid order",
            platform,
            Charge {
                serial: fresh(),
                ..paid
            },
            409,
        ),
    ];
    cases
        .into_iter()
        .map(|(what, platform, charge, expected)| Hostile {
            what: format!("{p} {what}"),
            notification: platform.notification(&charge),
            platform: platform.clone(),
            expected,
        })
        .collect()
}

/// Pushes every hostile callback: whether each was refused as expected, and
/// a line per callback.
async fn hostile(orders: &Orders, platform: &Platform, tally: &mut Tally) -> (bool, Vec<String>) {
    let mut all_ok = true;
    let mut lines = Vec::new();
    for p in PLATFORMS {
        for h in hostile_of(orders, p, platform) {
            let (history, through) = match h.platform.deliver_notification(&h.notification).await {
                Ok(d) => (d.history, true),
                Err(GaveUp { history, .. }) => (history, false),
            };
            tally.add(&history);
            let seen: Vec<String> = history.iter().map(answer_name).collect();
            let ok = !through && history.contains(&Attempt::Status(h.expected));
            all_ok &= ok;
            lines.push(format!(
                "  {:<38} answers: {:<24} expected {}  {}",
                h.what,
                seen.join(" "),
                h.expected,
                if ok { "ok" } else { "FAILED" }
            ));
        }
    }
    (all_ok, lines)
}

/// The database's word.
struct Database {
    paid: i64,
    by_platform: Vec<(String, i64)>,
    ledger: i64,
    double: i64,
    records: i64,
    untouched_status: String,
    untouched_records: i64,
    untouched_ledger: i64,
}

impl Database {
    async fn read(pool: &PgPool, orders: &Orders) -> Result<Self, sqlx::Error> {
        let (first, untouched) = (orders.paid[0].0, orders.untouched);
        let paid: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM merchant_orders WHERE id BETWEEN $1 AND $2 AND status = 'PAID'",
        )
        .bind(first)
        .bind(untouched - 1)
        .fetch_one(pool)
        .await?;
        let by_platform: Vec<(String, i64)> = sqlx::query_as(
            "SELECT platform, COUNT(*) FROM merchant_payments WHERE order_id BETWEEN $1 AND $2 \
             GROUP BY platform ORDER BY platform",
        )
        .bind(first)
        .bind(untouched)
        .fetch_all(pool)
        .await?;
        let ledger = by_platform.iter().map(|(_, n)| n).sum();
        // An order with more than one payment, or a payment whose platform,
        // serial or amount is not the order's.
        let double: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM merchant_orders o WHERE o.id BETWEEN $1 AND $2 AND (
                (SELECT COUNT(*) FROM merchant_payments p WHERE p.order_id = o.id) > 1
                OR EXISTS (SELECT 1 FROM merchant_payments p WHERE p.order_id = o.id
                           AND (p.platform || ':' || p.serial IS DISTINCT FROM o.paid_by
                                OR p.amount_cents <> o.amount_cents)))",
        )
        .bind(first)
        .bind(untouched)
        .fetch_one(pool)
        .await?;
        let records: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM idem_record WHERE biz_type = 'payment_callback' \
             AND biz_no IN (SELECT id::text FROM merchant_orders WHERE id BETWEEN $1 AND $2)",
        )
        .bind(first)
        .bind(untouched)
        .fetch_one(pool)
        .await?;
        let (untouched_status, untouched_records, untouched_ledger) = sqlx::query_as(
            "SELECT status,
                    (SELECT COUNT(*) FROM idem_record
                      WHERE biz_type = 'payment_callback' AND biz_no = $2),
                    (SELECT COUNT(*) FROM merchant_payments WHERE order_id = $1)
               FROM merchant_orders WHERE id = $1",
        )
        .bind(untouched)
        .bind(untouched.to_string())
        .fetch_one(pool)
        .await?;
        Ok(Database {
            paid,
            by_platform,
            ledger,
            double,
            records,
            untouched_status,
            untouched_records,
            untouched_ledger,
        })
    }

    fn print(&self, orders: usize) {
        let by: Vec<String> = self
            .by_platform
            .iter()
            .map(|(p, n)| format!("{p} {n}"))
            .collect();
        println!(
            "orders PAID            {} / {orders} ({})",
            self.paid,
            by.join(", ")
        );
        println!("payment ledger rows    {}", self.ledger);
        println!("double payments        {}", self.double);
        println!("idempotency records    {}", self.records);
        println!(
            "hostile target order   {}, {} records, {} ledger rows",
            self.untouched_status, self.untouched_records, self.untouched_ledger
        );
    }

    /// Every order paid once, nothing else booked.
    fn holds(&self, orders: usize) -> bool {
        self.double == 0
            && self.paid == orders as i64
            && self.ledger == orders as i64
            && self.untouched_status == payments::PENDING_PAYMENT
            && self.untouched_records == 0
            && self.untouched_ledger == 0
    }
}

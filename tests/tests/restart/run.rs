//! One restart run and its checks (`restart_run!`, expanded inside
//! `restart_suite!`, whose items it uses).

macro_rules! restart_run {
    ($start:path, $shared:expr) => {
        /// Where the outbox lives.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        enum Layout {
            /// Everything on the restarted server.
            Together,
            /// The outbox on the shared server: only the handler's
            /// database (and the HTTP layer's) restarts.
            HandlerOnly,
        }

        /// A run's servers, pools, HTTP service and load.
        struct Fixture {
            server: Arc<Single>,
            pool: Pool<Db>,
            outbox: Pool<Db>,
            topic: String,
            coupons: Vec<i64>,
            base: String,
            layout: Layout,
        }

        /// What one run found.
        struct Run {
            outage: Duration,
            drain: Duration,
            http_drain: Duration,
            dead: i64,
            settled: i64,
            rerun: i64,
            deductions: (i64, i64),
            orders: (i64, i64),
            seen: Arc<Seen>,
        }

        async fn fixture(layout: Layout) -> Option<Fixture> {
            let server = tokio::task::spawn_blocking(|| $start("restart"))
                .await
                .expect("start")?;
            let server = Arc::new(server);
            let pool = lazy_pool(&server.url(), Duration::from_secs(1));
            let coupons = setup(&pool).await;
            let outbox: Pool<Db> = match layout {
                Layout::Together => pool.clone(),
                Layout::HandlerOnly => $shared?,
            };
            let scope: &'static str = Box::leak(unique("restart").into_boxed_str());
            let policy = Idempotency::new(scope, api_key).lease(LEASE);
            let router = Router::new().route("/orders", post(order).layer(policy.layer(&pool)));
            Some(Fixture {
                server,
                pool,
                outbox,
                topic: unique("restart.deduct"),
                coupons,
                base: http::serve(router).await,
                layout,
            })
        }

        /// Stops the server (`kill`: SIGKILL, else a clean shutdown).
        async fn stop(server: &Arc<Single>, kill: bool) {
            let s = server.clone();
            tokio::task::spawn_blocking(move || if kill { s.kill9() } else { s.terminate() })
                .await
                .expect("stop");
        }

        /// The outage: the server stopped, until it has been down longer
        /// than twice the leases, the HTTP clients were refused (503)
        /// and, with the outbox up, 30 of the relay's attempts failed in
        /// it; the held handlers then let go (they fail in the outage,
        /// their leases long gone; with the outbox down, the server stays
        /// down until the relay gave up booking their attempts), and the
        /// server started again on the
        /// same port and data. Returns the outage's length.
        async fn outage(
            f: &Fixture,
            kill: bool,
            relay: &RelayHandle,
            hold: &Hold,
            seen: &Arc<Seen>,
            late: &[i64],
        ) -> (Duration, tokio::task::JoinSet<()>) {
            let failed = |s: &idem_runtime::outbox::RelayStats| s.retried() + s.dead_lettered();
            let before = failed(relay.stats());
            let outbox_up = f.layout == Layout::HandlerOnly;
            let stopped = Instant::now();
            stop(&f.server, kill).await;
            // The second half of the requests, sent once the server is
            // down (before, they could all be answered before a clean
            // shutdown closed the pool's sessions, and no 503 be seen):
            // each retried with its key until the server is back.
            let during = clients::send(&f.base, "key", late, 4, seen);
            wait_for("the outage to be seen", Duration::from_secs(90), || {
                let long = stopped.elapsed() >= 2 * LEASE + Duration::from_secs(1);
                let refused = Seen::get(&seen.unavailable) > 0;
                let relay_saw = !outbox_up || failed(relay.stats()) >= before + 30;
                async move { long && refused && relay_saw }
            })
            .await;
            hold.open();
            // Their calls fail in the outage; with the outbox down too,
            // so does the bookkeeping that gives their attempts back,
            // until the relay gives up on it.
            if !outbox_up {
                wait_for("the held attempts unrecorded", Duration::from_secs(60), || {
                    let n = hold.unrecorded_count();
                    async move { n >= HELD }
                })
                .await;
            }
            let s = f.server.clone();
            tokio::task::spawn_blocking(move || s.restart()).await.expect("restart");
            (stopped.elapsed(), during)
        }

        async fn run(layout: Layout, kill: bool) -> Option<Run> {
            let f = fixture(layout).await?;
            let (hold, seen) = (Arc::new(Hold::default()), Arc::new(Seen::default()));
            let orders: Vec<i64> = (0..ORDERS).map(|_| ids(1)).collect();
            let (early, late) = orders.split_at(ORDERS / 2);
            clients::join(clients::send(&f.base, "key", early, 4, &seen)).await;
            let producer = produce(&f.outbox, &f.topic, &f.coupons);
            // Its own pool, failing fast in the outage: many attempts
            // fail in it, several of each message.
            let handler = (layout == Layout::HandlerOnly)
                .then(|| lazy_pool(&f.server.url(), Duration::from_millis(100)));
            let relay = relay(&f.outbox, handler, &f.topic, &hold);
            // Under load: a quarter of the effects done, then `HELD`
            // handlers held with their messages claimed.
            wait_for("a quarter of the effects", Duration::from_secs(60), || async {
                effects(&f.pool, "deduction").await.0 >= (N / 4) as i64
            })
            .await;
            hold.arm(HELD);
            wait_for("the held handlers", Duration::from_secs(60), || {
                let held = hold.held();
                async move { held >= HELD }
            })
            .await;
            let (outage, during) = outage(&f, kill, &relay, &hold, &seen, late).await;
            let back = Instant::now();
            producer.await.expect("producer");
            wait_for("the drain after the restart", Duration::from_secs(120), || async {
                let open = by_status(&f.outbox, &f.topic, "pending").await;
                let settled = by_status(&f.outbox, &f.topic, "success").await
                    + by_status(&f.outbox, &f.topic, "failed").await;
                open == 0 && settled == N as i64
            })
            .await;
            let drain = back.elapsed();
            clients::join(during).await;
            let http_drain = back.elapsed();
            // Every early key once more, after the restart: replayed.
            clients::join(clients::send(&f.base, "key", early, 4, &seen)).await;
            let stats = relay.stats().snapshot();
            relay.shutdown().await;
            eprintln!(
                "{:?} restart ({}, {layout:?}): {N} messages and {ORDERS} requests, outage {:.1} s, relay drained {:.1} s and HTTP {:.1} s after the restart; relay outages {} (retried {}, dead {})",
                f.server.engine(),
                if kill { "SIGKILL" } else { "SIGTERM" },
                outage.as_secs_f64(),
                drain.as_secs_f64(),
                http_drain.as_secs_f64(),
                stats.outages,
                stats.retried,
                stats.dead_lettered,
            );
            Some(Run {
                outage,
                drain,
                http_drain,
                dead: by_status(&f.outbox, &f.topic, "failed").await,
                settled: by_status(&f.outbox, &f.topic, "success").await,
                rerun: held_rerun(&f.outbox, &hold.held_ids()).await,
                deductions: effects(&f.pool, "deduction").await,
                orders: effects(&f.pool, "order").await,
                seen,
            })
        }

        /// The held messages that ran a second attempt (counted). A
        /// message whose commit was cut off by the stop may be counted
        /// once (its outcome was unknown, not an outage).
        async fn held_rerun(outbox: &Pool<Db>, ids: &[i64]) -> i64 {
            let mut n = 0;
            for id in ids {
                let attempts: i32 = sqlx::query_scalar(sql(D, "SELECT attempts FROM idem_outbox WHERE id = ?"))
                    .bind(*id)
                    .fetch_one(outbox)
                    .await
                    .expect("attempts");
                n += i64::from(attempts > 1);
            }
            n
        }

        fn check(r: &Run) {
            let (rows, distinct) = r.deductions;
            let (o_rows, o_distinct) = r.orders;
            eprintln!(
                "  outage {:.1} s, drain {:.1} s (HTTP {:.1} s); messages: lost {}, double {}, dead {}, settled {}, run again {}; requests: lost {}, double {}, answered 503 {} times, 409 {} times",
                r.outage.as_secs_f64(),
                r.drain.as_secs_f64(),
                r.http_drain.as_secs_f64(),
                N as i64 - distinct,
                rows - distinct,
                r.dead,
                r.settled,
                r.rerun,
                ORDERS as i64 - o_distinct,
                o_rows - o_distinct,
                Seen::get(&r.seen.unavailable),
                Seen::get(&r.seen.in_flight),
            );
            assert_eq!(r.dead, 0, "dead letters");
            // Only the outage interrupted the held ones: not counted.
            assert_eq!(r.rerun, 0, "held messages counted a second attempt");
            assert_eq!(r.settled, N as i64, "messages settled success");
            assert_eq!(distinct, N as i64, "lost effects");
            assert_eq!(rows, N as i64, "double effects");
            assert_eq!(o_distinct, ORDERS as i64, "lost requests");
            assert_eq!(o_rows, ORDERS as i64, "double requests");
            assert_eq!(Seen::get(&r.seen.answered), (ORDERS + ORDERS / 2) as u64, "answered");
            assert!(Seen::get(&r.seen.unavailable) > 0, "503 during the outage");
            assert!(r.outage > 2 * LEASE, "{:?}", r.outage);
        }

        // One restart at a time (each starts a server of its own, on a
        // small machine); `exclusive` also turns the control's switch off.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn sigterm_restart_of_the_service_database_dead_letters_nothing_and_acts_once() {
            let _hooks = hooks::exclusive().await;
            if let Some(r) = run(Layout::Together, false).await {
                check(&r);
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn sigkill_restart_of_the_service_database_dead_letters_nothing_and_acts_once() {
            let _hooks = hooks::exclusive().await;
            if let Some(r) = run(Layout::Together, true).await {
                check(&r);
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn sigkill_restart_of_the_handlers_database_dead_letters_nothing_and_acts_once() {
            let _hooks = hooks::exclusive().await;
            if let Some(r) = run(Layout::HandlerOnly, true).await {
                check(&r);
            }
        }

        /// The control: the old rule (an outage counts as an attempt)
        /// dead-letters healthy messages while the handler's database is
        /// down and the relay's is up.
        #[cfg_attr(
            not(idem_broken),
            ignore = "a control: needs RUSTFLAGS=\"--cfg idem_broken\" (see .ci/run)"
        )]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn control_outage_counted_dead_letters_in_a_database_restart() {
            let _hooks = hooks::exclusive().await;
            idem_runtime::testing::set_broken_outage_counted(true);
            let Some(r) = run(Layout::HandlerOnly, true).await else { return };
            eprintln!("control: {} dead letters, {:?} effects", r.dead, r.deductions);
            assert!(r.dead > 0, "the old rule dead-letters messages in the outage");
        }
    };
}

//! The front cache through a real Redis outage, and on a real Redis
//! Cluster. Its own test binary: it stops and restarts the machine's Redis
//! server, which no concurrently running test may depend on.

#[path = "common"]
mod common {
    pub(crate) mod coupons;
}

use common::coupons::CouponState;
use idem_runtime::cache::RedisCache;
use idem_runtime::{Outcome, Source, idempotent};
use idem_testkit::{concurrently, ids, redis_up};
use sqlx::{Postgres, Sqlite, SqlitePool, Transaction};
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
struct Deduct {
    coupon_id: i64,
}

#[idempotent(
    key = "outage:{msg.coupon_id}",
    strategy = state_machine,
    table = "idem_c_coupon",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
async fn deduct(tx: &mut Transaction<'_, Postgres>, msg: &Deduct) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO idem_c_deduction (coupon_id) VALUES ($1)")
        .bind(msg.coupon_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

const START_REDIS: &[&str] = &[
    "--daemonize",
    "yes",
    "--bind",
    "127.0.0.1",
    "-::1",
    "--port",
    "6379",
    "--save",
    "",
    "--appendonly",
    "no",
    "--dir",
    "/var/lib/redis",
    "--logfile",
    "/var/log/redis/ci.log",
];

fn redis_ping(port: u16) -> bool {
    Command::new("redis-cli")
        .args(["-p", &port.to_string(), "ping"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG")
}

/// Restarts the machine's Redis when dropped, whatever happened.
struct RestartRedis;
impl Drop for RestartRedis {
    fn drop(&mut self) {
        if !redis_ping(6379) {
            let _ = Command::new("redis-server").args(START_REDIS).status();
            let start = Instant::now();
            while !redis_ping(6379) && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_mid_run_and_restarted_no_double_no_lost() {
    if !redis_up().await {
        return;
    }
    let Some(pool) = idem_testkit::postgres(16).await else {
        return;
    };
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(77006)")
        .execute(&mut *tx)
        .await
        .unwrap();
    for stmt in [
        "CREATE TABLE IF NOT EXISTS idem_c_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
        "CREATE TABLE IF NOT EXISTS idem_c_deduction (coupon_id BIGINT NOT NULL)",
    ] {
        sqlx::query(stmt).execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    const N: i64 = 240;
    let first = ids(N);
    for id in first..first + N {
        sqlx::query("INSERT INTO idem_c_coupon (id, status) VALUES ($1, 'UNUSED')")
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
    }
    let cache = RedisCache::new(&idem_testkit::redis_url())
        .unwrap()
        .prefix(format!("idem-outage:{}:", ids(1)));
    let _restart = RestartRedis;
    // Connected before the first wave: on a loaded machine the background
    // connection could otherwise still be on its way through waves 0 and 1.
    assert!(
        cache.ready(Duration::from_secs(30)).await,
        "the cache connects"
    );
    // Three waves of deliveries of every message; Redis dies during the
    // second and comes back during the third.
    for wave in 0..3 {
        if wave == 1 {
            // Redis up, wave 0's markers written: a duplicate delivered now
            // is answered by the cache. Asserted here, one delivery at a
            // time, rather than left to which lookups of the outage wave
            // happen to run before the shutdown.
            let mut id = first;
            while cache.stats().hits() == 0 {
                assert!(
                    id < first + N,
                    "no duplicate was answered by the cache while it was up"
                );
                let r = deduct(Source::from(&pool).cache(&cache), &Deduct { coupon_id: id }).await;
                assert!(r.as_ref().is_ok_and(|o| o.is_duplicate()), "{r:?}");
                id += 1;
            }
        }
        let mut jobs = Vec::new();
        for id in first..first + N {
            let (pool, cache) = (pool.clone(), cache.clone());
            jobs.push(tokio::spawn(async move {
                deduct(Source::from(&pool).cache(&cache), &Deduct { coupon_id: id }).await
            }));
            if wave == 1 && id == first + N / 3 {
                let out = Command::new("redis-cli")
                    .args(["-p", "6379", "shutdown", "nosave"])
                    .output();
                assert!(out.is_ok(), "redis-cli shutdown");
            }
            if wave == 2 && id == first + N / 2 {
                drop(RestartRedis);
            }
        }
        for j in jobs {
            let r = j.await.unwrap();
            assert!(r.is_ok(), "{r:?}");
        }
    }
    assert!(redis_ping(6379), "Redis is back");
    let doubles: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM (SELECT coupon_id FROM idem_c_deduction WHERE coupon_id BETWEEN $1 AND $2 \
         GROUP BY coupon_id HAVING COUNT(*) > 1) d",
    )
    .bind(first)
    .bind(first + N - 1)
    .fetch_one(&pool)
    .await
    .unwrap();
    let done: i64 = sqlx::query_scalar(
        "SELECT COUNT(DISTINCT coupon_id) FROM idem_c_deduction WHERE coupon_id BETWEEN $1 AND $2",
    )
    .bind(first)
    .bind(first + N - 1)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((doubles, N - done), (0, 0), "no double, no lost deduction");
    let stats = cache.stats();
    assert!(stats.errors() > 0, "the outage was seen and counted");
    assert!(stats.hits() > 0, "the cache answered duplicates when up");
}

#[derive(Debug, Clone)]
struct Ping {
    id: i64,
}

#[idempotent(key = "cluster:{p.id}", strategy = unique_insert, constraint = "ping.id")]
async fn ping(tx: &mut Transaction<'_, Sqlite>, p: &Ping) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO ping (id) VALUES (?)")
        .bind(p.id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Three cluster nodes in a temporary directory, shut down when dropped.
struct Cluster {
    ports: Vec<u16>,
    /// The nodes' folder (their `nodes-<port>.conf`), removed with them.
    dir: std::path::PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for p in &self.ports {
            let _ = Command::new("redis-cli")
                .args(["-p", &p.to_string(), "shutdown", "nosave"])
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_cluster() -> Option<Cluster> {
    let base = 17_000 + (std::process::id() % 1000) as u16 * 3;
    let ports = vec![base, base + 1, base + 2];
    let dir = std::env::temp_dir().join(format!("idem-redis-cluster-{base}"));
    // Empty: a node that finds a `nodes-<port>.conf` of an earlier run
    // with the same ports (process ids repeat modulo 1000) rejoins that
    // run's cluster instead of forming a new one.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).ok()?;
    let cluster = Cluster {
        ports: ports.clone(),
        dir: dir.clone(),
    };
    for p in &ports {
        let ok = Command::new("redis-server")
            .args([
                "--port",
                &p.to_string(),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &format!("nodes-{p}.conf"),
                "--dir",
                dir.to_str()?,
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "yes",
                "--logfile",
                &format!("{}/{p}.log", dir.display()),
            ])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            idem_testkit::unreachable("redis-server (to start a cluster)", "could not start");
            return None;
        }
    }
    let start = Instant::now();
    while !ports.iter().all(|p| redis_ping(*p)) {
        if start.elapsed() > Duration::from_secs(10) {
            idem_testkit::unreachable("the Redis cluster nodes", "did not start");
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut args = vec!["--cluster".to_string(), "create".into()];
    args.extend(nodes);
    args.extend([
        "--cluster-replicas".into(),
        "0".into(),
        "--cluster-yes".into(),
    ]);
    let created = Command::new("redis-cli").args(&args).output().ok()?;
    assert!(
        created.status.success(),
        "cluster create: {}",
        String::from_utf8_lossy(&created.stdout)
    );
    // Every node, not the first alone: a node that has not yet learnt the
    // slot map answers CLUSTERDOWN, which the cache counts as an error.
    let start = Instant::now();
    loop {
        let mut ok = true;
        for p in &ports {
            let info = Command::new("redis-cli")
                .args(["-p", &p.to_string(), "cluster", "info"])
                .output()
                .ok()?;
            ok &= String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok");
        }
        if ok {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "cluster did not become ok"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(cluster)
}

#[tokio::test]
async fn works_on_a_redis_cluster() {
    let Some(cluster) = start_cluster() else {
        return;
    };
    let nodes: Vec<String> = cluster
        .ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}/"))
        .collect();
    let node_refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
    // A bound generous enough for a loaded 2-core machine: a call that
    // outlives it counts as an error, which this test asserts never
    // happens (CI once counted one, on a machine filling a database).
    let cache = RedisCache::cluster(&node_refs)
        .unwrap()
        .timeout(Duration::from_secs(2));
    // The first connection to a cluster (every node, the slot map) may
    // take longer than a call's bound: made before the first calls.
    assert!(
        cache.ready(Duration::from_secs(10)).await,
        "cluster reachable"
    );
    let pool: SqlitePool = idem_testkit::sqlite(2).await;
    sqlx::query("CREATE TABLE ping (id INTEGER PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    // Keys spread over the cluster's slots.
    let pings: Vec<Ping> = (0..20).map(|i| Ping { id: ids(1) + i }).collect();
    for p in &pings {
        assert!(
            ping(Source::from(&pool).cache(&cache), p)
                .await
                .unwrap()
                .is_executed()
        );
    }
    pool.close().await;
    let results = concurrently(20, || {
        let (pool, cache, p) = (
            pool.clone(),
            cache.clone(),
            pings[ids(1) as usize % 20].clone(),
        );
        async move { ping(Source::from(&pool).cache(&cache), &p).await }
    })
    .await;
    for r in results {
        assert_eq!(
            r.unwrap(),
            Outcome::Duplicate(None),
            "answered by the cluster alone"
        );
    }
    assert_eq!(cache.stats().errors(), 0);
}

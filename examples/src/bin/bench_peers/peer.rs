//! The job queues a peer would pick, each running the coupon work in its own
//! harness in `benches/peers` (its own workspace: the peers' sqlx 0.8 and
//! idem's sqlx 0.9 cannot share one lockfile's libsqlite3-sys), built on
//! first use and run as a child process whose last stdout line is a JSON
//! object.

use super::{Args, workspace};
use idem_examples::bench::outbox::BoxError;
use std::path::{Path, PathBuf};
use tokio::sync::OnceCell;

/// A peer's harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peer {
    /// sqlxmq 0.6: its runner, the job completed in the deduction's
    /// transaction.
    Sqlxmq,
    /// River's Rust client (`riverqueue`).
    River,
    /// graphile_worker.
    Graphile,
    /// apalis with its PostgreSQL storage (`apalis-postgres`).
    Apalis,
}

impl Peer {
    /// The binary `benches/peers` builds for it.
    fn binary(self) -> &'static str {
        match self {
            Peer::Sqlxmq => "idem-bench-peers",
            Peer::River => "river",
            Peer::Graphile => "graphile",
            Peer::Apalis => "apalis",
        }
    }
}

/// What a peer's run reported.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerRun {
    /// Jobs per second over the drain.
    pub(crate) rate: f64,
    /// The harness's own CPU per job during the drain, µs (None: not
    /// reported).
    pub(crate) cpu_us: Option<f64>,
}

static BUILT: OnceCell<PathBuf> = OnceCell::const_new();

/// Builds `benches/peers` (release) once per process; its manifest.
async fn built() -> Result<&'static PathBuf, BoxError> {
    BUILT
        .get_or_try_init(|| async {
            let manifest = workspace().join("benches/peers/Cargo.toml");
            let status = tokio::process::Command::new(cargo())
                .args(["build", "--release", "--quiet", "--bins", "--manifest-path"])
                .arg(&manifest)
                .status()
                .await?;
            if !status.success() {
                return Err(format!("cannot build {} ({status})", manifest.display()).into());
            }
            Ok::<_, BoxError>(manifest)
        })
        .await
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or("cargo".into())
}

/// Runs `peer`'s drain of `--messages` coupons with `--concurrency`
/// workers (`noop`: jobs that do nothing, its burn-down figure).
pub(crate) async fn run(
    url: &str,
    opts: &Args,
    peer: Peer,
    noop: bool,
) -> Result<PeerRun, BoxError> {
    let manifest = built().await?;
    let mut cmd = tokio::process::Command::new(
        workspace()
            .join("benches/peers/target/release")
            .join(peer.binary()),
    );
    cmd.args(["--url", url])
        .args(["--messages", &opts.messages.to_string()])
        .args(["--concurrency", &opts.concurrency.to_string()]);
    match peer {
        Peer::Sqlxmq => {
            cmd.arg("--migrations")
                .arg(sqlxmq_migrations(manifest).await?)
                .args(["--min-concurrency", &opts.sqlxmq_min.to_string()]);
        }
        Peer::River | Peer::Graphile | Peer::Apalis if noop => {
            cmd.arg("--noop");
        }
        Peer::River | Peer::Graphile | Peer::Apalis => {}
    }
    let out = cmd.stderr(std::process::Stdio::inherit()).output().await?;
    let name = peer.binary();
    if !out.status.success() {
        return Err(format!("the {name} run failed ({})", out.status).into());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout
        .lines()
        .last()
        .ok_or_else(|| format!("no output from the {name} run"))?;
    let v: serde_json::Value = serde_json::from_str(last)?;
    let rate = v["rate"]
        .as_f64()
        .ok_or_else(|| format!("no rate in the {name} run's output: {last}"))?;
    Ok(PeerRun {
        rate,
        cpu_us: v["cpu_us_per_msg"].as_f64(),
    })
}

/// The `migrations` folder of the sqlxmq package the harness builds
/// against, from `cargo metadata` (sqlxmq ships its migrations in its crate
/// for users to apply).
async fn sqlxmq_migrations(manifest: &Path) -> Result<PathBuf, BoxError> {
    let out = tokio::process::Command::new(cargo())
        .args(["metadata", "--format-version", "1", "--manifest-path"])
        .arg(manifest)
        .output()
        .await?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata for {} failed ({})",
            manifest.display(),
            out.status
        )
        .into());
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let sqlxmq = meta["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "sqlxmq"))
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("cargo metadata lists no sqlxmq package")?;
    Ok(Path::new(sqlxmq)
        .parent()
        .ok_or("sqlxmq's manifest has no folder")?
        .join("migrations"))
}

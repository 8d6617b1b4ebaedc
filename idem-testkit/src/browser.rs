//! A headless Chromium for tests of web pages, driven from `cargo test`
//! through WebDriver: Debian's `chromium` and `chromium-driver`
//! (`chromedriver`), with [`fantoccini`] as the client (re-exported here, so
//! a test needs no dependency of its own on it).
//!
//! [`Browser::start`] starts `chromedriver` on a [`free_port`] in a
//! [`Scratch`] directory of its own and opens one session on a headless
//! Chromium whose profile (`--user-data-dir`) is in that directory. The
//! skip rule is [`need`]'s: when `chromium` or `chromedriver` is not
//! installed the test is skipped (`SKIPPED: …`, `None`), and fails when
//! `CI=true` (`.ci/run` installs both).
//!
//! **Nothing outlives the handle.** `chromedriver` runs in a process group
//! of its own, which Chromium and its helpers (zygotes, renderers, GPU and
//! network services) inherit. Dropping a [`Browser`], also without
//! [`close`](Browser::close) (a test that panicked), kills the whole group
//! with SIGKILL, then any process left whose command line names the
//! scratch directory (one that left the group: Chromium's crash handlers
//! run in sessions of their own, their database in the directory), and
//! removes the directory. Everything Chromium writes (profile, config,
//! cache, crash database, its temporary directories) is in that
//! directory, not in the user's home or the system's temporary folder.
//! [`close`](Browser::close) ends the WebDriver session first (Chromium
//! exits cleanly), then does the same.
//!
//! Settings from the environment (set-but-empty means unset):
//! `IDEM_TEST_CHROMEDRIVER` and `IDEM_TEST_CHROMIUM` replace the programs'
//! paths ([`CHROMEDRIVER`], [`CHROMIUM`]); a path that does not exist
//! (`IDEM_TEST_CHROMEDRIVER=/nonexistent`) makes the tests skip.
//! `IDEM_KEEP_SCRATCH` keeps the directory (with `chromedriver.log`).
//!
//! ```no_run
//! # async fn run() {
//! use idem_testkit::browser::Browser;
//! use idem_testkit::browser::fantoccini::Locator;
//!
//! let Some(browser) = Browser::start("console_login").await else {
//!     return; // skipped: chromium or chromedriver is not installed
//! };
//! let page = browser.client();
//! page.goto("http://127.0.0.1:8080/").await.unwrap();
//! let title = page.find(Locator::Css("h1")).await.unwrap().text().await.unwrap();
//! assert_eq!(title, "Console");
//! browser.screenshot(std::path::Path::new("/tmp/console.png")).await;
//! browser.close().await;
//! # }
//! ```

pub use fantoccini;

use crate::cluster::{Proc, Scratch, free_port, need, wait_port};
use crate::env_setting;
use fantoccini::wd::Capabilities;
use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Debian's Chromium (package `chromium`); `IDEM_TEST_CHROMIUM` replaces it.
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// Debian's ChromeDriver (package `chromium-driver`);
/// `IDEM_TEST_CHROMEDRIVER` replaces it.
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The browser window's size, in CSS pixels (also the screenshots' size).
pub const WINDOW_SIZE: (u32, u32) = (1280, 900);

/// How long `chromedriver` may take to listen, and the session (Chromium's
/// start) to open, on a busy machine.
const START_WITHIN: Duration = Duration::from_secs(60);

/// A headless Chromium session on a `chromedriver` of its own; see the
/// [module documentation](self). Dropping it kills `chromedriver`,
/// Chromium and every helper process of theirs, and removes its directory.
#[derive(Debug)]
pub struct Browser {
    /// `None` once [`close`](Browser::close) took it.
    client: Option<Client>,
    driver: Proc,
    /// The process group of `chromedriver` and Chromium (`chromedriver`'s
    /// pid).
    group: u32,
    /// Dropped last: the processes are gone by then.
    scratch: Scratch,
}

impl Browser {
    /// Starts `chromedriver` and opens a session on a headless Chromium
    /// (`--headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage
    /// --window-size=1280,900`, its profile in the scratch directory).
    ///
    /// Returns `None`, after printing why, when `chromium` or
    /// `chromedriver` is not installed (the test is skipped).
    ///
    /// # Panics
    ///
    /// When they are not installed and `CI=true`; when `chromedriver` does
    /// not listen, or the session does not open, within 60 s (with the end
    /// of `chromedriver`'s log in the message).
    pub async fn start(test: &str) -> Option<Browser> {
        let driver_path = env_setting("IDEM_TEST_CHROMEDRIVER").unwrap_or(CHROMEDRIVER.into());
        let chromium = env_setting("IDEM_TEST_CHROMIUM").unwrap_or(CHROMIUM.into());
        need(test, &[&driver_path, &chromium])?;

        // A start that fails (the port picked was taken meanwhile by
        // another process, chromedriver or Chromium dying on start-up) is
        // made again from scratch on a new port, twice at most.
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Self::try_start(&driver_path, &chromium).await {
                Ok(browser) => return Some(browser),
                Err(why) => {
                    eprintln!("{test}: the browser did not start, starting it again: {why}");
                    failures.push(why);
                }
            }
        }
        panic!(
            "{test}: the browser did not start, 3 times:\n{}",
            failures.join("\n---\n")
        );
    }

    /// One start: `chromedriver` on a free port, then a session; `Err`
    /// with the end of `chromedriver`'s log (the processes are killed).
    async fn try_start(driver_path: &str, chromium: &str) -> Result<Browser, String> {
        let scratch = Scratch::new("browser");
        // Chromium's own temporary directories (`.org.chromium.Chromium.*`,
        // its singleton socket and shared memory), which it never removes
        // when killed, go in the scratch directory too.
        let tmp = scratch.join("tmp");
        std::fs::create_dir_all(&tmp).expect("create the browser's temporary directory");
        let port = free_port();
        let mut cmd = Command::new(driver_path);
        cmd.arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            // Chromium's default config and cache folders (its crash
            // reports' database, which it sets up before reading
            // `--user-data-dir`) in the scratch directory too: nothing is
            // written to the user's home, and the crash handlers, which run
            // in sessions of their own, name the directory as well.
            .env("XDG_CONFIG_HOME", scratch.join("config"))
            .env("XDG_CACHE_HOME", scratch.join("cache"))
            .env("TMPDIR", &tmp)
            // Its own process group, inherited by Chromium: one kill ends
            // them all.
            .process_group(0);
        let driver = Proc::spawn("chromedriver", cmd, scratch.join("chromedriver.log"));
        let group = driver.pid().expect("chromedriver just started");
        // From here on, a panic drops the Browser, which kills the group.
        let mut browser = Browser {
            client: None,
            driver,
            group,
            scratch,
        };

        let listening = tokio::task::spawn_blocking(move || wait_port(port, START_WITHIN))
            .await
            .expect("wait for chromedriver");
        if !listening {
            return Err(format!(
                "chromedriver did not listen on port {port} within {START_WITHIN:?}\n{}",
                browser.driver.log_tail(30)
            ));
        }

        let profile = browser.scratch.join("profile");
        let (width, height) = WINDOW_SIZE;
        let mut caps = Capabilities::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    format!("--window-size={width},{height}"),
                    format!("--user-data-dir={}", profile.display()),
                    "--no-first-run",
                    "--no-default-browser-check",
                    "--disable-extensions",
                    "--disable-background-networking",
                ],
            }),
        );
        let mut builder = ClientBuilder::new(HttpConnector::new());
        builder.capabilities(caps);
        let url = format!("http://127.0.0.1:{port}");
        let connect = builder.connect(&url);
        let client = match tokio::time::timeout(START_WITHIN, connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                return Err(format!(
                    "open a Chromium session on chromedriver: {e}\n{}",
                    browser.driver.log_tail(30)
                ));
            }
            Err(_) => {
                return Err(format!(
                    "the Chromium session did not open within {START_WITHIN:?}\n{}",
                    browser.driver.log_tail(30)
                ));
            }
        };
        browser.client = Some(client);
        Ok(browser)
    }

    /// The WebDriver client of the session: `goto`, `find`, `form`,
    /// `execute`, … (see [`fantoccini::Client`]).
    pub fn client(&self) -> &Client {
        self.client
            .as_ref()
            .expect("a started Browser has its client until close")
    }

    /// The scratch directory (Chromium's profile, `chromedriver.log`):
    /// every process of this browser names it on its command line.
    pub fn dir(&self) -> &Path {
        self.scratch.path()
    }

    /// The last `lines` lines of `chromedriver`'s log, for a failure
    /// message.
    pub fn log_tail(&self, lines: usize) -> String {
        self.driver.log_tail(lines)
    }

    /// Writes a PNG of the current page (the visible part of the window) to
    /// `path`.
    ///
    /// # Panics
    ///
    /// When the screenshot cannot be taken or written.
    pub async fn screenshot(&self, path: &Path) {
        let png = self
            .client()
            .screenshot()
            .await
            .unwrap_or_else(|e| panic!("take a screenshot: {e}"));
        std::fs::write(path, png)
            .unwrap_or_else(|e| panic!("write the screenshot to {}: {e}", path.display()));
    }

    /// Ends the WebDriver session and waits (up to 5 s) for Chromium to
    /// exit, then kills `chromedriver` and whatever is left, as on drop.
    pub async fn close(mut self) {
        if let Some(client) = self.client.take() {
            // An error here (a session already gone) changes nothing: the
            // drop below kills what is left.
            let _ = tokio::time::timeout(Duration::from_secs(10), client.close()).await;
        }
        // Chromium exits once its session ends: up to 5 s to do so
        // cleanly. chromedriver outlives its sessions: the drop then kills
        // it (nothing of its own to flush), with whatever is left. It is
        // not reaped before, so its pid, the group's id, cannot be reused
        // by an unrelated process before the group is killed.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !naming(self.scratch.path()).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole group: chromedriver, Chromium and its helpers.
        let _ = Command::new("kill")
            .arg("-KILL")
            .arg("--")
            .arg(format!("-{}", self.group))
            .status();
        self.driver.kill9();
        // Any process that left the group (a new session) but still names
        // the scratch directory (Chromium's `--user-data-dir`).
        sweep(self.scratch.path());
    }
}

/// Kills (SIGKILL) every process whose command line contains `dir`, and
/// waits up to 5 s for them to be gone.
fn sweep(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = naming(dir);
        if left.is_empty() || Instant::now() >= deadline {
            return;
        }
        for pid in left {
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .status();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The processes whose command line (`/proc/<pid>/cmdline`) contains
/// `dir`.
fn naming(dir: &Path) -> Vec<u32> {
    let needle = dir.as_os_str().as_encoded_bytes();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != std::process::id())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmd| cmd.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

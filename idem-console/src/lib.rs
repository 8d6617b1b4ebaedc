//! idem's operator console: server-rendered pages over idem's tables, a
//! Prometheus `/metrics` endpoint and `/health`, as one axum [`Router`].
//!
//! `idem serve` (the CLI) runs it on its own; an application can also
//! mount it beside its own routes, so that `/metrics` carries the counters
//! its relay and handlers record:
//!
//! ```no_run
//! use idem_console::Console;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::sqlite::SqlitePoolOptions::new().connect("sqlite://app.db?mode=rwc").await?;
//! idem_runtime::migrate(&pool).await?;
//! let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
//! let console = Console::new(pool)
//!     .write_token(std::env::var("IDEM_WRITE_TOKEN")?)?
//!     .prometheus(prometheus);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, console.router()).await?;
//! # Ok(()) }
//! ```
//!
//! The paths, at the root or under the prefix of [`Console::mount_at`]:
//!
//! | path | method | what |
//! |---|---|---|
//! | `/` | GET | the outbox by topic and status, the oldest pending age, a live chart of the backlog and deliveries/s, the relays holding leases |
//! | `/live` | GET | the live part of `/` alone (the page refreshes it every 3 s) |
//! | `/messages?status=&topic=&after=&limit=` | GET | messages of one status, oldest first, paginated |
//! | `/messages/{id}` | GET | one message, online or archived: its fields, headers, payload and attempt log |
//! | `/messages/{id}/retry-now` | POST | makes a dead letter or a waiting pending message due now (write token, CSRF) |
//! | `/messages/{id}/discard` | POST | archives a dead letter or pending message as failed, with a reason (write token, CSRF) |
//! | `/topics` | GET | each topic's backlog and dead letters, and whether it is paused |
//! | `/topics/pause`, `/topics/resume` | POST | pauses a topic (relays stop claiming it) or resumes it; the topic in the body (write token, CSRF) |
//! | `/lookup?key=&caller=` | GET | what the `Idempotency-Key` layer kept for an HTTP request |
//! | `/processes` | GET | the relays and consumers with their heartbeats, stale ones marked |
//! | `/dead-letters?topic=&after=&limit=` | GET | failed messages with their reasons, to select for a requeue |
//! | `/requeue?id=…&id=…` / `?topic=` / `?all=1` | GET | the preview: how many failed messages a requeue would take, and which |
//! | `/requeue` | POST | the confirmation: requeues what the preview showed (write token, CSRF) |
//! | `/records?key=&biz_type=` | GET | an idempotency record, online or archived |
//! | `/archive` | GET | rows eligible for archiving, the last pass, the history tables' sizes |
//! | `/login`, `/logout` | GET, POST | sign in with the write token (a signed session cookie); sign out, which ends the session on the server |
//! | `/metrics` | GET | Prometheus text format: idem's counters and the outbox gauges read from the database |
//! | `/metrics/database` | GET | the outbox gauges alone (see [`Console::database_gauges_apart`]) |
//! | `/health` | GET | 200 when the database answers, 503 when not |
//!
//! **Safety.** The console answers only to IP addresses, `localhost` and
//! the host names given with [`Console::allowed_host`] (421 to any other
//! `Host`), so that a page of another site cannot read it through a name
//! of its own pointed at it (DNS rebinding). Without a write token the
//! console is read-only: every POST but sign-in is refused with 403.
//! With one, a state-changing request is a
//! POST that carries either a session cookie (from `/login`) and its CSRF
//! token, or `Authorization: Bearer <token>`; a POST from another origin is
//! refused either way (behind a reverse proxy that rewrites `Host`, give
//! the console its [`public_origin`](Console::public_origin)). Requeues
//! go through [`idem_runtime::outbox::admin::requeue`], the guarded function the CLI
//! uses: only failed messages change, never successful or pending ones;
//! retry-now, discard, pause and resume through their guarded functions
//! of [`idem_runtime::outbox::admin`] likewise (a message a relay is
//! delivering is refused). Every write is logged (`tracing` target
//! `idem::audit`) with who made it: `console:` and the session or bearer,
//! and the client's address when the server gives it.
//! Nothing from a request reaches SQL except as a bound value.
//!
//! # Several consoles over one database
//!
//! The outbox gauges (`idem_outbox_pending` and the others read from the
//! database) are the database's, not a console's: scraped from N consoles
//! they would be exported N times, and a `sum` over them N times too large.
//! With [`Console::database_gauges_apart`], `/metrics` leaves them out and
//! `/metrics/database` serves them alone; scrape `/metrics` from every
//! console and `/metrics/database` through one address in front of them
//! (one scrape target, whichever console answers):
//!
//! ```yaml
//! scrape_configs:
//!   - job_name: idem-console          # each console: its counters, its health
//!     kubernetes_sd_configs: [{ role: pod }]
//!     metrics_path: /metrics
//!   - job_name: idem-database         # once per database
//!     metrics_path: /metrics/database
//!     static_configs: [{ targets: ["idem-console.ops.svc:8080"] }]
//! ```
//!
//! Without it (every console's `/metrics` has the gauges), aggregate them
//! with `max`, never `sum`: `max without (instance, pod) (idem_outbox_pending)`.
#![cfg_attr(docsrs, feature(doc_cfg))]

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chart::Samples;
use idem_runtime::Operable;
use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::Pool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod auth;
mod cache;
mod chart;
mod error;
mod fmt;
mod host;
mod layout;
mod metrics_page;
mod mount;
mod pages;
mod params;
mod read;
mod throttle;
mod viewer;
mod write;

pub use auth::TokenError;
pub use host::HostError;
pub use mount::MountError;

/// The console: its database, its write token, its metrics.
pub struct Console<DB: Operable> {
    inner: Inner<DB>,
}

impl<DB: Operable> std::fmt::Debug for Console<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("writable", &self.inner.auth.writable())
            .field("outbox_retention", &self.inner.outbox_retention)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner<DB: Operable> {
    pub(crate) pool: Pool<DB>,
    pub(crate) auth: auth::Auth,
    pub(crate) prometheus: Option<PrometheusHandle>,
    /// See [`Console::database_gauges_apart`].
    pub(crate) database_gauges_apart: bool,
    pub(crate) outbox_retention: Duration,
    pub(crate) samples: Mutex<Samples>,
    pub(crate) sample_every: Duration,
    pub(crate) figures: cache::Figures,
    pub(crate) mount: mount::Mount,
    pub(crate) site: host::Site,
}

pub(crate) type Shared<DB> = Arc<Inner<DB>>;

impl<DB: Operable> Console<DB> {
    /// A read-only console over `pool` (whose idem tables exist: see
    /// [`idem_runtime::migrate`]).
    pub fn new(pool: Pool<DB>) -> Self {
        Console {
            inner: Inner {
                pool,
                auth: auth::Auth::read_only(),
                prometheus: None,
                database_gauges_apart: false,
                outbox_retention: idem_runtime::archive::DEFAULT_OUTBOX_RETENTION,
                samples: Mutex::new(Samples::new(chart::WINDOW)),
                sample_every: Duration::from_secs(2),
                figures: cache::Figures::new(),
                mount: mount::Mount::default(),
                site: host::Site::default(),
            },
        }
    }

    /// Allows requeues to whoever presents `token` (at least 16 characters,
    /// no spaces or control characters, not easy to guess: a token of
    /// repeated or consecutive characters is refused; make one with
    /// `openssl rand -hex 16`): signed in through `/login`, or as
    /// `Authorization: Bearer <token>`. After 5 wrong tokens in a row, a
    /// client's attempts are refused unchecked (429, `Retry-After`) for
    /// 1 s, doubling with each further wrong token up to 5 minutes; a
    /// client is its IP address (an IPv6 client its /64) when the router is
    /// served with `into_make_service_with_connect_info::<SocketAddr>()`
    /// (as `idem serve` does), else all clients share one back-off. A
    /// flood of addresses locks no one else out: at most 4,096 clients are
    /// remembered, and when they are all taken the network holding the
    /// most of them (IPv4 /24, /16, /8; IPv6 /56, /48, /40, /32) becomes
    /// one client, whose back-off covers all its addresses, while the
    /// clients of other networks keep their own; an address that gave the
    /// right token is never merged.
    pub fn write_token(mut self, token: impl Into<String>) -> Result<Self, TokenError> {
        self.inner.auth = auth::Auth::with_token(&token.into())?;
        Ok(self)
    }

    /// Also answers to requests for `host`: a name (at any port) or
    /// `name:port` (at that port only), such as the name users and
    /// scrapers reach the console at. By default it answers to IP
    /// addresses and `localhost` only (names no other site can point at
    /// it), and with 421 to any other `Host`.
    ///
    /// ```
    /// # fn f(pool: sqlx::SqlitePool) -> Result<(), idem_console::HostError> {
    /// let console = idem_console::Console::new(pool).allowed_host("console.internal")?;
    /// # let _ = console; Ok(()) }
    /// ```
    pub fn allowed_host(mut self, host: &str) -> Result<Self, HostError> {
        self.inner.site.allow_host(host)?;
        Ok(self)
    }

    /// The origin users reach the console at through a reverse proxy
    /// (such as `https://console.example.com`; may be given more than
    /// once): sign-ins and requeues whose `Origin` it is are accepted
    /// although the proxy replaced `Host` (nginx's default), and the
    /// console answers to its host (which Caddy passes on). Without it, a
    /// POST is accepted only from the origin that `Host` names.
    ///
    /// ```
    /// # fn f(pool: sqlx::SqlitePool) -> Result<(), idem_console::HostError> {
    /// let console = idem_console::Console::new(pool).public_origin("https://console.example.com")?;
    /// # let _ = console; Ok(()) }
    /// ```
    pub fn public_origin(mut self, origin: &str) -> Result<Self, HostError> {
        self.inner.site.public_origin(origin)?;
        Ok(self)
    }

    /// Serves the counters of this recorder (the one the application
    /// installed, so its relay's and handlers' counters) in `/metrics`,
    /// beside the gauges read from the database. Describes idem's metrics
    /// to the installed recorder ([`idem_runtime::metrics::describe`]), so
    /// that each series has its HELP text.
    pub fn prometheus(mut self, handle: PrometheusHandle) -> Self {
        idem_runtime::metrics::describe();
        self.inner.prometheus = Some(handle);
        self
    }

    /// Serves the gauges read from the database (`idem_outbox_pending`,
    /// `idem_outbox_failed`, `idem_outbox_success`,
    /// `idem_outbox_oldest_pending_age_seconds`,
    /// `idem_outbox_lease_holders`) at `/metrics/database` instead of
    /// `/metrics`, for several consoles over one database: `/metrics` is
    /// scraped from each console (its process's counters and its own
    /// health), `/metrics/database` through one address in front of them
    /// all (a Kubernetes Service, a load balancer), so that each gauge is
    /// exported once per database, by whichever console answers (see
    /// [Several consoles over one database](crate#several-consoles-over-one-database)).
    ///
    /// ```
    /// # fn f(pool: sqlx::SqlitePool) {
    /// let console = idem_console::Console::new(pool).database_gauges_apart();
    /// # let _ = console; }
    /// ```
    pub fn database_gauges_apart(mut self) -> Self {
        self.inner.database_gauges_apart = true;
        self
    }

    /// The outbox retention the archive page measures eligibility with
    /// (the archiver's: default
    /// [`DEFAULT_OUTBOX_RETENTION`](idem_runtime::archive::DEFAULT_OUTBOX_RETENTION)).
    pub fn outbox_retention(mut self, retention: Duration) -> Self {
        self.inner.outbox_retention = retention;
        self
    }

    /// How often the backlog is sampled for the chart (default 2 s, at
    /// least 100 ms); also the oldest the overview's and `/metrics`'
    /// figures may be: they are read once per interval however many tabs
    /// refresh and scrapers ask (a requeue through the console shows at
    /// once). On an outbox so large that a read takes more than a tenth
    /// of the interval, a figure is kept ten times as long as its read
    /// took, so that the console spends at most about a tenth of its time
    /// reading it.
    pub fn sample_every(mut self, every: Duration) -> Self {
        self.inner.sample_every = every.max(Duration::from_millis(100));
        self
    }

    /// Serves the console under `path` (such as `/ops/idem`) instead of at
    /// the root, to merge its router into an application's: every link,
    /// form, redirect and the session cookie then stay under that prefix,
    /// and the application keeps its own fallback.
    ///
    /// ```
    /// # async fn app(pool: sqlx::SqlitePool) -> Result<(), idem_console::MountError> {
    /// let app = axum::Router::new()
    ///     .route("/", axum::routing::get(|| async { "the application" }))
    ///     .merge(idem_console::Console::new(pool).mount_at("/ops/idem")?.router());
    /// // the overview is at /ops/idem/, the dead letters at /ops/idem/dead-letters
    /// # let _ = app; Ok(()) }
    /// ```
    ///
    /// `path` is `/`-separated segments of letters, digits and `-._~`
    /// (else [`MountError`]); `/` is the root. Merge the router rather
    /// than nest it: its links carry the prefix given here, and a nested
    /// console's would miss the nesting path.
    pub fn mount_at(mut self, path: &str) -> Result<Self, MountError> {
        self.inner.mount = mount::Mount::new(path)?;
        Ok(self)
    }

    /// The routes. Inside a Tokio runtime this also starts the backlog
    /// sampler for the chart, which stops when the router is dropped.
    pub fn router(self) -> Router {
        let shared: Shared<DB> = Arc::new(self.inner);
        if tokio::runtime::Handle::try_current().is_ok() {
            chart::spawn_sampler(Arc::downgrade(&shared));
        }
        let mount = shared.mount.clone();
        let secure = move |mut r: Response| {
            // A page's failure is rendered here, where the prefix is known.
            if let Some(e) = r.extensions_mut().remove::<error::ErrorPage>() {
                let status = r.status();
                let retry = r.headers().get(header::RETRY_AFTER).cloned();
                r = (status, e.render(&mount)).into_response();
                if let Some(retry) = retry {
                    r.headers_mut().insert(header::RETRY_AFTER, retry);
                }
            }
            let h = r.headers_mut();
            h.insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(
                    "default-src 'self'; img-src 'self' data:; style-src 'self'; \
                     script-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
                ),
            );
            h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
            h.insert(
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            );
            // Not `no-referrer`: under it browsers send `Origin: null` with
            // a form's POST, and the same-origin check needs the origin.
            h.insert(
                header::REFERRER_POLICY,
                HeaderValue::from_static("same-origin"),
            );
            h.entry(header::CACHE_CONTROL)
                .or_insert(HeaderValue::from_static("no-store"));
            r
        };
        let base = shared.mount.base().to_string();
        let at = |path: &str| format!("{base}{path}");
        let mut router = routes::<DB>(&at);
        router = if base.is_empty() {
            router.fallback(not_found)
        } else {
            // Mounted: the prefix without its slash leads to the overview,
            // and unknown paths under the prefix get the console's 404; no
            // fallback, so the application merging this router keeps its own.
            let overview = at("/");
            router
                .route(
                    &base,
                    get(move || async move { Redirect::permanent(&overview) }),
                )
                .route(&at("/{*rest}"), axum::routing::any(not_found))
        };
        router
            // Inside the safety headers' layer, so that a refusal has them.
            .layer(axum::middleware::from_fn_with_state(
                shared.clone(),
                host::guard::<DB>,
            ))
            .layer(axum::middleware::map_response(move |r: Response| {
                let r = secure(r);
                async move { r }
            }))
            .with_state(shared)
    }
}

/// Every page and endpoint, each at `at(path)` (its path under the mount).
fn routes<DB: Operable>(at: &dyn Fn(&str) -> String) -> Router<Shared<DB>> {
    Router::new()
        .route(&at("/"), get(pages::overview::page::<DB>))
        .route(&at("/live"), get(pages::overview::live::<DB>))
        .route(&at("/messages"), get(pages::messages::messages::<DB>))
        .route(&at("/messages/{id}"), get(pages::message::page::<DB>))
        .route(
            &at("/messages/{id}/retry-now"),
            post(pages::actions::retry_now::<DB>),
        )
        .route(
            &at("/messages/{id}/discard"),
            post(pages::actions::discard::<DB>),
        )
        .route(&at("/topics"), get(pages::topics::page::<DB>))
        .route(&at("/topics/pause"), post(pages::topics::pause::<DB>))
        .route(&at("/topics/resume"), post(pages::topics::resume::<DB>))
        .route(&at("/lookup"), get(pages::lookup::page::<DB>))
        .route(&at("/processes"), get(pages::processes::page::<DB>))
        .route(
            &at("/dead-letters"),
            get(pages::messages::dead_letters::<DB>),
        )
        .route(
            &at("/requeue"),
            get(pages::requeue::preview::<DB>).post(pages::requeue::confirm::<DB>),
        )
        .route(&at("/records"), get(pages::records::page::<DB>))
        .route(&at("/archive"), get(pages::archive::page::<DB>))
        .route(
            &at("/login"),
            get(pages::login::form_page::<DB>).post(pages::login::login::<DB>),
        )
        .route(&at("/logout"), post(pages::login::logout::<DB>))
        .route(&at("/metrics"), get(metrics_page::metrics::<DB>))
        .route(&at("/metrics/database"), get(metrics_page::database::<DB>))
        .route(&at("/health"), get(metrics_page::health::<DB>))
        .route(&at("/static/console.css"), get(css))
        .route(&at("/static/console.js"), get(js))
}

async fn css() -> Response {
    static_file(
        "text/css; charset=utf-8",
        include_str!("../static/console.css"),
    )
}

async fn js() -> Response {
    static_file(
        "text/javascript; charset=utf-8",
        include_str!("../static/console.js"),
    )
}

fn static_file(kind: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        body,
    )
        .into_response()
}

async fn not_found() -> Response {
    error::PageError::NotFound("no such page".into()).into_response()
}

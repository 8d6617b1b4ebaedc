//! A lossy network between the platform and the merchant.

use super::protocol::error;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What happens to one request on its way through [`Faults`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Delivered, answered.
    Pass,
    /// The handler runs to completion (it commits), then the answer is held
    /// back longer than the platform waits: the platform sees a time-out,
    /// the merchant has booked the payment. The lost-response case.
    LoseResponse,
    /// The handler runs to completion, then a gateway answers 503 instead.
    UnavailableAfter,
    /// A gateway answers 503 without calling the handler.
    UnavailableBefore,
}

/// A fault injector in front of the service (for tests and the demo,
/// never production): a script of faults for the first requests, then
/// faults drawn at the given rates.
#[derive(Debug, Clone)]
pub struct Faults(Arc<FaultsInner>);

#[derive(Debug)]
struct FaultsInner {
    script: Vec<Fault>,
    lose_rate: f64,
    unavailable_rate: f64,
    hold: Duration,
    seed: u64,
    seen: AtomicU64,
    counts: [AtomicU64; 4],
}

impl Faults {
    /// The first requests meet `script`, in order; later ones pass. A lost
    /// response is held back for `hold` (make it longer than the platform's
    /// time-out).
    pub fn script(script: impl IntoIterator<Item = Fault>, hold: Duration) -> Self {
        Self::new(script.into_iter().collect(), 0.0, 0.0, hold, 0)
    }

    /// Each request independently: a lost response with probability
    /// `lose_rate`, a 503 after the handler ran with `unavailable_rate`
    /// (a deterministic sequence from `seed`).
    pub fn random(lose_rate: f64, unavailable_rate: f64, hold: Duration, seed: u64) -> Self {
        Self::new(Vec::new(), lose_rate, unavailable_rate, hold, seed)
    }

    fn new(script: Vec<Fault>, lose: f64, unavailable: f64, hold: Duration, seed: u64) -> Self {
        Faults(Arc::new(FaultsInner {
            script,
            lose_rate: lose,
            unavailable_rate: unavailable,
            hold,
            seed,
            seen: AtomicU64::new(0),
            counts: Default::default(),
        }))
    }

    /// Wraps `app` so that every request goes through this injector.
    pub fn wrap(&self, app: Router) -> Router {
        app.layer(axum::middleware::from_fn_with_state(self.clone(), inject))
    }

    /// How many requests met each fault: `[Pass, LoseResponse,
    /// UnavailableAfter, UnavailableBefore]`.
    pub fn counts(&self) -> [u64; 4] {
        let c = &self.0.counts;
        [0, 1, 2, 3].map(|i| c[i].load(Ordering::Relaxed))
    }

    fn next(&self) -> Fault {
        let i = self.0.seen.fetch_add(1, Ordering::Relaxed);
        if let Some(f) = self.0.script.get(i as usize) {
            return *f;
        }
        // splitmix64: a uniform draw in [0, 1) per request.
        let mut z = self
            .0
            .seed
            .wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let u = (z >> 11) as f64 / (1u64 << 53) as f64;
        if u < self.0.lose_rate {
            Fault::LoseResponse
        } else if u < self.0.lose_rate + self.0.unavailable_rate {
            Fault::UnavailableAfter
        } else {
            Fault::Pass
        }
    }
}

async fn inject(State(faults): State<Faults>, req: Request, next: Next) -> Response {
    let fault = faults.next();
    let index = match fault {
        Fault::Pass => 0,
        Fault::LoseResponse => 1,
        Fault::UnavailableAfter => 2,
        Fault::UnavailableBefore => 3,
    };
    faults.0.counts[index].fetch_add(1, Ordering::Relaxed);
    let unavailable = || {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "RETRY_LATER",
            "gateway unavailable",
        )
    };
    if fault == Fault::UnavailableBefore {
        return unavailable();
    }
    // The handler runs on its own task: it completes (and commits) even if
    // the platform hangs up while the answer is held back.
    let handled = tokio::spawn(next.run(req)).await;
    let response = match handled {
        Ok(r) => r,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", e.to_string()),
    };
    match fault {
        Fault::LoseResponse => {
            tokio::time::sleep(faults.0.hold).await;
            response
        }
        Fault::UnavailableAfter => unavailable(),
        _ => response,
    }
}

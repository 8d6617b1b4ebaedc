//! The simulated payment platforms' delivery: each attempt signed, pushed,
//! and retried.

use super::REPLAY_HEADER;
use super::notify::{Charge, Notification, PlatformKeys};
use idem_runtime::backoff::Backoff;
use std::time::Duration;

/// One attempt of a delivery, as the platform saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// An HTTP answer with this status.
    Status(u16),
    /// No answer within the platform's time-out.
    TimedOut,
    /// The connection failed (refused, reset, …).
    Failed(String),
}

/// A callback the merchant acknowledged with 200.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// Attempts made, the successful one included.
    pub attempts: u32,
    /// The final status: 200.
    pub status: u16,
    /// The final answer's body.
    pub body: String,
    /// Whether the final answer was a replay (`X-Idempotent-Replay: true`).
    pub replayed: bool,
    /// Every attempt, in order.
    pub history: Vec<Attempt>,
}

/// The platform gave up: no 200 within `1 + max_retries` attempts.
#[derive(Debug, Clone)]
pub struct GaveUp {
    /// Attempts made.
    pub attempts: u32,
    /// The last HTTP status received, if the last attempt got an answer.
    pub last_status: Option<u16>,
    /// The last answer's body, if any.
    pub last_body: Option<String>,
    /// Every attempt, in order.
    pub history: Vec<Attempt>,
}

impl std::fmt::Display for GaveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no 200 after {} attempts: {:?}",
            self.attempts, self.history
        )
    }
}

impl std::error::Error for GaveUp {}

/// The simulated third-party payment platforms (Stripe, Alipay, WeChat
/// Pay): each builds its notification of a [`Charge`] as that platform does
/// ([`Notification`]), signs each attempt with `keys` and the time of the
/// attempt, POSTs it to the merchant's route for that platform, and — the
/// platforms' retry policy — pushes it again after any answer that is not
/// 200, a time-out or a connection error, with exponential back-off, at
/// most `max_retries` more times.
#[derive(Debug, Clone)]
pub struct Platform {
    /// The merchant's base URL, e.g. `http://127.0.0.1:8080`.
    pub base_url: String,
    /// The platforms' signing keys.
    pub keys: PlatformKeys,
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// How long one attempt may take (connect and answer).
    pub timeout: Duration,
    /// The wait before the first retry; doubled for each further one
    /// (capped at 32 times).
    pub backoff: Duration,
}

impl Platform {
    /// The platforms calling `base_url` with the demo's keys: 5 retries,
    /// 2 s time-out, 100 ms back-off.
    pub fn new(base_url: impl Into<String>) -> Self {
        Platform {
            base_url: base_url.into(),
            keys: PlatformKeys::demo(),
            max_retries: 5,
            timeout: Duration::from_secs(2),
            backoff: Duration::from_millis(100),
        }
    }

    /// The notification of `charge`, as its platform builds it now.
    pub fn notification(&self, charge: &Charge) -> Notification {
        Notification::new(&self.keys, charge, unix_now())
    }

    /// Delivers the notification of `charge` until the merchant answers 200
    /// or the retries run out.
    pub async fn deliver(&self, charge: &Charge) -> Result<Delivered, GaveUp> {
        self.deliver_notification(&self.notification(charge)).await
    }

    /// Delivers `notification`: every attempt sends the same body, its
    /// headers signed anew with the time of the attempt where the platform
    /// signs one (Stripe, WeChat Pay).
    pub async fn deliver_notification(
        &self,
        notification: &Notification,
    ) -> Result<Delivered, GaveUp> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("an HTTP client without TLS builds");
        let base = self.base_url.trim_end_matches('/');
        let url = format!("{base}{}", notification.path);
        // The `k`-th retry waits `backoff · 2^(k-1)`, at most 32 times `backoff`.
        let backoff = Backoff::new(self.backoff, self.backoff.saturating_mul(32));
        let mut history = Vec::new();
        let (mut last_status, mut last_body) = (None, None);
        for attempt in 1..=self.max_retries.saturating_add(1) {
            if attempt > 1 {
                tokio::time::sleep(backoff.delay(attempt - 1)).await;
            }
            let mut req = client
                .post(&url)
                .timeout(self.timeout)
                .header(reqwest::header::CONTENT_TYPE, notification.content_type);
            for (name, value) in notification.headers(unix_now()) {
                req = req.header(name, value);
            }
            let sent = req.body(notification.body.clone()).send().await;
            // The answer's body is read under the same time-out.
            let answer = match sent {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let replayed = resp
                        .headers()
                        .get(REPLAY_HEADER)
                        .is_some_and(|v| v.as_bytes() == b"true");
                    resp.text().await.map(|text| (status, replayed, text))
                }
                Err(e) => Err(e),
            };
            match answer {
                Ok((status, replayed, text)) => {
                    history.push(Attempt::Status(status));
                    if status == 200 {
                        return Ok(Delivered {
                            attempts: attempt,
                            status,
                            body: text,
                            replayed,
                            history,
                        });
                    }
                    (last_status, last_body) = (Some(status), Some(text));
                }
                Err(e) => {
                    history.push(if e.is_timeout() {
                        Attempt::TimedOut
                    } else {
                        Attempt::Failed(e.to_string())
                    });
                    (last_status, last_body) = (None, None);
                }
            }
        }
        Err(GaveUp {
            attempts: history.len() as u32,
            last_status,
            last_body,
            history,
        })
    }
}

/// Now, in Unix seconds.
pub fn unix_now() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.map_or(0, |d| d.as_secs() as i64)
}

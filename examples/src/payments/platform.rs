//! The simulated payment platform: it signs, pushes, and retries.

use super::protocol::{Callback, verifier};
use super::{CALLBACK_PATH, REPLAY_HEADER};
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

/// A simulated third-party payment platform: it signs each callback with
/// the shared secret and the time of the attempt, POSTs it to the
/// merchant, and — its retry policy — pushes it again after any non-200
/// answer, a time-out or a connection error, with exponential back-off, at
/// most `max_retries` more times.
#[derive(Debug, Clone)]
pub struct Platform {
    /// The merchant's base URL, e.g. `http://127.0.0.1:8080`.
    pub base_url: String,
    /// The HMAC key shared with the merchant.
    pub secret: Vec<u8>,
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// How long one attempt may take (connect and answer).
    pub timeout: Duration,
    /// The wait before the first retry; doubled for each further one
    /// (capped at 32 times).
    pub backoff: Duration,
}

impl Platform {
    /// A platform calling `base_url`: 5 retries, 2 s time-out, 100 ms back-off.
    pub fn new(base_url: impl Into<String>, secret: impl Into<Vec<u8>>) -> Self {
        Platform {
            base_url: base_url.into(),
            secret: secret.into(),
            max_retries: 5,
            timeout: Duration::from_secs(2),
            backoff: Duration::from_millis(100),
        }
    }

    /// Delivers `callback` until the merchant answers 200 or the retries
    /// run out. Every attempt sends the same bytes, signed anew with the
    /// time of the attempt.
    pub async fn deliver(&self, callback: &Callback) -> Result<Delivered, GaveUp> {
        let body = serde_json::to_vec(callback).expect("a callback serializes");
        self.deliver_raw(body).await
    }

    /// Delivers a raw body, signed with this platform's secret (to send
    /// malformed callbacks in tests and demos).
    pub async fn deliver_raw(&self, body: Vec<u8>) -> Result<Delivered, GaveUp> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("an HTTP client without TLS builds");
        let url = format!("{}{CALLBACK_PATH}", self.base_url.trim_end_matches('/'));
        let signer = verifier(self.secret.clone());
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
                .header(reqwest::header::CONTENT_TYPE, "application/json");
            for (name, value) in signer.signed_headers(&body) {
                req = req.header(name, value);
            }
            let sent = req.body(body.clone()).send().await;
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

//! `strategy = record`: an idempotency record, unique per (biz_type, key),
//! written before the body and holding its result after it.

use crate::backend::{Backend, NewRecord};
use crate::call::{Booked, Call, Guarded, Strategy, replay_marker, replay_of};
use crate::error::{BoxError, Error};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Span;

/// The `record` strategy's parameters.
#[derive(Debug)]
pub struct Record {
    /// The business type stored with the record: the scope of its key.
    pub biz_type: &'static str,
    /// The business document number (defaults to the key).
    pub biz_no: Option<String>,
    /// Seconds until the record may be archived: 1 ..= [`MAX_TTL_SECS`].
    pub ttl_secs: i64,
    /// Hex SHA-256 of the canonical JSON of the payload.
    pub fingerprint: String,
}

/// The longest record ttl: 3650 days. Longer would reach past what the
/// databases store (MariaDB's year 9999) for no benefit.
pub const MAX_TTL_SECS: i64 = 3650 * 86_400;

impl Record {
    /// The bounds the macro checked at compile time, checked again.
    fn check(&self, key: &str) -> Result<(), Error> {
        let biz_no = self.biz_no.as_deref().unwrap_or(key);
        if self.biz_type.len() > 64 || biz_no.len() > 128 {
            return Err(Error::InvalidKey {
                key: key.to_owned(),
                reason: "biz_type must be at most 64 bytes and biz_no at most 128".into(),
            });
        }
        if !(1..=MAX_TTL_SECS).contains(&self.ttl_secs) {
            return Err(Error::Config {
                reason: format!(
                    "record ttl of {} s is out of bounds: 1 s ..= {MAX_TTL_SECS} s (3650 days)",
                    self.ttl_secs
                ),
            });
        }
        Ok(())
    }

    /// Stops the call's cache marker at this record's expiry as the
    /// call's transaction sees it (written by this call, or by the first
    /// one for a duplicate). Only asked when a marker will be written.
    async fn bound_marker<DB: Backend>(&self, call: &mut Call<'_, DB>) -> Result<(), Error> {
        if !call.state.writes_marker() {
            return Ok(());
        }
        let asked = std::time::Instant::now();
        let left = DB::record_ttl_left(call.state.tx.tx(), self.biz_type, &call.state.key)
            .await
            .map_err(Error::database)?;
        call.state.bound_marker(asked, left);
        Ok(())
    }
}

impl<DB: Backend, T: Serialize + DeserializeOwned> Strategy<DB, T> for Record {
    type Guard = ();

    const NAME: &'static str = "record";

    fn scope(&self) -> &'static str {
        self.biz_type
    }

    /// The stored result, only when the marker carries this call's payload
    /// fingerprint. A marker of another payload falls through to the
    /// database, which answers [`Error::KeyConflict`].
    fn cached(&self, marker: &str, span: &Span) -> Option<Option<T>> {
        let Some(text) = replay_of(marker, &self.fingerprint) else {
            crate::metrics::cache_mismatch();
            tracing::debug!(parent: span, "cache marker of another payload; asking the database");
            return None;
        };
        serde_json::from_str(text).ok().map(Some)
    }

    /// Writes the record before the body. Claimed: run the body. The key
    /// exists in this `biz_type` with the same fingerprint: a duplicate
    /// (the stored result, if the first call produced one). A different
    /// fingerprint is a [`Error::KeyConflict`].
    async fn guard(&self, call: &mut Call<'_, DB>) -> Result<Guarded<(), T>, Error> {
        self.check(&call.state.key)?;
        let row = NewRecord {
            key: &call.state.key,
            biz_type: self.biz_type,
            biz_no: self.biz_no.as_deref().unwrap_or(&call.state.key),
            fingerprint: &self.fingerprint,
            ttl_secs: self.ttl_secs,
        };
        if DB::claim_record(call.state.tx.tx(), &row)
            .await
            .map_err(Error::database)?
        {
            return Ok(Guarded::Run(()));
        }
        let stored =
            match DB::fetch_record(call.state.tx.tx(), self.biz_type, &call.state.key).await {
                Ok(Some(s)) => s,
                // Claim lost but no row: the other writer's row vanished between
                // the two statements (archived). Transient.
                Ok(None) => return Err(Error::retryable("idempotency record vanished")),
                Err(e) => return Err(Error::database(e)),
            };
        if stored.fingerprint != self.fingerprint {
            return Err(Error::KeyConflict {
                key: call.state.key.clone(),
            });
        }
        // The cache is re-warmed for what is left of the record's ttl, not
        // the cache's: an expired record (still answering here until it is
        // archived) gets no marker.
        self.bound_marker(call).await?;
        match stored.result {
            Some(text) => {
                let value = serde_json::from_str(&text).map_err(Error::Serialization)?;
                Ok(Guarded::Duplicate {
                    stored: Some(value),
                    marker: Some(replay_marker(&self.fingerprint, &text)),
                })
            }
            None => Ok(Guarded::Duplicate {
                stored: None,
                marker: None,
            }),
        }
    }

    /// Stores the body's serialized result in the record.
    async fn settle(
        &self,
        call: &mut Call<'_, DB>,
        (): (),
        body: Result<T, BoxError>,
    ) -> Result<Booked<T>, Error> {
        let value = body.map_err(Error::from_handler)?;
        let text = serde_json::to_string(&value).map_err(Error::Serialization)?;
        DB::store_result(call.state.tx.tx(), self.biz_type, &call.state.key, &text)
            .await
            .map_err(Error::database)?;
        // After the body, which runs in the same transaction.
        self.bound_marker(call).await?;
        Ok(Booked::Executed {
            value,
            marker: Some(replay_marker(&self.fingerprint, &text)),
        })
    }
}

//! What a call asks of its strategy: the contract ([`Strategy`]) and the
//! two answers it gives, before the body ([`Guarded`]) and after it
//! ([`Booked`]). It lives beside the call it drives, which calls it in
//! the protocol's order; the three implementations are in
//! `crate::strategy`, which depends on the call, never the reverse.

use super::Call;
use crate::backend::Backend;
use crate::error::{BoxError, Error};
use tracing::Span;

/// Seals [`Strategy`]: `crate::strategy` implements it for its three
/// strategies, and nothing outside the crate can.
pub(crate) mod sealed {
    pub trait Sealed {}
}

/// What a strategy's guard decided, before the body.
#[derive(Debug)]
pub enum Guarded<G, T> {
    /// A first delivery: run the body; `G` is what the bookkeeping after it
    /// needs.
    Run(G),
    /// The action already happened: commit and answer `Duplicate(stored)`,
    /// re-warming the front cache with `marker` (default: a plain marker).
    Duplicate {
        /// The stored result (record strategy), if any.
        stored: Option<T>,
        /// The cache marker to write after the commit.
        marker: Option<String>,
    },
}

/// What a strategy's bookkeeping made of the body's result.
#[derive(Debug)]
pub enum Booked<T> {
    /// The body's effects stand: commit, then write `marker` (default: a
    /// plain marker) to the front cache.
    Executed {
        /// The body's value.
        value: T,
        /// The cache marker to write after the commit.
        marker: Option<String>,
    },
    /// The body's error says the action already happened (`unique_insert`);
    /// its effects are undone, the rest of the call commits.
    Duplicate,
}

/// One strategy: what it checks before the body and records after it. Its
/// errors are returned as they are; [`Call`] records them on the call's
/// span and rolls back.
///
/// Sealed. `T` is the handler's `Ok` type; the record strategy needs it
/// `Serialize + DeserializeOwned`, the others need nothing of it.
// Not `Send`-bounded on purpose: the three implementations are concrete, so
// the futures' auto traits are those of what they hold (the handler's types).
#[allow(async_fn_in_trait)]
pub trait Strategy<DB: Backend, T>: sealed::Sealed {
    /// What the guard hands to the bookkeeping.
    type Guard;

    /// The strategy's name, in traces and metrics.
    const NAME: &'static str;

    /// Whether its guard can run the fenced outbox update itself, folded
    /// into its own first statement where the dialect allows (see
    /// `Call::mark_in_guard`): one round trip fewer per outbox message.
    const FOLDS_MARK: bool = false;

    /// What cache markers of this call are scoped by.
    fn scope(&self) -> &'static str;

    /// The answer a front cache marker of this call's key gives, if it
    /// answers: `Some(stored)` is a duplicate.
    fn cached(&self, marker: &str, span: &Span) -> Option<Option<T>>;

    /// Before the body, in the call's transaction (after the outbox
    /// update, or running it when [`Strategy::FOLDS_MARK`] and the call
    /// asks it to: `Call::mark_in_guard`).
    async fn guard(&self, call: &mut Call<'_, DB>) -> Result<Guarded<Self::Guard, T>, Error>;

    /// After the body, in the same transaction: what its result means.
    /// An `Err` rolls the call back.
    async fn settle(
        &self,
        call: &mut Call<'_, DB>,
        guard: Self::Guard,
        body: Result<T, BoxError>,
    ) -> Result<Booked<T>, Error>;
}

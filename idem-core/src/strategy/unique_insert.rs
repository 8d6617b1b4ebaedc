//! `strategy = unique_insert`: the body's own insert is the guard; a
//! violation of the action's unique constraint means Duplicate.

use crate::backend::Backend;
use crate::backend::classify::find_sqlx;
use crate::call::{Booked, Call, Guarded, Strategy};
use crate::error::{BoxError, Error};
use tracing::Span;

const SAVEPOINT: &str = "SAVEPOINT idem_unique_insert";
const ROLLBACK_TO: &str = "ROLLBACK TO SAVEPOINT idem_unique_insert";
const RELEASE: &str = "RELEASE SAVEPOINT idem_unique_insert";

/// The `unique_insert` strategy's parameters.
#[derive(Debug)]
pub struct UniqueInsert {
    /// What cache markers are scoped by: the handler's name.
    pub scope: &'static str,
    /// The unique constraint (or index) whose violation means Duplicate.
    pub constraint: &'static str,
}

impl<DB: Backend, T> Strategy<DB, T> for UniqueInsert {
    type Guard = ();

    const NAME: &'static str = "unique_insert";

    fn scope(&self) -> &'static str {
        self.scope
    }

    fn cached(&self, _marker: &str, _span: &Span) -> Option<Option<T>> {
        Some(None)
    }

    /// Opens the savepoint the body's insert runs under.
    async fn guard(&self, call: &mut Call<'_, DB>) -> Result<Guarded<(), T>, Error> {
        DB::exec(call.state.tx.tx(), SAVEPOINT)
            .await
            .map_err(Error::database)?;
        Ok(Guarded::Run(()))
    }

    /// A violation of `constraint` anywhere in the body's error is a
    /// duplicate (rolled back to the savepoint, the outer transaction
    /// commits); any other error, another unique violation included, rolls
    /// everything back.
    async fn settle(
        &self,
        call: &mut Call<'_, DB>,
        (): (),
        body: Result<T, BoxError>,
    ) -> Result<Booked<T>, Error> {
        let e = match body {
            Ok(value) => {
                DB::exec(call.state.tx.tx(), RELEASE)
                    .await
                    .map_err(Error::database)?;
                return Ok(Booked::Executed {
                    value,
                    marker: None,
                });
            }
            Err(e) => e,
        };
        let violation = find_sqlx(&*e).and_then(|s| match s {
            sqlx::Error::Database(d) if d.is_unique_violation() => Some(&**d),
            _ => None,
        });
        let Some(violation) = violation else {
            return Err(Error::from_handler(e));
        };
        DB::exec(call.state.tx.tx(), ROLLBACK_TO)
            .await
            .map_err(Error::database)?;
        let constraint = self.constraint;
        let hit = crate::unique::violated(DB::dialect(call.state.tx.tx_ref()), violation);
        match crate::unique::matches(&hit, constraint, call.state.tx.tx()).await {
            Ok(true) => Ok(Booked::Duplicate),
            Ok(false) => Err(Error::Handler {
                retryable: false,
                source: format!(
                    "unique violation of {hit}, not of the action's constraint \
                     `{constraint}`, so not a duplicate: {e}"
                )
                .into(),
            }),
            Err(db) => Err(Error::database(db)),
        }
    }
}

//! `strategy = state_machine`: the entity's own state is the guard.

use crate::backend::{Backend, StateSql};
use crate::call::{Booked, Call, Guarded, Strategy};
use crate::error::{BoxError, Error};
use crate::state::EntityIdValue;
use tracing::Span;

/// The `state_machine` strategy's parameters, as the attribute gave them.
#[derive(Debug)]
pub struct StateMachine {
    /// What cache markers are scoped by: the handler's name (a rename
    /// costs cache misses, never a double apply).
    pub scope: &'static str,
    /// The entity's table.
    pub table: &'static str,
    /// Its id column.
    pub id_column: &'static str,
    /// Its state column.
    pub state_column: &'static str,
    /// The column the transition writes the call's key into (`key_column`),
    /// binding the transition to the message that made it.
    pub key_column: Option<&'static str>,
    /// The entity id of this call.
    pub id: EntityIdValue,
    /// The state the transition starts from.
    pub from: &'static str,
    /// The state it ends in.
    pub to: &'static str,
}

impl StateMachine {
    /// Renders the statements for this call's database (identifiers checked
    /// again; the macro checked them at compile time).
    fn sql<DB: Backend>(&self, call: &Call<'_, DB>) -> Result<StateSql, Error> {
        for ident in [self.table, self.id_column, self.state_column]
            .into_iter()
            .chain(self.key_column)
        {
            if !idem_syntax::is_identifier(ident) {
                return Err(Error::permanent(format!(
                    "`{ident}` is not a valid SQL identifier"
                )));
            }
        }
        let dialect = DB::dialect(call.state.tx.tx_ref());
        Ok(dialect.state_sql(
            self.table,
            self.id_column,
            self.state_column,
            self.key_column,
        ))
    }

    fn illegal(&self, found: Option<String>) -> Error {
        Error::IllegalState {
            table: self.table,
            id: self.id.to_string(),
            found,
            expected: self.from,
        }
    }
}

impl<DB: Backend, T> Strategy<DB, T> for StateMachine {
    type Guard = StateSql;

    const NAME: &'static str = "state_machine";

    /// PostgreSQL: the fenced outbox update in the locking read's
    /// statement ([`StateSql::lock_marked`]).
    const FOLDS_MARK: bool = true;

    fn scope(&self) -> &'static str {
        self.scope
    }

    fn cached(&self, _marker: &str, _span: &Span) -> Option<Option<T>> {
        Some(None)
    }

    /// Reads the entity's state under a row lock. In `to`: a duplicate
    /// (with `key_column`, only when that column holds this call's key).
    /// In `from`: run the body. Any other state, no entity, or `to`
    /// reached under another key: an illegal-state error.
    async fn guard(&self, call: &mut Call<'_, DB>) -> Result<Guarded<StateSql, T>, Error> {
        let sql = self.sql(call)?;
        let found = call.state.lock_state(&sql, &self.id).await?;
        let duplicate = Guarded::Duplicate {
            stored: None,
            marker: None,
        };
        match found {
            Some((s, by)) if s == self.to => match (self.key_column, by) {
                (None, _) => Ok(duplicate),
                (Some(_), Some(k)) if k == call.state.key => Ok(duplicate),
                (Some(col), by) => {
                    let by = by.map_or_else(|| "NULL".to_string(), |k| format!("`{k}`"));
                    Err(self.illegal(Some(format!(
                        "{s}` under another key ({col} = {by}, this call's key is `{}`",
                        call.state.key
                    ))))
                }
            },
            Some((s, _)) if s == self.from => Ok(Guarded::Run(sql)),
            found => Err(self.illegal(found.map(|(s, _)| s))),
        }
    }

    /// The guarded transition must change exactly one row.
    async fn settle(
        &self,
        call: &mut Call<'_, DB>,
        sql: StateSql,
        body: Result<T, BoxError>,
    ) -> Result<Booked<T>, Error> {
        let value = body.map_err(Error::from_handler)?;
        let key = self.key_column.map(|_| call.state.key.as_str());
        match DB::transition(call.state.tx.tx(), &sql, &self.id, self.from, self.to, key).await {
            Ok(1) => Ok(Booked::Executed {
                value,
                marker: None,
            }),
            // The row was locked in `from`: only the body can have moved it
            // (or deleted it) since.
            Ok(_) => Err(self.illegal(Some(format!(
                "changed by the handler body (no longer `{}`)",
                self.from
            )))),
            Err(e) => Err(Error::database(e)),
        }
    }
}

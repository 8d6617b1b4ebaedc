//! `strategy = state_machine`: the entity's own state is the guard.

use crate::backend::{Backend, Dialect, StateSql};
use crate::call::{Booked, Call, Guarded, Strategy};
use crate::error::{BoxError, Error};
use crate::state::EntityIdValue;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};
use tracing::Span;

/// A state machine spec on one dialect: the dialect, table, id column,
/// state column and key column.
type Spec = (
    Dialect,
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
);

/// The statements of each spec seen in this process (one entry per
/// `#[idempotent]` state machine and dialect: the attributes' own strings).
static RENDERED: LazyLock<RwLock<HashMap<Spec, Arc<StateSql>>>> = LazyLock::new(Default::default);

/// The statements of `spec`: rendered, and their identifiers checked
/// again (the macro checked them at compile time), once per spec in a
/// process, then shared by every call (rendering them on every call cost
/// about 30,000 instructions per message on PostgreSQL and 17,000 on
/// SQLite, callgrind on the coupon relay). A spec whose identifiers fail
/// the check is never kept: each call fails alike.
fn rendered(spec: Spec) -> Result<Arc<StateSql>, Error> {
    if let Some(sql) = RENDERED
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(&spec)
    {
        return Ok(sql.clone());
    }
    let (dialect, table, id, state, key) = spec;
    for ident in [table, id, state].into_iter().chain(key) {
        if !idem_syntax::is_identifier(ident) {
            return Err(Error::permanent(format!(
                "`{ident}` is not a valid SQL identifier"
            )));
        }
    }
    let sql = Arc::new(dialect.state_sql(table, id, state, key));
    RENDERED
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(spec, sql.clone());
    Ok(sql)
}

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
    /// The statements for this call's database (see [`rendered`]).
    fn sql<DB: Backend>(&self, call: &Call<'_, DB>) -> Result<Arc<StateSql>, Error> {
        rendered((
            DB::dialect(call.state.tx.tx_ref()),
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
    type Guard = Arc<StateSql>;

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
    async fn guard(&self, call: &mut Call<'_, DB>) -> Result<Guarded<Arc<StateSql>, T>, Error> {
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
        sql: Arc<StateSql>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_is_rendered_once_and_shared() {
        let spec = (Dialect::Sqlite, "sm_cache_t", "id", "status", Some("k"));
        let first = rendered(spec).unwrap();
        let again = rendered(spec).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(
            first.transition,
            Dialect::Sqlite
                .state_sql("sm_cache_t", "id", "status", Some("k"))
                .transition
        );
        // Another dialect, or another column, is another spec.
        let pg = rendered((Dialect::Postgres, "sm_cache_t", "id", "status", Some("k"))).unwrap();
        assert!(!Arc::ptr_eq(&first, &pg));
        assert!(pg.lock_marked.is_some() && first.lock_marked.is_none());
        let other = rendered((Dialect::Sqlite, "sm_cache_t", "id", "state", Some("k"))).unwrap();
        assert!(other.lock.contains("state") && !Arc::ptr_eq(&first, &other));
    }

    #[test]
    fn a_bad_identifier_fails_every_call() {
        let spec = (Dialect::Sqlite, "t; DROP TABLE x", "id", "status", None);
        for _ in 0..2 {
            let err = rendered(spec).unwrap_err();
            let err = format!("{err:#}");
            assert!(err.contains("is not a valid SQL identifier"), "{err}");
        }
        assert!(!RENDERED.read().unwrap().contains_key(&spec));
    }
}

//! The three ways to tell a first delivery from a duplicate, as the
//! parameters the attribute gives them ([`StateMachine`], [`Record`],
//! [`UniqueInsert`]) and what each does before and after the body. The
//! contract they implement ([`Strategy`](crate::call::Strategy)) and the
//! order of the protocol around them are
//! [`Call`](crate::call::Call)'s.

mod record;
mod state_machine;
mod unique_insert;

pub use record::{MAX_TTL_SECS, Record};
pub use state_machine::StateMachine;
pub use unique_insert::UniqueInsert;

use crate::call::Sealed;

// The only strategies (`Strategy` is sealed).
impl Sealed for StateMachine {}
impl Sealed for Record {}
impl Sealed for UniqueInsert {}

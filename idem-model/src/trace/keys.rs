//! The head rule of ordering keys across the messages of a trace: a
//! keyed message claimed only when every earlier message of its key is
//! settled and no other is in flight.

use super::relay::token;
use crate::KeyMode;
use crate::state::{Round, State, Status};

/// Why message `n` (a candidate state `s` of its projection, whose claims
/// are `owners`) keeps message `m` of the same key from being claimed, if
/// it does.
pub(super) fn blocks(
    s: &State,
    owners: &[String],
    n: i64,
    m: i64,
    mode: KeyMode,
) -> Option<String> {
    let row = s.db.rows[0];
    if n < m {
        match row.status {
            Status::Pending => {
                return Some(format!(
                    "message {n}, before it in its key, is not settled yet (still pending)"
                ));
            }
            Status::Failed if mode == KeyMode::Hold => {
                return Some(format!(
                    "message {n}, before it in its key, is dead-lettered and the key is held \
                     behind it (KeyMode::Hold)"
                ));
            }
            _ => {}
        }
    }
    if row.status != Status::Pending {
        return None;
    }
    let holder = (0..s.relays.len()).find(|&x| {
        s.relays[x].round != Round::Idle
            && token(s, x).is_some_and(|(_, a)| row.held_by(x as u8, a))
    })?;
    Some(format!(
        "message {n} of its key is in flight (held by its claim {}, attempt {})",
        owners[holder], row.attempts
    ))
}

//! The scenarios: the ways an action's calls arrive.

/// A way the calls of an action arrive. Each scenario runs on actions of
/// its own (distinct inputs), then counts every action's effect.
///
/// The first four call the handler directly ([`ActsOnce::call`](crate::ActsOnce::call));
/// the last two deliver each action as an outbox message through real
/// relays ([`ActsOnce::route`](crate::ActsOnce::route)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Scenario {
    /// One call per action, no fault: the baseline, and how many commits
    /// a call makes (where the other scenarios inject their faults). Always
    /// runs first.
    Single,
    /// `duplicates` calls of each action side by side, the first commit
    /// among them held for `hold` (its locks kept) so that the others
    /// overlap it: a duplicate check outside the transaction lets more
    /// than one through.
    ConcurrentDuplicates,
    /// Each action's call loses the acknowledgement of one of its commits
    /// (the first for the first action, the second for the second, … round
    /// the commits a call makes): the commit happens, the caller does not
    /// learn it; then the call is retried.
    LostAcks,
    /// Each action's call is cancelled at one of its commits (chosen as for
    /// `LostAcks`), after its statements: the commit does not happen; then
    /// the call is retried.
    Cancelled,
    /// Each action's message is claimed by a relay that dies while its
    /// handler runs: after the handler's transaction committed (the first,
    /// third, … action) or with its commit cut (the second, fourth, …),
    /// before the relay records anything. The dead relay's lease is then
    /// expired and a new relay drains the topic.
    RelayRestarted,
    /// Each action's message is claimed by relay A, whose lease runs out
    /// before A's handler starts (a stalled process); relay B reclaims it,
    /// and both handlers then run side by side, the first commit held for
    /// `hold`: the old owner's handler must not act once the message is
    /// someone else's.
    LeaseExpired,
}

impl Scenario {
    /// Every scenario, in the order a run takes them.
    pub const ALL: [Scenario; 6] = [
        Scenario::Single,
        Scenario::ConcurrentDuplicates,
        Scenario::LostAcks,
        Scenario::Cancelled,
        Scenario::RelayRestarted,
        Scenario::LeaseExpired,
    ];

    /// The scenarios that call the handler directly (they need
    /// [`ActsOnce::call`](crate::ActsOnce::call)).
    pub const CALLS: [Scenario; 4] = [
        Scenario::Single,
        Scenario::ConcurrentDuplicates,
        Scenario::LostAcks,
        Scenario::Cancelled,
    ];

    /// The scenarios that deliver through relays (they need
    /// [`ActsOnce::route`](crate::ActsOnce::route) and
    /// [`ActsOnce::enqueue`](crate::ActsOnce::enqueue)).
    pub const RELAY: [Scenario; 2] = [Scenario::RelayRestarted, Scenario::LeaseExpired];

    /// Its name in messages and reports.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Single => "single calls",
            Scenario::ConcurrentDuplicates => "concurrent duplicates",
            Scenario::LostAcks => "lost commit acknowledgements",
            Scenario::Cancelled => "cancelled before commit",
            Scenario::RelayRestarted => "relay restarted mid-drain",
            Scenario::LeaseExpired => "lease expired under a slow handler",
        }
    }

    /// Whether it delivers through relays rather than calling the handler.
    pub fn through_relay(self) -> bool {
        Scenario::RELAY.contains(&self)
    }
}

//! The scenarios: the ways an action's calls arrive.

/// A way the calls of an action arrive. Each scenario runs on actions of
/// its own (distinct inputs), then counts every action's effect.
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
}

impl Scenario {
    /// Every scenario, in the order a run takes them.
    pub const ALL: [Scenario; 4] = [
        Scenario::Single,
        Scenario::ConcurrentDuplicates,
        Scenario::LostAcks,
        Scenario::Cancelled,
    ];

    /// Its name in messages and reports.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Single => "single calls",
            Scenario::ConcurrentDuplicates => "concurrent duplicates",
            Scenario::LostAcks => "lost commit acknowledgements",
            Scenario::Cancelled => "cancelled before commit",
        }
    }
}

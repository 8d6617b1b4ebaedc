//! What an idempotent call did.

/// What an idempotent call did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Outcome<T> {
    /// The body ran and its effects committed; here is its value.
    Executed(T),
    /// The action had already happened: the body did not run and nothing
    /// changed. This is a success. The `record` strategy returns the
    /// stored result of the call that executed; the others return `None`.
    Duplicate(Option<T>),
}

impl<T> Outcome<T> {
    /// True for [`Outcome::Duplicate`].
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate(_))
    }

    /// True for [`Outcome::Executed`].
    pub fn is_executed(&self) -> bool {
        matches!(self, Outcome::Executed(_))
    }

    /// The value: the body's for `Executed`, the stored one for a replayed
    /// `Duplicate`.
    pub fn into_value(self) -> Option<T> {
        match self {
            Outcome::Executed(v) => Some(v),
            Outcome::Duplicate(v) => v,
        }
    }
}

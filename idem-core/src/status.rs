//! The status of an outbox message, as its `status` column stores it. A
//! leaf, like `lease.rs`.

/// Status of an outbox message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Waiting to be delivered (or re-delivered).
    Pending,
    /// Delivered: the handler's transaction committed.
    Success,
    /// Dead-lettered, with its reason in `last_error`.
    Failed,
}

impl Status {
    /// The text stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Success => "success",
            Status::Failed => "failed",
        }
    }
}

impl Status {
    /// The status stored as `text`, if it is one.
    pub fn parse(text: &str) -> Option<Status> {
        match text {
            "pending" => Some(Status::Pending),
            "success" => Some(Status::Success),
            "failed" => Some(Status::Failed),
            _ => None,
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

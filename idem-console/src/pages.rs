//! The HTML pages, one module each.

pub(crate) mod archive;
pub(crate) mod login;
pub(crate) mod messages;
pub(crate) mod overview;
pub(crate) mod records;
pub(crate) mod requeue;

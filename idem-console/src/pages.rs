//! The HTML pages, one module each.

pub(crate) mod actions;
pub(crate) mod archive;
pub(crate) mod login;
pub(crate) mod lookup;
pub(crate) mod message;
pub(crate) mod messages;
pub(crate) mod overview;
pub(crate) mod processes;
pub(crate) mod records;
pub(crate) mod requeue;
pub(crate) mod topics;

//! Who is asking, as a page shows it: whether the console can change
//! anything, and whether the person asking is signed in to.
//! [`Auth::viewer`](crate::auth::Auth::viewer) finds it from a request;
//! the frame of every page ([`layout::page`](crate::layout::page)) and
//! the forms show it.

/// What the person asking may do, for the page to show.
#[derive(Debug, Clone)]
pub(crate) struct Viewer {
    /// The console has a write token.
    pub(crate) writable: bool,
    /// Signed in: the CSRF token its forms carry.
    pub(crate) csrf: Option<String>,
}

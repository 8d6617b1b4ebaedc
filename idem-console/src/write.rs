//! What every state-changing POST shares (requeue, retry now, discard,
//! pause, resume): the gate it passes first ([`authorize`]: the write
//! token, the same origin, the CSRF token, a refusal counted in
//! `idem_console_refused_writes_total`), and the controls a page offers
//! its viewer in place of a write form it may not use ([`controls`]).

use crate::Inner;
use crate::error::PageError;
use crate::mount::Mount;
use crate::params::query_string;
use crate::throttle::Client;
use crate::viewer::Viewer;
use axum::http::HeaderMap;
use idem_runtime::Operable;
use maud::{Markup, html};

/// Lets a write through or refuses it (counted): see
/// [`Auth::authorize`](crate::auth::Auth::authorize). Let through: who
/// sent it, as the audit log and the attempt log name it
/// ([`Auth::actor`](crate::auth::Auth::actor)).
pub(crate) fn authorize<DB: Operable>(
    c: &Inner<DB>,
    headers: &HeaderMap,
    csrf: Option<&str>,
    client: Client,
) -> Result<String, PageError> {
    if let Err(refused) = c.auth.authorize(headers, csrf, client, &c.site) {
        metrics::counter!("idem_console_refused_writes_total").increment(1);
        return Err(refused);
    }
    Ok(c.auth.actor(headers, client))
}

/// The write forms `forms` makes with the viewer's CSRF token, when the
/// viewer is signed in; else a link to sign in and come back to `here`
/// (the console's path of the page, with its query), or the note that
/// the console is read-only. `what`: what the forms do, for the notes
/// ("to discard or retry it").
pub(crate) fn controls(
    mount: &Mount,
    viewer: &Viewer,
    here: &str,
    what: &str,
    forms: impl FnOnce(&str) -> Markup,
) -> Markup {
    if let Some(csrf) = viewer.csrf.as_ref().filter(|_| viewer.writable) {
        return forms(csrf);
    }
    let login = format!(
        "{}?{}",
        mount.url("/login"),
        query_string([("next", here.to_string())])
    );
    html! {
        @if viewer.writable {
            p.note #need-sign-in { a href=(login) { "Sign in with the write token" } " " (what) "." }
        } @else {
            p.note #read-only { "This console is read-only (started without a write token): nothing can be changed from here." }
        }
    }
}

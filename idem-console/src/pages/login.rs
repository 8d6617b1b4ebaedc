//! `/login` and `/logout`: a browser signs in with the write token once and
//! then holds a signed session cookie (`HttpOnly`, `SameSite=Strict`);
//! signing out ends the session on the server, so a copy of the cookie is
//! refused too. Wrong tokens put their client in a back-off
//! ([`crate::throttle`]).

use crate::auth::{Auth, same_origin};
use crate::error::PageError;
use crate::params::Params;
use crate::throttle::Client;
use crate::{Shared, layout};
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idem_runtime::Operable;
use maud::html;

/// Where to go after signing in: a path of this console only (no
/// `//host`, no scheme, no `.` or `..` segment that would climb out of
/// the mount's prefix), else the overview; without the prefix, which the
/// redirect adds.
fn safe_next(next: Option<&str>) -> String {
    let climbs = |n: &str| {
        let path = n.split(['?', '#']).next().unwrap_or("");
        path.split('/').any(|seg| {
            let seg = seg.to_ascii_lowercase();
            seg == "." || seg == ".." || seg.contains("%2e") || seg.contains("%2f")
        })
    };
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.contains('\\')
                && !n.chars().any(char::is_control)
                && !climbs(n) =>
        {
            n.to_string()
        }
        _ => "/".into(),
    }
}

/// The sign-in form, with `error` above it when an attempt was refused
/// (answered with `status`).
fn form<DB: Operable>(
    c: &Shared<DB>,
    headers: &HeaderMap,
    next: &str,
    error: Option<&str>,
    status: StatusCode,
) -> Response {
    let viewer = c.auth.viewer(headers);
    let body = html! {
        h1 { "Sign in" }
        @if !viewer.writable {
            p.error #read-only { "This console is read-only: it was started without a write token, so there is nothing to sign in to." }
        } @else {
            @if let Some(e) = error { p.error #login-error { (e) } }
            form method="post" action=(c.mount.url("/login")) #login {
                input type="hidden" name="next" value=(next);
                label { "Write token " input type="password" name="token" #token autocomplete="off" required; }
                " " button type="submit" #sign-in-submit { "Sign in" }
            }
            p.note { "The token is the one the console was started with (idem serve --write-token, or IDEM_WRITE_TOKEN). It is kept in no cookie: the session cookie is signed by the console and ends when you sign out or the console restarts." }
        }
    };
    (status, layout::page(&c.mount, "Sign in", "", &viewer, body)).into_response()
}

pub(crate) async fn form_page<DB: Operable>(
    State(c): State<Shared<DB>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Response {
    let p = Params::query(q.as_deref());
    form(
        &c,
        &headers,
        &safe_next(p.get("next")),
        None,
        StatusCode::OK,
    )
}

pub(crate) async fn login<DB: Operable>(
    State(c): State<Shared<DB>>,
    client: Client,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, PageError> {
    if !c.auth.writable() {
        return Err(PageError::Forbidden(
            "this console is read-only: there is nothing to sign in to".into(),
        ));
    }
    same_origin(&headers, &c.site)?;
    let p = Params::body(&body);
    let next = safe_next(p.get("next"));
    // The token holds no spaces: ones pasted around it are dropped.
    let token = p.get("token").map_or("", str::trim);
    match c.auth.check_token(token, client) {
        Ok(true) => {}
        Ok(false) => {
            metrics::counter!("idem_console_refused_writes_total").increment(1);
            let error = Some("Wrong write token.");
            return Ok(form(&c, &headers, &next, error, StatusCode::FORBIDDEN));
        }
        Err(PageError::TooManyRequests {
            message,
            retry_after,
        }) => {
            let status = StatusCode::TOO_MANY_REQUESTS;
            let mut r = form(&c, &headers, &next, Some(&message), status);
            r.headers_mut()
                .insert(header::RETRY_AFTER, retry_after.into());
            return Ok(r);
        }
        Err(other) => return Err(other),
    }
    let cookie = Auth::set_cookie(&c.auth.new_session(), &c.mount.cookie_path());
    Ok((
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, cookie),
            (header::LOCATION, c.mount.url(&next)),
        ],
    )
        .into_response())
}

pub(crate) async fn logout<DB: Operable>(
    State(c): State<Shared<DB>>,
    client: Client,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, PageError> {
    let p = Params::body(&body);
    c.auth.authorize(&headers, p.get("csrf"), client, &c.site)?;
    // Ended here, not only in this browser: a copy of its cookie is
    // refused from now on.
    if let Some(session) = c.auth.session(&headers) {
        c.auth.end_session(&session);
    }
    Ok((
        StatusCode::SEE_OTHER,
        [
            (
                header::SET_COOKIE,
                Auth::clear_cookie(&c.mount.cookie_path()),
            ),
            (header::LOCATION, c.mount.url("/")),
        ],
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn next_stays_on_the_console() {
        use super::safe_next;
        assert_eq!(safe_next(Some("/requeue?id=3")), "/requeue?id=3");
        assert_eq!(safe_next(Some("//evil.test/")), "/");
        assert_eq!(safe_next(Some("https://evil.test/")), "/");
        assert_eq!(safe_next(Some("/\\evil.test")), "/");
        assert_eq!(safe_next(None), "/");
        // Under a prefix, `..` would lead out of it.
        assert_eq!(safe_next(Some("/../app/admin")), "/");
        assert_eq!(safe_next(Some("/requeue/./x")), "/");
        assert_eq!(safe_next(Some("/%2e%2E/app")), "/");
        assert_eq!(safe_next(Some("/a%2fb")), "/");
        assert_eq!(
            safe_next(Some("/records?key=a/../b")),
            "/records?key=a/../b",
            "the query is no path"
        );
    }
}

//! The frame every page shares: head, navigation, who is signed in.

use crate::mount::Mount;
use crate::viewer::Viewer;
use axum::response::Html;
use maud::{DOCTYPE, Markup, html};

/// The navigation's entries: path, label.
const NAV: &[(&str, &str)] = &[
    ("/", "Overview"),
    ("/messages", "Messages"),
    ("/dead-letters", "Dead letters"),
    ("/topics", "Topics"),
    ("/processes", "Processes"),
    ("/records", "Records"),
    ("/lookup", "Requests"),
    ("/archive", "Archiving"),
    ("/metrics", "Metrics"),
];

fn head(mount: &Mount, title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · idem" }
            link rel="stylesheet" href=(mount.url("/static/console.css"));
            script src=(mount.url("/static/console.js")) defer {}
        }
    }
}

/// A full page: `active` is the navigation entry it belongs to (the
/// console's path, without the mount's prefix).
/// Its links are under `mount`.
pub(crate) fn page(
    mount: &Mount,
    title: &str,
    active: &str,
    viewer: &Viewer,
    body: Markup,
) -> Html<String> {
    let doc = html! {
        (DOCTYPE)
        html lang="en" {
            (head(mount, title))
            body {
                header.top {
                    span.brand { "idem" }
                    nav {
                        @for (path, label) in NAV {
                            a href=(mount.url(path)) class=[(*path == active).then_some("active")] { (label) }
                        }
                    }
                    span.who #who {
                        @if !viewer.writable {
                            span.badge.ro #mode { "read-only" }
                        } @else if let Some(csrf) = &viewer.csrf {
                            span.badge.rw #mode { "write access" }
                            form.inline method="post" action=(mount.url("/logout")) {
                                input type="hidden" name="csrf" value=(csrf);
                                button type="submit" { "Sign out" }
                            }
                        } @else {
                            span.badge #mode { "read (signed out)" }
                            a #sign-in href=(mount.url("/login")) { "Sign in to write" }
                        }
                    }
                }
                main { (body) }
            }
        }
    };
    Html(doc.into_string())
}

/// A page without navigation state (errors).
pub(crate) fn bare(mount: &Mount, title: &str, body: Markup) -> Html<String> {
    let doc = html! {
        (DOCTYPE)
        html lang="en" {
            (head(mount, title))
            body { main { (body) } }
        }
    };
    Html(doc.into_string())
}

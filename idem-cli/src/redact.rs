//! Database URLs as messages show them: read by a URL parser (the `url`
//! crate, which sqlx reads PostgreSQL and MySQL URLs with too), the
//! passwords hidden.

use url::Url;

/// What stands for a hidden value.
const HIDDEN: &str = "***";

/// What stands for a URL the parser does not read: echoing it could print
/// a password it failed to find.
pub(crate) const UNPARSABLE: &str = "<unparsable URL>";

/// `url` with its passwords hidden, for messages: the password of the
/// userinfo (`user:***@host`, however it is escaped and even with an
/// unescaped `@` in it: the parser splits at the last one) and the value
/// of every query parameter that may hold a secret (`password`,
/// `sslpassword`, `passwd`, `pwd`, `token`, `secret`, `…key`). A URL
/// without any is shown as given (`postgres://app@db/orders`); one the
/// parser does not read, or whose userinfo a `/`, `?` or `#` in the
/// password cut short (an `@` left after the host), is shown as
/// [`UNPARSABLE`]. A SQLite URL is a file path, not read by the parser
/// (sqlx does not either): shown as given but for its query's secrets
/// (`sqlite://my db.db`, `sqlite::memory:`).
pub(crate) fn redact(url: &str) -> String {
    if url
        .get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("sqlite:"))
    {
        return match url.split_once('?') {
            Some((path, query)) => format!("{path}?{}", hide_secrets(query).0),
            None => url.to_string(),
        };
    }
    let Ok(mut parsed) = Url::parse(url) else {
        return UNPARSABLE.to_string();
    };
    if ambiguous(&parsed) {
        return UNPARSABLE.to_string();
    }
    let mut hidden = false;
    if parsed.password().is_some() {
        if parsed.set_password(Some(HIDDEN)).is_err() {
            return UNPARSABLE.to_string();
        }
        hidden = true;
    }
    if let Some(query) = parsed.query() {
        let (query, secrets) = hide_secrets(query);
        if secrets {
            parsed.set_query(Some(&query));
            hidden = true;
        }
    }
    if hidden {
        parsed.to_string()
    } else {
        url.to_string()
    }
}

/// Whether an `@` shows up where the parser did not look for a password:
/// in a URL without a host (`user:pass@host` with no scheme reads as the
/// scheme `user`), in the path or fragment, or in a query parameter's
/// name: a `/`, `#` or `?` in an unescaped password ended the userinfo
/// early (`postgres://u:12/ss@host` reads as host `u`, port 12).
fn ambiguous(url: &Url) -> bool {
    let at = |s: Option<&str>| s.is_some_and(|s| s.contains('@'));
    let in_names = url.query().is_some_and(|q| {
        q.split('&')
            .any(|pair| pair.split_once('=').map_or(pair, |(k, _)| k).contains('@'))
    });
    (!url.has_host() && url.as_str().contains('@'))
        || url.path().contains('@')
        || at(url.fragment())
        || in_names
}

/// The query with the values of its secret parameters hidden (the other
/// pairs as written), and whether there were any.
fn hide_secrets(query: &str) -> (String, bool) {
    let mut any = false;
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| {
            let raw_name = pair.split_once('=').map_or(pair, |(k, _)| k);
            let name: String = url::form_urlencoded::parse(raw_name.as_bytes())
                .map(|(k, _)| k.into_owned())
                .collect();
            if secret(&name) {
                any = true;
                format!("{raw_name}={HIDDEN}")
            } else {
                pair.to_string()
            }
        })
        .collect();
    (pairs.join("&"), any)
}

/// Whether a query parameter of this name may hold a secret: libpq's
/// `password` and `sslpassword`, and their likes.
fn secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "pwd", "secret", "token"]
        .iter()
        .any(|s| name.contains(s))
        || name.ends_with("key")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts that `secret` appears nowhere in the redacted `url`, and
    /// that it redacts to `shown`.
    fn check(url: &str, secret: &str, shown: &str) {
        let r = redact(url);
        assert!(!r.contains(secret), "{url:?} → {r:?} shows {secret:?}");
        assert_eq!(r, shown, "{url:?}");
    }

    #[test]
    fn the_userinfo_password_is_hidden() {
        check(
            "postgres://u:secret@h:5432/db",
            "secret",
            "postgres://u:***@h:5432/db",
        );
        check(
            "mysql://root:s3cret@127.0.0.1:3306/test?ssl-mode=disabled",
            "s3cret",
            "mysql://root:***@127.0.0.1:3306/test?ssl-mode=disabled",
        );
        // Percent-encoded: neither the encoded nor the decoded text.
        check(
            "postgres://u:p%40ss%2Fw0rd@h/db",
            "w0rd",
            "postgres://u:***@h/db",
        );
    }

    #[test]
    fn a_password_with_an_unescaped_at_is_hidden_whole() {
        // The parser splits at the last `@`: the password is `p@ss`.
        check(
            "postgres://u:p@ss@host/db",
            "ss",
            "postgres://u:***@host/db",
        );
        check(
            "postgres://u:p@ss@host/db",
            "p@",
            "postgres://u:***@host/db",
        );
        check(
            "mysql://root:a@b@c@h/test",
            "a@b",
            "mysql://root:***@h/test",
        );
    }

    #[test]
    fn query_passwords_are_hidden() {
        check(
            "postgres://app@db/orders?password=s3cret",
            "s3cret",
            "postgres://app@db/orders?password=***",
        );
        check(
            "postgres://app@db/orders?sslmode=verify-full&sslpassword=k3y&application_name=idem",
            "k3y",
            "postgres://app@db/orders?sslmode=verify-full&sslpassword=***&application_name=idem",
        );
        // Both at once, the name in any case, percent-encoded.
        for secret in ["one", "two", "three"] {
            check(
                "postgres://u:one@db/orders?PASSWORD=two&pass%77ord=three",
                secret,
                "postgres://u:***@db/orders?PASSWORD=***&pass%77ord=***",
            );
        }
    }

    #[test]
    fn a_url_without_a_password_is_shown_as_given() {
        for url in [
            "mysql://root@h/db",
            "postgres://postgres@127.0.0.1:5432/test",
            "sqlite:///tmp/a.db",
            "sqlite://data/app.db?mode=rwc",
            "sqlite://my db.db",
            "sqlite::memory:",
            "sqlite:app.db",
        ] {
            assert_eq!(redact(url), url);
        }
        check(
            "sqlite://data/app.db?mode=rwc&key=s3cret",
            "s3cret",
            "sqlite://data/app.db?mode=rwc&key=***",
        );
    }

    #[test]
    fn an_unparsable_url_is_not_echoed() {
        for url in [
            // A `#`, `/` or `?` in an unescaped password: no password found.
            "postgres://u:pa#ss@host/db",
            "postgres://u:12#ss@host/db",
            "postgres://u:12/ss@host/db",
            "postgres://u:12?ss@host/db",
            "postgres://u:pa/ss@host/db",
            // No scheme: `u` would be read as one.
            "u:secret@host/db",
            "not a url with secret",
            "",
        ] {
            assert_eq!(redact(url), UNPARSABLE, "{url:?}");
        }
    }
}

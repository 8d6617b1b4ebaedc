//! What the console's test targets share (`http.rs`, `browser.rs`, …): a
//! database of the test's own on each backend (SQLite always, PostgreSQL
//! and MariaDB when reachable: skipped locally when down, a failure when
//! `CI=true`), outbox rows, a console served on a free port, reading
//! values out of its pages, and an HTTP client that signs in.
#![allow(dead_code)]

pub(crate) use idem_console::Console;
pub(crate) use idem_runtime::Backend;
pub(crate) use idem_runtime::Dialect;
pub(crate) use idem_testkit::{
    any, database_url, mysql_database, mysql_url, postgres_database, postgres_url, sql,
};
pub(crate) use sqlx::{Any, AnyPool, Row};

/// A database of the test's own, emptied, through `sqlx::Any` (what
/// `idem serve` uses).
pub(crate) struct Db {
    pub(crate) url: String,
    pub(crate) pool: AnyPool,
    pub(crate) d: Dialect,
}

/// SQLite (a fresh file), and the PostgreSQL and MariaDB databases named
/// `idem_console_<test>` (created when missing, emptied).
pub(crate) async fn databases(test: &str) -> Vec<Db> {
    let name = format!("idem_console_{test}");
    let mut urls = vec![idem_testkit::sqlite_url()];
    if let Some(pool) = postgres_database(&name, 1).await {
        pool.close().await;
        urls.push(database_url(&postgres_url(), &name));
    }
    if let Some(pool) = mysql_database(&name, 1).await {
        pool.close().await;
        urls.push(database_url(&mysql_url(), &name));
    }
    let mut out = Vec::new();
    for url in urls {
        let pool = any(&url, 4).await.expect("the database was just reached");
        for table in [
            "idem_outbox",
            "idem_outbox_history",
            "idem_record",
            "idem_record_history",
            "idem_outbox_attempt",
            "idem_topic_pause",
            "idem_process",
        ] {
            sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table}")))
                .execute(&pool)
                .await
                .expect("empty the table");
        }
        let d = <Any as Backend>::pool_dialect(&pool);
        out.push(Db { url, pool, d });
    }
    out
}

impl Db {
    /// Inserts an outbox message; returns its id.
    pub(crate) async fn message(
        &self,
        topic: &str,
        msg_id: &str,
        status: &str,
        attempts: i64,
        last_error: Option<&str>,
    ) -> i64 {
        sqlx::query(sql(
            self.d,
            "INSERT INTO idem_outbox (topic, msg_id, payload, status, attempts, last_error) \
             VALUES (?, ?, '{}', ?, ?, ?)",
        ))
        .bind(topic)
        .bind(msg_id)
        .bind(status)
        .bind(attempts)
        .bind(last_error)
        .execute(&self.pool)
        .await
        .expect("insert outbox row");
        sqlx::query_scalar(sql(
            self.d,
            "SELECT id FROM idem_outbox WHERE topic = ? AND msg_id = ?",
        ))
        .bind(topic)
        .bind(msg_id)
        .fetch_one(&self.pool)
        .await
        .expect("its id")
    }

    /// `COUNT(*)` of a query on the database (bound values as given).
    pub(crate) async fn count(&self, query: &'static str, binds: &[&str]) -> i64 {
        let text = sql(self.d, query);
        let mut q = sqlx::query_scalar::<_, i64>(text);
        for b in binds {
            q = q.bind(*b);
        }
        q.fetch_one(&self.pool).await.expect("count")
    }

    /// `(id, status, attempts, last_error)` of every message, by id.
    pub(crate) async fn rows(&self) -> Vec<(i64, String, i64, Option<String>)> {
        sqlx::query("SELECT id, status, attempts, last_error FROM idem_outbox ORDER BY id")
            .fetch_all(&self.pool)
            .await
            .expect("read outbox")
            .iter()
            .map(|r| {
                (
                    r.get::<i64, _>(0),
                    r.get::<String, _>(1),
                    r.get::<i64, _>(2),
                    r.get::<Option<String>, _>(3),
                )
            })
            .collect()
    }

    /// An SQL expression of the database's clock, now moved by `secs`
    /// seconds (negative: in the past), as its timestamp columns hold it.
    pub(crate) fn now_plus(&self, secs: i64) -> String {
        match self.d {
            Dialect::Postgres => format!("(now() + make_interval(secs => {secs}))"),
            Dialect::MySql => format!("(UTC_TIMESTAMP(6) + INTERVAL {secs} SECOND)"),
            Dialect::Sqlite => format!("strftime('%Y-%m-%d %H:%M:%f', 'now', '{secs:+} seconds')"),
        }
    }

    /// Runs `statement` (no bound values; built by the test itself).
    pub(crate) async fn exec(&self, statement: String) {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&self.pool)
            .await
            .expect("the test's statement");
    }

    /// The status of message `id`.
    pub(crate) async fn status(&self, id: i64) -> String {
        sqlx::query_scalar(sql(self.d, "SELECT status FROM idem_outbox WHERE id = ?"))
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .expect("status")
    }
}

/// A console serving on a free port of 127.0.0.1 until dropped.
pub(crate) struct Served {
    pub(crate) base: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) async fn serve<DB: idem_runtime::Operable>(console: Console<DB>) -> Served {
    serve_router(console.router()).await
}

/// An application's router (one a console was merged into), served the same way.
pub(crate) async fn serve_router(router: axum::Router) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Served { base, task }
}

/// The text inside the element with `id` (its tags stripped, trimmed).
pub(crate) fn text_of(html: &str, id: &str) -> Option<String> {
    let at = html.find(&format!("id=\"{id}\""))?;
    let rest = &html[at..];
    let start = rest.find('>')? + 1;
    let tag_end = html[..at].rfind('<')?;
    let tag: String = html[tag_end + 1..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    let body = &rest[start..];
    let end = body.find(&format!("</{tag}>"))?;
    let mut text = String::new();
    let mut in_tag = false;
    for c in body[..end].chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    Some(text.trim().to_string())
}

/// `text_of` as a number.
pub(crate) fn number_of(html: &str, id: &str) -> i64 {
    let t = text_of(html, id).unwrap_or_else(|| panic!("no #{id} in the page:\n{html}"));
    t.parse()
        .unwrap_or_else(|_| panic!("#{id} is {t:?}, not a number"))
}

/// The `value` of the hidden input `name` in the page.
pub(crate) fn input_value(html: &str, name: &str) -> Option<String> {
    let at = html.find(&format!("name=\"{name}\" value=\""))?;
    let rest = &html[at + name.len() + 15..];
    Some(rest[..rest.find('"')?].to_string())
}

/// An HTTP client that does not follow redirects (a test reads them).
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// `pairs` as an `application/x-www-form-urlencoded` body.
pub(crate) fn form(pairs: &[(&str, String)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    s.finish()
}

/// Signs in to the console at `base` with `token`: the session cookie
/// (`name=value`).
pub(crate) async fn sign_in_with(base: &str, token: &str) -> String {
    let r = client()
        .post(format!("{base}/login"))
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .body(form(&[("token", token.into())]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::SEE_OTHER);
    let set = r.headers()[reqwest::header::SET_COOKIE].to_str().unwrap();
    set.split(';').next().unwrap().to_string()
}

//! The operator's read API (what the web console shows) on every backend,
//! through the typed pools and through `sqlx::Any`, against the real
//! servers: the backlog's counts, keyset pages of messages, requeueing a selection of ids bounded
//! by what a preview showed, lease holders, deliveries over time and the
//! archive's state. Every test has a database of its own (the tables are
//! `idem_outbox`, …), emptied first; every assertion is checked against the
//! rows in the database.

use idem_runtime::Dialect;
use idem_runtime::Error;
use idem_runtime::archive::{self, Archiver};
use idem_runtime::outbox::Status;
use idem_runtime::outbox::admin::{self, Requeue, RequeueTarget};
use idem_runtime::time::{self, OffsetDateTime};
use idem_testkit::sql;
use std::time::Duration;

/// A timestamp column's text (`YYYY-MM-DD HH:MM:SS[.fraction]`, as the
/// dialect's own expression selects it here), as the typed UTC time the
/// admin API answers.
fn utc(text: &str) -> OffsetDateTime {
    let format = time::format_description::parse_borrowed::<2>(
        "[year]-[month]-[day] [hour]:[minute]:[second].[subsecond]",
    )
    .expect("format");
    let text = if text.contains('.') {
        text.to_string()
    } else {
        format!("{text}.0")
    };
    time::PrimitiveDateTime::parse(&text, &format)
        .unwrap_or_else(|e| panic!("{text}: {e}"))
        .assume_utc()
}

fn is_config(r: Result<impl std::fmt::Debug, Error>) -> bool {
    matches!(r, Err(Error::Config { .. }))
}

macro_rules! admin_tests {
    ($module:ident, $db:ty, $dialect:expr, |$name:ident| $pool:expr) => {
        mod $module {
            use super::*;
            use sqlx::Pool;
            type Db = $db;
            const D: Dialect = $dialect;

            /// A pool on this test's own database, its idem tables empty.
            async fn pool(test: &str) -> Option<Pool<Db>> {
                let $name = format!("idem_t_admin_{}_{test}", stringify!($module));
                let pool: Pool<Db> = $pool?;
                for table in ["idem_outbox", "idem_outbox_history", "idem_record", "idem_record_history"] {
                    sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table}")))
                        .execute(&pool)
                        .await
                        .expect("empty the table");
                }
                Some(pool)
            }

            /// "Now" plus a bound number of seconds (negative: ago), in the
            /// format of the timestamp columns.
            fn shifted() -> &'static str {
                match D {
                    Dialect::Postgres => "now() + make_interval(secs => ?::float8)",
                    Dialect::MySql => "DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? SECOND)",
                    Dialect::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now', ? || ' seconds')",
                }
            }

            /// `column = ` [`shifted`].
            fn at(column: &str) -> String {
                format!("{column} = {}", shifted())
            }

            /// The statement, `?` numbered on PostgreSQL.
            fn q(text: String) -> sqlx::AssertSqlSafe<String> {
                sql(D, Box::leak(text.into_boxed_str()))
            }

            /// A timestamp column as the API's text.
            fn text_of(column: &str) -> String {
                match D {
                    Dialect::Postgres => {
                        format!("to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')")
                    }
                    Dialect::MySql => format!("DATE_FORMAT({column}, '%Y-%m-%d %H:%i:%s.%f')"),
                    Dialect::Sqlite => format!("CAST({column} AS TEXT)"),
                }
            }

            /// `n` new pending messages of `topic`; their ids.
            async fn enqueue(pool: &Pool<Db>, topic: &str, from: usize, n: usize) -> Vec<i64> {
                let mut tx = pool.begin().await.expect("begin");
                let mut ids = Vec::new();
                for i in from..from + n {
                    let payload = serde_json::json!({ "n": i });
                    let done = idem_runtime::outbox::enqueue(&mut tx, topic, &format!("{topic}-{i}"), &payload)
                        .await
                        .expect("enqueue");
                    ids.push(done.id());
                }
                tx.commit().await.expect("commit");
                ids
            }

            /// Sets a message's status and error, last updated `secs` from now.
            async fn finish(pool: &Pool<Db>, id: i64, status: &str, secs: i64) {
                let text = format!(
                    "UPDATE idem_outbox SET status = ?, attempts = 3, last_error = ?, {} WHERE id = ?",
                    at("updated_at")
                );
                let error = (status == "failed").then_some("boom");
                let done = sqlx::query(q(text))
                    .bind(status)
                    .bind(error)
                    .bind(secs)
                    .bind(id)
                    .execute(pool)
                    .await
                    .expect("finish");
                assert_eq!(done.rows_affected(), 1);
            }

            /// A message's columns: status, attempts, last_error, lease_owner, updated_at.
            async fn row(pool: &Pool<Db>, id: i64) -> (String, i32, Option<String>, Option<String>, String) {
                let text = format!(
                    "SELECT status, attempts, last_error, lease_owner, {} FROM idem_outbox WHERE id = ?",
                    text_of("updated_at")
                );
                sqlx::query_as(q(text)).bind(id).fetch_one(pool).await.expect("row")
            }

            async fn ids_where(pool: &Pool<Db>, cond: &'static str) -> Vec<i64> {
                let text = format!("SELECT id FROM idem_outbox WHERE {cond} ORDER BY id");
                sqlx::query_scalar(q(text)).fetch_all(pool).await.expect("ids")
            }

            async fn count(pool: &Pool<Db>, table: &str) -> i64 {
                let text = format!("SELECT COUNT(*) FROM {table}");
                sqlx::query_scalar(q(text)).fetch_one(pool).await.expect("count")
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn pages_walk_every_failed_message_once_in_id_order() {
                let Some(pool) = pool("pages").await else { return };
                let ids = enqueue(&pool, "pages", 0, 9).await;
                for (i, id) in ids.iter().enumerate() {
                    if i % 3 != 1 {
                        finish(&pool, *id, "failed", 0).await;
                    }
                }
                let other = enqueue(&pool, "other", 0, 1).await[0];
                finish(&pool, other, "failed", 0).await;
                let failed = ids_where(&pool, "status = 'failed' AND topic = 'pages'").await;
                assert_eq!(failed.len(), 6);

                // Pages of 4: 4, then 2 and the end.
                let (mut seen, mut after, mut pages) = (Vec::new(), None, 0);
                loop {
                    let page = admin::page(&pool, Status::Failed, Some("pages"), after, 4).await.expect("page");
                    pages += 1;
                    assert!(page.messages.len() <= 4);
                    assert!(page.messages.iter().all(|m| m.status == "failed" && m.topic == "pages"));
                    seen.extend(page.messages.iter().map(|m| m.id));
                    match page.next_after {
                        Some(id) => {
                            assert_eq!(Some(id), page.messages.last().map(|m| m.id));
                            after = Some(id);
                        }
                        None => break,
                    }
                }
                assert_eq!((seen, pages), (failed.clone(), 2));

                // Pages that divide the messages exactly end without an empty page.
                let first = admin::page(&pool, Status::Failed, Some("pages"), None, 3).await.expect("page");
                assert_eq!(first.next_after, Some(failed[2]));
                let last = admin::page(&pool, Status::Failed, Some("pages"), first.next_after, 3).await.expect("page");
                assert_eq!(last.messages.iter().map(|m| m.id).collect::<Vec<_>>(), failed[3..]);
                assert_eq!(last.next_after, None);

                // Every topic, the largest page.
                let all = admin::page(&pool, Status::Failed, None, None, 1000).await.expect("page");
                let every = ids_where(&pool, "status = 'failed'").await;
                assert_eq!(all.messages.iter().map(|m| m.id).collect::<Vec<_>>(), every);
                assert_eq!(all.next_after, None);
                let m = &all.messages[0];
                let (status, attempts, error, _, updated_at) = row(&pool, m.id).await;
                assert_eq!((&m.status, m.attempts, &m.last_error, m.updated_at), (&status, i64::from(attempts), &error, utc(&updated_at)));
                let pending = admin::page(&pool, Status::Pending, Some("pages"), Some(ids[1]), 10).await.expect("page");
                assert_eq!(pending.messages.iter().map(|m| m.id).collect::<Vec<_>>(), [ids[4], ids[7]]);

                // The list of before still works.
                let listed = admin::list(&pool, Status::Failed, Some("pages"), 2).await.expect("list");
                assert_eq!(listed.iter().map(|m| m.id).collect::<Vec<_>>(), failed[..2]);

                for bad in [0, -1, 1001] {
                    assert!(is_config(admin::page(&pool, Status::Failed, None, None, bad).await), "{bad}");
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_ids_requeue_changes_only_the_failed_messages_among_them() {
                let Some(pool) = pool("ids").await else { return };
                let ids = enqueue(&pool, "ids", 0, 5).await;
                let [a, b, pending, success, outside] = ids[..] else { unreachable!() };
                for id in [a, b, outside] {
                    finish(&pool, id, "failed", -5).await;
                }
                finish(&pool, success, "success", -5).await;
                let before: Vec<_> = futures::future::join_all([pending, success, outside].map(|id| row(&pool, id))).await;

                let selection = RequeueTarget::Ids(vec![success, b, pending, a, 987_654_321]);
                let preview = admin::requeue(&pool, &Requeue { target: selection.clone(), max_id: None, dry_run: true })
                    .await
                    .expect("preview");
                assert_eq!((preview.requeued, preview.messages.iter().map(|m| m.id).collect::<Vec<_>>()), (2, vec![a, b]));
                assert_eq!(ids_where(&pool, "status = 'failed'").await, [a, b, outside], "a dry run changes nothing");

                let done = admin::requeue(&pool, &Requeue { target: selection, max_id: None, dry_run: false })
                    .await
                    .expect("requeue");
                assert_eq!((done.requeued, done.dry_run), (2, false));
                for id in [a, b] {
                    let (status, attempts, error, owner, _) = row(&pool, id).await;
                    assert_eq!((status.as_str(), attempts, error.as_deref(), owner), ("pending", 0, Some("requeued: boom"), None));
                }
                let after: Vec<_> = futures::future::join_all([pending, success, outside].map(|id| row(&pool, id))).await;
                assert_eq!(after, before, "the pending, successful and unselected messages are untouched");

                // Bounds of the selection.
                for ids in [vec![], (1..=1001).collect()] {
                    let what = Requeue { target: RequeueTarget::Ids(ids), max_id: None, dry_run: true };
                    assert!(is_config(admin::requeue(&pool, &what).await));
                }
                let most = Requeue { target: RequeueTarget::Ids((outside..outside + 1000).collect()), max_id: None, dry_run: true };
                assert_eq!(admin::requeue(&pool, &most).await.expect("1000 ids").requeued, 1);
                assert_eq!(ids_where(&pool, "status = 'failed'").await, [outside]);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_confirmation_never_takes_a_message_that_failed_after_its_preview() {
                let Some(pool) = pool("maxid").await else { return };
                let shown = enqueue(&pool, "maxid", 0, 3).await;
                for id in &shown {
                    finish(&pool, *id, "failed", 0).await;
                }
                let preview = admin::requeue(
                    &pool,
                    &Requeue { target: RequeueTarget::Topic("maxid".into()), max_id: None, dry_run: true },
                )
                .await
                .expect("preview");
                let max_id = preview.messages.iter().map(|m| m.id).max();
                assert_eq!(max_id, shown.last().copied());
                // Fails after the preview.
                let late = enqueue(&pool, "maxid", 3, 1).await[0];
                finish(&pool, late, "failed", 0).await;

                let done = admin::requeue(
                    &pool,
                    &Requeue { target: RequeueTarget::Topic("maxid".into()), max_id, dry_run: false },
                )
                .await
                .expect("confirm");
                assert_eq!((done.requeued, done.messages.iter().map(|m| m.id).collect::<Vec<_>>()), (3, shown.clone()));
                assert_eq!(ids_where(&pool, "status = 'failed'").await, [late]);
                assert_eq!(ids_where(&pool, "status = 'pending'").await, shown);

                // Every target honours it.
                for target in [RequeueTarget::AllFailed, RequeueTarget::Id(late), RequeueTarget::Ids(vec![late])] {
                    let what = Requeue { target, max_id: Some(late - 1), dry_run: false };
                    assert_eq!(admin::requeue(&pool, &what).await.expect("requeue").requeued, 0);
                }
                assert_eq!(ids_where(&pool, "status = 'failed'").await, [late]);
                let what = Requeue { target: RequeueTarget::AllFailed, max_id: Some(late), dry_run: false };
                assert_eq!(admin::requeue(&pool, &what).await.expect("requeue").requeued, 1);
                assert_eq!(ids_where(&pool, "status = 'failed'").await, Vec::<i64>::new());
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_preview_counts_every_target_and_lists_only_the_first() {
                let Some(pool) = pool("preview").await else { return };
                let failed = enqueue(&pool, "prev", 0, 25).await;
                for id in &failed {
                    finish(&pool, *id, "failed", 0).await;
                }
                let pending = enqueue(&pool, "prev", 25, 2).await;
                let other = enqueue(&pool, "prev-other", 0, 1).await[0];
                finish(&pool, other, "failed", 0).await;
                let before = ids_where(&pool, "status = 'failed'").await;

                let p = admin::preview(&pool, &RequeueTarget::Topic("prev".into()), 10).await.expect("preview");
                assert_eq!(p.count, 25);
                assert_eq!(p.max_id, failed.last().copied());
                assert_eq!(p.first.iter().map(|m| m.id).collect::<Vec<_>>(), failed[..10]);
                let all = admin::preview(&pool, &RequeueTarget::AllFailed, 1000).await.expect("all");
                assert_eq!((all.count, all.max_id, all.first.len()), (26, Some(other), 26));
                // A selection: only its failed ids count.
                let sel = RequeueTarget::Ids(vec![failed[3], pending[0], other]);
                let p = admin::preview(&pool, &sel, 100).await.expect("ids");
                assert_eq!((p.count, p.max_id), (2, Some(other)));
                let p = admin::preview(&pool, &RequeueTarget::Id(pending[1]), 100).await.expect("id");
                assert_eq!((p.count, p.max_id, p.first.len()), (0, None, 0));
                // Its count is what the confirmation, bounded by its max id, takes.
                let p = admin::preview(&pool, &RequeueTarget::Topic("prev".into()), 1).await.expect("preview");
                let done = admin::requeue(
                    &pool,
                    &Requeue { target: RequeueTarget::Topic("prev".into()), max_id: p.max_id, dry_run: false },
                )
                .await
                .expect("confirm");
                assert_eq!(done.requeued, p.count);
                assert_eq!(ids_where(&pool, "status = 'failed'").await, [other]);
                assert_eq!(before.len(), 26);
                // Bad arguments.
                assert!(is_config(admin::preview(&pool, &RequeueTarget::AllFailed, 0).await));
                assert!(is_config(admin::preview(&pool, &RequeueTarget::AllFailed, 1001).await));
                assert!(is_config(admin::preview(&pool, &RequeueTarget::Ids(vec![]), 10).await));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn two_confirmations_at_once_requeue_each_message_once() {
                let Some(pool) = pool("twice").await else { return };
                let failed = enqueue(&pool, "twice", 0, 40).await;
                for id in &failed {
                    finish(&pool, *id, "failed", 0).await;
                }
                let what = Requeue {
                    target: RequeueTarget::Topic("twice".into()),
                    max_id: failed.last().copied(),
                    dry_run: false,
                };
                let (a, b) = tokio::join!(admin::requeue(&pool, &what), admin::requeue(&pool, &what));
                let (a, b) = (a.expect("first"), b.expect("second"));
                assert_eq!(a.requeued + b.requeued, 40, "{} + {}", a.requeued, b.requeued);
                assert_eq!(ids_where(&pool, "status = 'pending' AND attempts = 0").await, failed);
                // Prefixed once: no message went through both.
                let twice = ids_where(&pool, "last_error LIKE 'requeued: requeued:%'").await;
                assert!(twice.is_empty(), "requeued twice: {twice:?}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_backlog_is_the_open_part_of_the_stats() {
                let Some(pool) = pool("backlog").await else { return };
                let empty = admin::backlog(&pool, None).await.expect("backlog");
                assert!(empty.topics.is_empty() && empty.totals.total == 0);
                let a = enqueue(&pool, "bl-a", 0, 6).await;
                let b = enqueue(&pool, "bl-b", 0, 3).await;
                let done = enqueue(&pool, "bl-done", 0, 2).await;
                for id in &a[..2] {
                    finish(&pool, *id, "success", -5).await;
                }
                finish(&pool, a[2], "failed", -5).await;
                for id in &b {
                    finish(&pool, *id, "failed", -5).await;
                }
                for id in &done {
                    finish(&pool, *id, "success", -5).await;
                }
                let full = admin::stats(&pool, None).await.expect("stats");
                let open = admin::backlog(&pool, None).await.expect("backlog");
                // bl-done has only delivered messages: no backlog.
                let names: Vec<&str> = open.topics.iter().map(|t| t.topic.as_str()).collect();
                assert_eq!(names, ["bl-a", "bl-b"]);
                for t in &open.topics {
                    let f = full.topics.iter().find(|f| f.topic == t.topic).expect("in the stats too");
                    assert_eq!((t.pending, t.failed, t.success), (f.pending, f.failed, 0), "{}", t.topic);
                    assert_eq!(t.total, t.pending + t.failed);
                    assert_eq!(t.oldest_pending_age_secs.is_some(), f.oldest_pending_age_secs.is_some());
                }
                // Against the rows themselves.
                let text = "SELECT COUNT(*) FROM idem_outbox WHERE status = ?".to_string();
                for (status, shown) in [("pending", open.totals.pending), ("failed", open.totals.failed)] {
                    let n: i64 = sqlx::query_scalar(q(text.clone())).bind(status).fetch_one(&pool).await.expect("count");
                    assert_eq!(shown, n, "{status}");
                }
                assert_eq!((open.totals.pending, open.totals.failed, open.totals.success), (3, 4, 0));
                assert_eq!(full.totals.success, 4);
                let one = admin::backlog(&pool, Some("bl-b")).await.expect("one topic");
                assert_eq!(one.topics.len(), 1);
                assert_eq!((one.totals.pending, one.totals.failed), (0, 3));
                assert_eq!(one.totals.oldest_pending_age_secs, None);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn leases_count_each_owners_pending_messages_and_live_leases() {
                let Some(pool) = pool("leases").await else { return };
                assert!(admin::leases(&pool).await.expect("leases").is_empty());
                let ids = enqueue(&pool, "leases", 0, 5).await;
                let lease = format!("UPDATE idem_outbox SET lease_owner = ?, {} WHERE id = ?", at("locked_until"));
                for (id, owner, secs) in [(ids[0], "relay-a", 60), (ids[1], "relay-a", -60), (ids[2], "relay-b", 30), (ids[3], "relay-c", 60)] {
                    sqlx::query(q(lease.clone())).bind(owner).bind(secs).bind(id).execute(&pool).await.expect("lease");
                }
                // Not pending: not a lease holder's.
                finish(&pool, ids[3], "success", 0).await;

                let holders = admin::leases(&pool).await.expect("leases");
                let text = format!("SELECT {} FROM idem_outbox WHERE id = ?", text_of("locked_until"));
                let mut until = Vec::new();
                for id in &ids[..3] {
                    let t: String = sqlx::query_scalar(q(text.clone())).bind(*id).fetch_one(&pool).await.expect("until");
                    until.push(t);
                }
                let expected = vec![
                    admin::LeaseHolder {
                        owner: "relay-a".into(),
                        messages: 2,
                        live: 1,
                        earliest_expiry: Some(utc(&until[1])),
                        latest_expiry: Some(utc(&until[0])),
                    },
                    admin::LeaseHolder {
                        owner: "relay-b".into(),
                        messages: 1,
                        live: 1,
                        earliest_expiry: Some(utc(&until[2])),
                        latest_expiry: Some(utc(&until[2])),
                    },
                ];
                assert_eq!(holders, expected);
                assert!(until[1] < until[0], "{until:?}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn deliveries_count_successes_per_bucket_of_the_window() {
                let Some(pool) = pool("deliveries").await else { return };
                let minute = Duration::from_secs(60);
                assert_eq!(admin::deliveries(&pool, 10 * minute, minute).await.expect("empty"), vec![0; 10]);
                let ids = enqueue(&pool, "deliveries", 0, 6).await;
                for (id, status, secs) in [
                    (ids[0], "success", 0),
                    (ids[1], "success", 0),
                    (ids[2], "success", -120),
                    (ids[3], "success", -7200),
                    (ids[4], "failed", 0),
                ] {
                    finish(&pool, id, status, secs).await;
                }
                let per_minute = admin::deliveries(&pool, 10 * minute, minute).await.expect("deliveries");
                let mut expected = vec![0; 10];
                expected[9] = 2; // now
                expected[7] = 1; // 2 minutes ago
                assert_eq!(per_minute, expected, "the 2-hour-old success is outside the window");
                // Buckets that do not divide the window: the oldest is the shorter.
                let uneven = admin::deliveries(&pool, 10 * minute, 7 * minute).await.expect("deliveries");
                assert_eq!(uneven, [0, 3]);
                let hour = admin::deliveries(&pool, 60 * minute, Duration::from_secs(6)).await.expect("600 buckets");
                assert_eq!((hour.len(), hour.iter().sum::<u64>()), (600, 3));
                assert_eq!(hour[599], 2);
                let moved = admin::deliveries(&pool, Duration::from_secs(90), Duration::from_secs(1)).await.expect("deliveries");
                assert_eq!((moved.len(), moved.iter().sum::<u64>()), (90, 2), "the 2-minute-old success is outside 90 s");

                for (window, bucket) in [
                    (10 * minute, Duration::from_millis(500)),
                    (61 * minute, minute),
                    (60 * minute, Duration::from_secs(1)),
                    (Duration::ZERO, minute),
                ] {
                    assert!(is_config(admin::deliveries(&pool, window, bucket).await), "{window:?} {bucket:?}");
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn archive_status_counts_what_the_archiver_then_moves() {
                let Some(pool) = pool("archive").await else { return };
                let day = Duration::from_secs(86_400);
                let empty = archive::status(&pool, day).await.expect("status");
                assert_eq!(
                    empty,
                    archive::ArchiveStatus {
                        records_eligible: 0,
                        outbox_eligible: 0,
                        record_history: 0,
                        outbox_history: 0,
                        last_record_archived_at: None,
                        last_outbox_archived_at: None,
                        outbox_retention_secs: 86_400.0,
                    }
                );
                assert_eq!(
                    archive::status(&pool, archive::DEFAULT_OUTBOX_RETENTION).await.expect("status").outbox_retention_secs,
                    7.0 * 86_400.0
                );
                // Records: two expired, one not.
                let insert = format!(
                    "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, create_time, expire_time) \
                     VALUES (?, 'admin', 'n', 'f', {}, {})",
                    shifted(),
                    shifted()
                );
                for (key, created, expires) in [("k-1", -7200, -3600), ("k-2", -7200, -1), ("k-3", -60, 3600)] {
                    sqlx::query(q(insert.clone())).bind(key).bind(created).bind(expires).execute(&pool).await.expect("record");
                }
                // Messages: finished 2 days ago (success, failed), pending as old, success an hour ago.
                let ids = enqueue(&pool, "archive", 0, 4).await;
                finish(&pool, ids[0], "success", -2 * 86_400).await;
                finish(&pool, ids[1], "failed", -2 * 86_400).await;
                finish(&pool, ids[2], "pending", -2 * 86_400).await;
                finish(&pool, ids[3], "success", -3600).await;

                let before = archive::status(&pool, day).await.expect("status");
                assert_eq!((before.records_eligible, before.outbox_eligible), (2, 2), "{before:?}");
                assert_eq!((before.record_history, before.outbox_history), (0, 0));
                // A shorter retention takes the hour-old success too; a longer one nothing.
                assert_eq!(archive::status(&pool, Duration::from_secs(60)).await.expect("status").outbox_eligible, 3);
                assert_eq!(archive::status(&pool, 3 * day).await.expect("status").outbox_eligible, 0);

                let moved = Archiver::new(pool.clone()).outbox_retention(day).run_once(|_| {}).await.expect("archive");
                assert_eq!((moved.records as i64, moved.outbox as i64), (before.records_eligible, before.outbox_eligible));
                let after = archive::status(&pool, day).await.expect("status");
                assert_eq!((after.records_eligible, after.outbox_eligible), (0, 0), "{after:?}");
                assert_eq!(
                    (after.record_history, after.outbox_history),
                    (count(&pool, "idem_record_history").await, count(&pool, "idem_outbox_history").await)
                );
                assert_eq!((after.record_history, after.outbox_history), (2, 2));
                for (last, table) in [
                    (&after.last_record_archived_at, "idem_record_history"),
                    (&after.last_outbox_archived_at, "idem_outbox_history"),
                ] {
                    let text = format!("SELECT {} FROM {table} ORDER BY archived_at DESC", text_of("archived_at"));
                    let newest: String = sqlx::query_scalar(q(text)).fetch_one(&pool).await.expect("archived_at");
                    assert_eq!(*last, Some(utc(&newest)), "{table}");
                }
                assert_eq!(ids_where(&pool, "1 = 1").await, [ids[2], ids[3]]);
            }
        }
    };
}

idem_testkit::for_each_backend!(admin_tests;
    postgres { |name| idem_testkit::postgres_database(&name, 4).await },
    mariadb { |name| idem_testkit::mysql_database(&name, 4).await },
    sqlite {
        |name| {
            let _ = &name;
            Some(idem_testkit::sqlite(4).await)
        }
    },
    // The same through `sqlx::Any`, the dialect chosen by URL.
    any_postgres {
        |name| match idem_testkit::postgres_database(&name, 1).await {
            Some(_) => {
                let url = idem_testkit::database_url(&idem_testkit::postgres_url(), &name);
                idem_testkit::any(&url, 4).await
            }
            None => None,
        }
    },
    any_mariadb {
        |name| match idem_testkit::mysql_database(&name, 1).await {
            Some(_) => {
                let url = idem_testkit::database_url(&idem_testkit::mysql_url(), &name);
                idem_testkit::any(&url, 4).await
            }
            None => None,
        }
    },
    any_sqlite {
        |name| {
            let _ = &name;
            idem_testkit::any(&idem_testkit::sqlite_url(), 4).await
        }
    },
);

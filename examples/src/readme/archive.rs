//! README, "Operating idem": the archiver, looking records up by key, and
//! the retention check at start-up.

use idem_runtime::archive::{ArchiverHandle, RecordInfo};
use idem_runtime::outbox::Relay;
use idem_runtime::Error;
use sqlx::{PgPool, Postgres};
use std::time::Duration;

/// The records of `notice:m-9` (every business type's, and the `notice`
/// one), with the archiver running in the background.
pub async fn archive_and_find(pool: PgPool) -> Result<(ArchiverHandle, Vec<RecordInfo>, Vec<RecordInfo>), Error> {
    // README: archive
    use idem_runtime::archive::Archiver;

    let archiver = Archiver::new(pool.clone())
        .batch_size(1000)
        .outbox_retention(Duration::from_secs(7 * 86400))
        .spawn(Duration::from_secs(60));                 // a tokio task; or .run_once(progress)
    // One record per biz_type (online, else the latest archived), or only one business type's:
    let all = idem_runtime::archive::find_record(&pool, "notice:m-9", None).await?;
    let one = idem_runtime::archive::find_record(&pool, "notice:m-9", Some("notice")).await?;
    // README: end
    Ok((archiver, all, one))
}

/// Whether records of 7 days outlive `relay`'s duplicates (plus an hour
/// of broker redelivery).
pub fn check_retention(relay: &Relay<Postgres>) -> Result<(), Error> {
    // README: retention
    use idem_runtime::archive::RetentionPolicy;
    let (ttl, allowance) = (Duration::from_secs(7 * 86400), Duration::from_secs(3600));
    RetentionPolicy::for_relay(&relay.settings(), ttl, allowance).check()?;
    // With a ttl of 1h (and the outbox section's relay): Err(Config), "unsafe configuration:
    //  record ttl 1h is shorter than the longest duplicate window 1h 6m 42s 200ms (outbox
    //  retry horizon 6m 42s 200ms + broker allowance 1h): a late retry would execute twice"
    // README: end
    Ok(())
}

//! Durations for people, written once: the runtime's messages (a
//! [`RetentionPolicy`](crate::archive::RetentionPolicy) that is too short)
//! and the CLI's output print them the same way.

use std::time::Duration;

/// `1d 2h`, `6m 42s 200ms`, `0s`: each non-zero unit from days down to
/// milliseconds, so that two durations that differ print differently
/// (below a millisecond is dropped).
///
/// ```
/// use idem_runtime::duration::human;
/// use std::time::Duration;
/// assert_eq!(human(Duration::from_secs(93_600)), "1d 2h");
/// assert_eq!(human(Duration::from_millis(402_200)), "6m 42s 200ms");
/// assert_eq!(human(Duration::ZERO), "0s");
/// ```
pub fn human(d: Duration) -> String {
    let secs = d.as_secs();
    let parts = [
        (secs / 86_400, "d"),
        (secs / 3_600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
        (u64::from(d.subsec_millis()), "ms"),
    ];
    let out: Vec<String> = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    if out.is_empty() {
        "0s".into()
    } else {
        out.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::human;
    use std::time::Duration;

    #[test]
    fn every_unit_down_to_milliseconds() {
        assert_eq!(human(Duration::ZERO), "0s");
        assert_eq!(human(Duration::from_micros(999)), "0s");
        assert_eq!(human(Duration::from_millis(500)), "500ms");
        assert_eq!(human(Duration::from_secs(45)), "45s");
        assert_eq!(human(Duration::from_secs(3600)), "1h");
        assert_eq!(human(Duration::from_secs(7 * 86_400)), "7d");
        assert_eq!(
            human(Duration::from_millis(86_400_000 + 61_001)),
            "1d 1m 1s 1ms"
        );
        // Close durations stay apart.
        assert_ne!(
            human(Duration::from_secs(360)),
            human(Duration::from_millis(360_200))
        );
    }
}

//! Names and ids no other test, and no earlier run on a shared server, uses.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};

/// A name no other test (or earlier run) uses: `prefix_<pid>_<start second>_<n>`.
///
/// ```
/// let a = idem_testkit::unique("coupon");
/// let b = idem_testkit::unique("coupon");
/// assert!(a.starts_with("coupon_"));
/// assert_ne!(a, b);
/// ```
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    // The process id alone repeats across runs (`pid_max` is 32768 here):
    // a test that found an earlier run's rows under its topic took them
    // for its own (seen once in seven suite runs). The start's second
    // (modulo 10^6, about eleven days) tells the runs apart.
    static STAMP: OnceLock<u64> = OnceLock::new();
    let stamp = *STAMP.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() % 1_000_000)
    });
    format!(
        "{prefix}_{}_{stamp}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A process-wide id base, so rows of this run never collide with rows of
/// an earlier run left in a shared server's tables.
pub fn id_base() -> i64 {
    static BASE: OnceLock<i64> = OnceLock::new();
    *BASE.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos() as i64;
        // 10^6 ids per run, distinct across runs.
        (nanos / 1_000) % 1_000_000_000 * 1_000_000
    })
}

/// A fresh id range of `n` ids: the first is returned, the next `n - 1`
/// are yours too.
///
/// ```
/// let a = idem_testkit::ids(10);
/// let b = idem_testkit::ids(1);
/// assert!(b >= a + 10);
/// ```
pub fn ids(n: i64) -> i64 {
    static NEXT: AtomicI64 = AtomicI64::new(0);
    id_base() + NEXT.fetch_add(n, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_do_not_overlap() {
        let a = ids(3);
        let b = ids(2);
        assert!(b >= a + 3);
        assert!(a >= id_base());
    }

    #[test]
    fn unique_names_carry_the_pid() {
        let n = unique("t");
        assert!(n.starts_with(&format!("t_{}_", std::process::id())), "{n}");
    }
}

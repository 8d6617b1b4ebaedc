//! Numbers and ages as operators read them.

/// Seconds as `42s`, `3m 07s`, `2h 05m`, `3d 04h`.
pub(crate) fn age(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ages_and_counts() {
        assert_eq!(super::age(0.4), "0s");
        assert_eq!(super::age(187.0), "3m 07s");
        assert_eq!(super::age(7500.0), "2h 05m");
        assert_eq!(super::age(3.0 * 86_400.0 + 4.0 * 3600.0), "3d 04h");
    }
}

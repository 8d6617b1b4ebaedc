//! idem's one duration grammar: what the `idem` command line's flags
//! (`--outbox-retention 7d`, `--pause 50ms`), the console's and the
//! macro's `ttl = "7d"` read, and what messages print.
//!
//! A duration is one or more numbers each followed at once by its unit,
//! `ms`, `s`, `m`, `h` or `d` (a day is 24 hours), optionally separated by
//! spaces: `30s`, `15m`, `24h`, `7d`, `500ms`, `1d12h`, `1d 12h`,
//! `6m 42s 200ms`, `0s`. Nothing else: **a bare number is refused** (is
//! `--pause 50` fifty seconds or fifty milliseconds?) with an error that
//! says which unit to add, and so are signs, fractions, long unit names
//! and a space between a number and its unit. [`human`] prints in this
//! grammar, so what it prints parses back to the same duration.

use std::fmt;
use std::time::Duration;

/// Why a text is not a duration (see the [module](self) for the grammar).
/// Its message says what to write instead; it does not repeat the text.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DurationError {
    /// Nothing, or only spaces.
    Empty,
    /// A number without a unit, such as `90` or the `12` of `1d 12`.
    NoUnit {
        /// The number, as written.
        number: String,
    },
    /// Not the grammar: an unknown unit, a unit without a number, a sign,
    /// a fraction, a space between a number and its unit.
    Invalid,
    /// More than [`Duration`] holds (about 584 billion years).
    TooLong,
}

/// The grammar, for messages.
const EXPECTED: &str = "expected numbers each followed by a unit (ms, s, m, h, d), such as \
                        `30s`, `15m`, `24h`, `7d`, `500ms` or `1d 12h`";

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationError::Empty => write!(f, "no duration: {EXPECTED}"),
            DurationError::NoUnit { number } => write!(
                f,
                "`{number}` has no unit: write `{number}s` for seconds, or `{number}ms`, \
                 `{number}m`, `{number}h`, `{number}d`"
            ),
            DurationError::Invalid => f.write_str(EXPECTED),
            DurationError::TooLong => f.write_str("too long a duration"),
        }
    }
}

impl std::error::Error for DurationError {}

/// Reads a duration of idem's grammar (see the [module](self)); spaces
/// around it are ignored.
///
/// ```
/// use idem_syntax::duration::{parse, DurationError};
/// use std::time::Duration;
/// assert_eq!(parse("7d"), Ok(Duration::from_secs(7 * 86_400)));
/// assert_eq!(parse("1d 12h"), parse("1d12h"));
/// assert_eq!(parse("6m 42s 200ms"), Ok(Duration::from_millis(402_200)));
/// assert_eq!(parse("90"), Err(DurationError::NoUnit { number: "90".into() }));
/// assert_eq!(parse("7 days"), Err(DurationError::Invalid));
/// ```
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let words: Vec<&str> = text.split_ascii_whitespace().collect();
    if words.is_empty() {
        return Err(DurationError::Empty);
    }
    let mut total = Duration::ZERO;
    for (i, word) in words.iter().enumerate() {
        let mut rest = *word;
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return Err(DurationError::Invalid);
            }
            let (number, after) = rest.split_at(digits);
            let unit_len = after.bytes().take_while(u8::is_ascii_alphabetic).count();
            let (unit, after) = after.split_at(unit_len);
            if unit.is_empty() {
                // A number ending the text lacks its unit; one followed by
                // anything else (`7 days`, `1.5h`) is not the grammar.
                return Err(if after.is_empty() && i + 1 == words.len() {
                    DurationError::NoUnit {
                        number: number.to_string(),
                    }
                } else {
                    DurationError::Invalid
                });
            }
            let n: u64 = number.parse().map_err(|_| DurationError::TooLong)?;
            let part = match unit {
                "ms" => Some(Duration::from_millis(n)),
                "s" => Some(Duration::from_secs(n)),
                "m" => n.checked_mul(60).map(Duration::from_secs),
                "h" => n.checked_mul(3_600).map(Duration::from_secs),
                "d" => n.checked_mul(86_400).map(Duration::from_secs),
                _ => return Err(DurationError::Invalid),
            };
            total = part
                .and_then(|p| total.checked_add(p))
                .ok_or(DurationError::TooLong)?;
            rest = after;
        }
    }
    Ok(total)
}

/// Prints a duration in idem's grammar: each non-zero unit from days down
/// to milliseconds, separated by spaces (`1d 2h`, `6m 42s 200ms`, `0s`),
/// so that two durations that differ print differently and
/// [`parse`] reads it back (below a millisecond is dropped).
///
/// ```
/// use idem_syntax::duration::{human, parse};
/// use std::time::Duration;
/// assert_eq!(human(Duration::from_secs(93_600)), "1d 2h");
/// assert_eq!(human(Duration::from_millis(402_200)), "6m 42s 200ms");
/// assert_eq!(human(Duration::ZERO), "0s");
/// let d = Duration::from_millis(93_600_250);
/// assert_eq!(parse(&human(d)), Ok(d));
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
    use super::*;

    fn secs(s: u64) -> Result<Duration, DurationError> {
        Ok(Duration::from_secs(s))
    }

    #[test]
    fn the_grammar() {
        assert_eq!(parse("7d"), secs(7 * 86_400));
        assert_eq!(parse("1d12h"), secs(36 * 3_600));
        assert_eq!(parse("1d 12h"), secs(36 * 3_600));
        assert_eq!(parse("  30m "), secs(1_800));
        assert_eq!(parse("0s"), secs(0));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1m1m"), secs(120));
        assert_eq!(parse("00045s"), secs(45));
    }

    #[test]
    fn a_bare_number_is_refused_with_the_unit_to_add() {
        for (text, number) in [("90", "90"), ("0", "0"), ("1d 12", "12"), ("1d12", "12")] {
            let e = parse(text).unwrap_err();
            assert_eq!(
                e,
                DurationError::NoUnit {
                    number: number.into()
                },
                "{text:?}"
            );
            assert!(e.to_string().contains(&format!("`{number}s`")), "{e}");
        }
    }

    #[test]
    fn anything_else_is_refused() {
        for text in [
            "7x", "d", "7 days", "7 d", "1.5h", "-1s", "+1s", "1S", "1 h", "1sec", "7days", "1w",
            "s5", "1d,2h", "5µs",
        ] {
            assert_eq!(parse(text), Err(DurationError::Invalid), "{text:?}");
        }
        assert_eq!(parse(""), Err(DurationError::Empty));
        assert_eq!(parse(" \t"), Err(DurationError::Empty));
        for text in [
            "99999999999999999999s",
            "213503982334602d",
            "18446744073709551615s 1s",
            "18446744073709551615s 1000ms",
        ] {
            assert_eq!(parse(text), Err(DurationError::TooLong), "{text:?}");
        }
        assert_eq!(
            parse("18446744073709551615s 999ms"),
            Ok(Duration::new(u64::MAX, 999_000_000))
        );
    }

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

    #[test]
    fn what_is_printed_parses_back() {
        // Every unit on and off, and the extremes.
        let units = [86_400_000u64, 3_600_000, 60_000, 1_000, 1];
        for mask in 0u32..32 {
            let ms: u64 = units
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(i, u)| u * (i as u64 + 2))
                .sum();
            let d = Duration::from_millis(ms);
            assert_eq!(parse(&human(d)), Ok(d), "{}", human(d));
        }
        let max = Duration::new(u64::MAX, 999_000_000);
        assert_eq!(parse(&human(max)), Ok(max), "{}", human(max));
        // Whole milliseconds only: the rest is dropped.
        let d = Duration::new(90, 123_456_789);
        assert_eq!(parse(&human(d)), Ok(Duration::from_millis(90_123)));
    }
}

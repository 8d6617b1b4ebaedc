//! `ttl = "7d"`: record lifetimes, from one second to ten years, in
//! idem's one duration grammar.

use idem_syntax::duration::{self, DurationError};
use std::time::Duration;

/// Default record time-to-live: seven days.
pub(super) const DEFAULT_TTL_SECS: u64 = 7 * 24 * 3600;
/// The longest record time-to-live: 3650 days (ten years). Longer is a
/// mistake (a unit typo such as `3000000d`), and far past what the
/// database's date arithmetic handles everywhere.
pub(super) const MAX_TTL_SECS: u64 = 3650 * 24 * 3600;

/// A ttl in idem's one duration grammar ([`idem_syntax::duration`]: `30s`,
/// `15m`, `24h`, `7d`, `1d 12h`…) → seconds: whole seconds, between 1
/// second and [`MAX_TTL_SECS`]; the error says what is wrong.
pub(super) fn parse_ttl(s: &str) -> Result<u64, String> {
    let too_long = || {
        format!(
            "ttl `{s}` is too long: at most 3650 days (`3650d`, ten years); records are kept \
             for as long as a duplicate can still arrive"
        )
    };
    let d = match duration::parse(s) {
        Ok(d) => d,
        Err(DurationError::TooLong) => return Err(too_long()),
        Err(e) => return Err(format!("invalid ttl `{s}`: {e}")),
    };
    if d < Duration::from_secs(1) {
        return Err(format!(
            "ttl `{s}` is too short: at least `1s`; records are kept for as long as a \
             duplicate can still arrive"
        ));
    }
    if d.subsec_nanos() != 0 {
        return Err(format!(
            "invalid ttl `{s}`: a ttl is whole seconds (records expire to the second)"
        ));
    }
    if d.as_secs() > MAX_TTL_SECS {
        return Err(too_long());
    }
    Ok(d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ttls() {
        assert_eq!(parse_ttl("30s"), Ok(30));
        assert_eq!(parse_ttl("1d12h"), Ok(129600));
        assert_eq!(parse_ttl("1s"), Ok(1));
        assert_eq!(parse_ttl("3650d"), Ok(MAX_TTL_SECS));
        assert_eq!(parse_ttl("1d 12h"), Ok(129600));
        assert_eq!(parse_ttl("1500s 2000ms"), Ok(1502));
        for bad in ["3w", "", "d", "7 days", "1.5h", "1500ms"] {
            assert!(parse_ttl(bad).unwrap_err().contains("invalid ttl"), "{bad}");
        }
        // A bare number: the unit to add.
        let e = parse_ttl("3600").unwrap_err();
        assert!(
            e.contains("invalid ttl `3600`") && e.contains("`3600s`"),
            "{e}"
        );
        for short in ["0s", "0d", "999ms"] {
            assert!(
                parse_ttl(short).unwrap_err().contains("too short"),
                "{short}"
            );
        }
        for long in [
            "3651d",
            "3650d1s",
            "3000000d",
            "99999999999999999999s",
            "18446744073709551615d",
            "213503982334601d",
        ] {
            assert!(parse_ttl(long).unwrap_err().contains("too long"), "{long}");
        }
    }

    mod fuzz {
        use super::super::*;
        use proptest::prelude::*;

        fn check(s: &str) {
            match parse_ttl(s) {
                Ok(secs) => assert!((1..=MAX_TTL_SECS).contains(&secs), "{s:?} → {secs}"),
                Err(msg) => assert!(!msg.is_empty(), "{s:?}"),
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(20_000))]

            /// Any string: no panic, a bounded value or a message.
            #[test]
            fn ttl_parser_never_panics(s in any::<String>()) {
                check(&s);
            }

            /// Strings of the ttl alphabet, long digit runs included (overflow).
            #[test]
            fn ttl_like_strings_never_panic(s in "[0-9smhdw ]{0,40}") {
                check(&s);
            }

            /// Well-formed durations parse to their value, or are too long.
            #[test]
            fn durations_parse_to_their_value(
                parts in proptest::collection::vec((0u64..100_000, 0usize..4), 1..4)
            ) {
                const UNITS: [(char, u64); 4] = [('s', 1), ('m', 60), ('h', 3600), ('d', 86400)];
                let text: String = parts.iter().map(|&(n, u)| format!("{n}{}", UNITS[u].0)).collect();
                let secs: u64 = parts.iter().map(|&(n, u)| n * UNITS[u].1).sum();
                match parse_ttl(&text) {
                    Ok(v) => prop_assert_eq!(v, secs),
                    Err(msg) => prop_assert!(
                        (secs == 0 && msg.contains("too short")) || (secs > MAX_TTL_SECS && msg.contains("too long")),
                        "{} ({} s): {}", text, secs, msg
                    ),
                }
            }
        }
    }
}

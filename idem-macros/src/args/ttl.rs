//! `ttl = "7d"`: record lifetimes, from one second to ten years.

/// Default record time-to-live: seven days.
pub(super) const DEFAULT_TTL_SECS: u64 = 7 * 24 * 3600;
/// The longest record time-to-live: 3650 days (ten years). Longer is a
/// mistake (a unit typo such as `3000000d`), and far past what the
/// database's date arithmetic handles everywhere.
pub(super) const MAX_TTL_SECS: u64 = 3650 * 24 * 3600;

/// `30s`, `15m`, `24h`, `7d`, `1d12h` → seconds, between 1 second and
/// [`MAX_TTL_SECS`]; the error says what is wrong.
pub(super) fn parse_ttl(s: &str) -> Result<u64, String> {
    let syntax = || {
        format!(
            "invalid ttl `{s}`: expected a positive duration such as `30s`, `15m`, `24h`, `7d` \
             or `1d12h`"
        )
    };
    let too_long = || {
        format!(
            "ttl `{s}` is too long: at most 3650 days (`3650d`, ten years); records are kept \
             for as long as a duplicate can still arrive"
        )
    };
    let mut total: u64 = 0;
    let mut num: Option<u64> = None;
    for c in s.chars() {
        if let Some(d) = c.to_digit(10) {
            num = Some(
                num.unwrap_or(0)
                    .checked_mul(10)
                    .and_then(|n| n.checked_add(u64::from(d)))
                    .ok_or_else(too_long)?,
            );
        } else {
            let unit = match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86400,
                _ => return Err(syntax()),
            };
            let n = num.take().ok_or_else(syntax)?;
            total = n
                .checked_mul(unit)
                .and_then(|n| total.checked_add(n))
                .ok_or_else(too_long)?;
        }
    }
    if num.is_some() || total == 0 {
        return Err(syntax());
    }
    if total > MAX_TTL_SECS {
        return Err(too_long());
    }
    Ok(total)
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
        for bad in ["7", "0s", "3w", "", "d", "7 days"] {
            assert!(parse_ttl(bad).unwrap_err().contains("invalid ttl"), "{bad}");
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
                        (secs == 0 && msg.contains("invalid")) || (secs > MAX_TTL_SECS && msg.contains("too long")),
                        "{} ({} s): {}", text, secs, msg
                    ),
                }
            }
        }
    }
}

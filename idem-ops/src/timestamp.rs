//! The timestamps of records and messages, typed: [`OffsetDateTime`]s in
//! UTC (the `time` crate, as sqlx offers them), read from the text every
//! dialect selects (`YYYY-MM-DD HH:MM:SS.ffffff`; SQLite keeps
//! milliseconds), and serialized as RFC 3339.

use time::format_description::FormatItem;
use time::macros::format_description;
use time::{OffsetDateTime, PrimitiveDateTime};

/// The text of a timestamp column as the operator's statements select it.
const STORED: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day] [hour]:[minute]:[second][optional [.[subsecond]]]");

/// How [`utc_text`] writes one.
const SHOWN: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day] [hour]:[minute]:[second].[subsecond digits:6]");

/// A timestamp column's text, as UTC. A `T` between date and time (an
/// ISO 8601 text a user's own writes may have left) reads the same; any
/// other text is a decoding error naming it, never a panic.
pub(crate) fn parse(text: &str) -> Result<OffsetDateTime, sqlx::Error> {
    let text = text.trim();
    let spaced = text.replacen('T', " ", 1);
    PrimitiveDateTime::parse(&spaced, STORED)
        .map(PrimitiveDateTime::assume_utc)
        .map_err(|e| sqlx::Error::Decode(format!("idem: the timestamp `{text}`: {e}").into()))
}

/// [`parse`] of a nullable column.
pub(crate) fn parse_opt(text: Option<String>) -> Result<Option<OffsetDateTime>, sqlx::Error> {
    text.as_deref().map(parse).transpose()
}

/// `t` as the CLI and the console show it: `YYYY-MM-DD HH:MM:SS.ffffff`,
/// in UTC.
///
/// ```
/// use idem_runtime::timestamp::utc_text;
/// use idem_runtime::time::macros::datetime;
/// assert_eq!(utc_text(&datetime!(2026-12-05 19:12:56.5 UTC)), "2026-12-05 19:12:56.500000");
/// ```
pub fn utc_text(t: &OffsetDateTime) -> String {
    t.to_offset(time::UtcOffset::UTC)
        .format(SHOWN)
        .unwrap_or_else(|_| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dialects_text_reads_as_utc() {
        let micros = parse("2026-12-05 19:12:56.123456").unwrap();
        assert_eq!(micros.microsecond(), 123_456);
        assert_eq!(micros.offset(), time::UtcOffset::UTC);
        assert_eq!(parse("2026-12-05 19:12:56.123").unwrap().millisecond(), 123);
        assert_eq!(parse("2026-12-05 19:12:56").unwrap().second(), 56);
        assert_eq!(
            parse("2026-12-05T19:12:56").unwrap(),
            parse("2026-12-05 19:12:56").unwrap()
        );
        assert_eq!(utc_text(&micros), "2026-12-05 19:12:56.123456");
        assert_eq!(parse_opt(None).unwrap(), None);
    }

    #[test]
    fn other_text_is_an_error_naming_it() {
        let err = parse("yesterday").unwrap_err();
        assert!(err.to_string().contains("`yesterday`"), "{err}");
        assert!(parse("").is_err());
    }
}

//! How results are printed: a table for people, or one JSON document.

use crate::Fail;
use idem_runtime::outbox::admin::OutboxMessage;
use idem_runtime::timestamp::utc_text;
use serde::Serialize;
use std::borrow::Cow;

/// How results are printed.
#[derive(Clone, Copy)]
pub(crate) struct Out {
    /// JSON instead of text.
    pub(crate) json: bool,
}

impl Out {
    /// Prints `value` as JSON, or `text()`.
    pub(crate) fn emit<T: Serialize>(
        self,
        value: &T,
        text: impl FnOnce() -> String,
    ) -> Result<(), Fail> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(value)?);
        } else {
            print!("{}", text());
        }
        Ok(())
    }
}

/// Outbox messages as a table.
pub(crate) fn messages_table(messages: &[OutboxMessage]) -> String {
    let rows: Vec<Vec<String>> = messages
        .iter()
        .map(|m| {
            vec![
                m.id.to_string(),
                name(&m.topic).into_owned(),
                m.msg_id.clone(),
                m.status.clone(),
                m.attempts.to_string(),
                utc_text(&m.updated_at),
                shorten(m.last_error.as_deref().unwrap_or("-"), 60),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "TOPIC",
            "MSG_ID",
            "STATUS",
            "ATTEMPTS",
            "UPDATED_AT",
            "LAST_ERROR",
        ],
        &rows,
    )
}

/// A stored name (a topic) as a cell that shows it exactly: as is, unless
/// its spaces would hide in a column (at its ends, several in a row,
/// another kind of space, or it is empty or starts with a quote); then
/// quoted and escaped (`"pay "`, `" pay"`): topics are compared byte for
/// byte, so these are not `pay`.
pub(crate) fn name(v: &str) -> Cow<'_, str> {
    let hides = v.is_empty()
        || v.starts_with(char::is_whitespace)
        || v.ends_with(char::is_whitespace)
        || v.starts_with('"')
        || v.contains("  ")
        || v.chars().any(|c| c.is_whitespace() && c != ' ');
    if hides {
        Cow::Owned(format!("{v:?}"))
    } else {
        Cow::Borrowed(v)
    }
}

/// Columns padded to their widest cell, two spaces apart.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s += c;
            } else {
                s += &format!("{c:<w$}  ");
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut s = line(headers.to_vec());
    for row in rows {
        s += &line(row.iter().map(String::as_str).collect());
    }
    s
}

/// At most `max` characters, on one line.
pub(crate) fn shorten(s: &str, max: usize) -> String {
    let one_line = s.replace(['\n', '\r'], " ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        one_line.chars().take(max - 1).collect::<String>() + "…"
    }
}

/// A duration for people (`1d 2h`, `6m 42s 200ms`, `0s`): the runtime's printer.
pub(crate) use idem_runtime::duration::human;

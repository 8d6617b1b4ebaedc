//! The two wire protocols' framing, and what is a `COMMIT` or a `BEGIN`:
//! [`Framer`] splits a stream into frames without holding bytes back,
//! [`ClientInspector`] classifies the client's commands.

use super::{CAPTURE, Protocol};
use std::collections::HashMap;

/// One complete frame, as seen by a [`Framer`]: `tag` is PostgreSQL's
/// message type byte or MySQL's sequence id; `body` is the payload's first
/// bytes (up to the capture limit), `len` its full length.
pub(super) struct Frame<'a> {
    pub(super) tag: u8,
    pub(super) len: usize,
    pub(super) body: &'a [u8],
}

/// Splits a byte stream into frames without holding bytes back: the caller
/// forwards every chunk it feeds; the framer remembers where frames start
/// and keeps each body's first `capture` bytes.
pub(super) struct Framer {
    pub(super) protocol: Protocol,
    pub(super) header: [u8; 5],
    pub(super) header_len: usize,
    pub(super) tag: u8,
    pub(super) len: usize,
    pub(super) remaining: usize,
    pub(super) in_body: bool,
    pub(super) capture: usize,
    pub(super) body: Vec<u8>,
}

impl Framer {
    pub(super) fn new(protocol: Protocol, capture: usize) -> Framer {
        Framer {
            protocol,
            header: [0; 5],
            header_len: 0,
            tag: 0,
            len: 0,
            remaining: 0,
            in_body: false,
            capture,
            body: Vec::with_capacity(capture.min(CAPTURE)),
        }
    }

    pub(super) fn header_size(&self) -> usize {
        match self.protocol {
            Protocol::Postgres => 5, // type byte + Int32 length
            Protocol::MySql => 4,    // 3-byte length + sequence id
        }
    }

    pub(super) fn feed(&mut self, mut data: &[u8], mut on_frame: impl FnMut(&Frame<'_>)) {
        loop {
            if !self.in_body {
                let need = self.header_size() - self.header_len;
                if data.is_empty() {
                    return;
                }
                let take = need.min(data.len());
                self.header[self.header_len..self.header_len + take].copy_from_slice(&data[..take]);
                self.header_len += take;
                data = &data[take..];
                if self.header_len < self.header_size() {
                    return;
                }
                let h = self.header;
                (self.tag, self.len) = match self.protocol {
                    Protocol::Postgres => {
                        let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
                        (h[0], len.saturating_sub(4))
                    }
                    Protocol::MySql => (h[3], u32::from_le_bytes([h[0], h[1], h[2], 0]) as usize),
                };
                self.header_len = 0;
                self.remaining = self.len;
                self.in_body = true;
                self.body.clear();
            }
            let take = self.remaining.min(data.len());
            let keep = take.min(self.capture.saturating_sub(self.body.len()));
            self.body.extend_from_slice(&data[..keep]);
            self.remaining -= take;
            data = &data[take..];
            if self.remaining > 0 {
                return;
            }
            self.in_body = false;
            on_frame(&Frame {
                tag: self.tag,
                len: self.len,
                body: &self.body,
            });
        }
    }
}

/// Finds the `COMMIT`s in the client's stream (after PostgreSQL's startup).
pub(super) struct ClientInspector {
    pub(super) protocol: Protocol,
    pub(super) framer: Framer,
    /// A TLS stream or an unknown protocol: nothing more is inspected.
    pub(super) passthrough: bool,
    /// MySQL: whether the next packet is the handshake response.
    pub(super) first_packet: bool,
    /// MySQL: the previous packet had the maximum length, so this one
    /// continues it.
    pub(super) continuation: bool,
    /// PostgreSQL: prepared statement name -> what its query is.
    pub(super) statements: HashMap<Vec<u8>, Kind>,
    /// PostgreSQL: portal name -> what its statement is.
    pub(super) portals: HashMap<Vec<u8>, Kind>,
}

/// What a statement is, as far as the proxy cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Commit,
    Begin,
    Savepoint,
    Other,
}

impl Kind {
    pub(super) fn of_sql(sql: &[u8]) -> Kind {
        if is_commit_sql(sql) {
            Kind::Commit
        } else if is_begin_sql(sql) {
            Kind::Begin
        } else if first_word_is(sql, "SAVEPOINT") {
            Kind::Savepoint
        } else {
            Kind::Other
        }
    }
}

/// The statements of interest completed in a chunk of the client's stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Seen {
    pub(super) commits: u64,
    pub(super) begins: u64,
    pub(super) savepoints: u64,
}

impl Seen {
    pub(super) fn add(&mut self, kind: Kind) {
        match kind {
            Kind::Commit => self.commits += 1,
            Kind::Begin => self.begins += 1,
            Kind::Savepoint => self.savepoints += 1,
            Kind::Other => {}
        }
    }
}

impl ClientInspector {
    pub(super) fn new(protocol: Protocol) -> ClientInspector {
        ClientInspector {
            protocol,
            framer: Framer::new(protocol, CAPTURE),
            passthrough: false,
            first_packet: true,
            continuation: false,
            statements: HashMap::new(),
            portals: HashMap::new(),
        }
    }

    /// Inspects a chunk of the client's stream; returns how many `COMMIT`s
    /// and `BEGIN`s were completed in it.
    pub(super) fn feed(&mut self, chunk: &[u8]) -> Seen {
        let mut seen = Seen::default();
        if self.passthrough {
            return seen;
        }
        let mut frames = std::mem::replace(&mut self.framer, Framer::new(self.protocol, 0));
        frames.feed(chunk, |frame| seen.add(self.on_frame(frame)));
        self.framer = frames;
        seen
    }

    pub(super) fn on_frame(&mut self, frame: &Frame<'_>) -> Kind {
        if self.passthrough {
            return Kind::Other;
        }
        match self.protocol {
            Protocol::Postgres => self.on_pg_message(frame),
            Protocol::MySql => self.on_mysql_packet(frame),
        }
    }

    pub(super) fn on_mysql_packet(&mut self, frame: &Frame<'_>) -> Kind {
        const CLIENT_SSL: u32 = 0x0800;
        const COM_QUERY: u8 = 0x03;
        let continuation = std::mem::replace(&mut self.continuation, frame.len == 0xFF_FFFF);
        if std::mem::replace(&mut self.first_packet, false) {
            // The handshake response (or SSL request): if the client asks
            // for TLS, the rest of the stream is opaque.
            if frame.body.len() >= 4 {
                let caps = u32::from_le_bytes(frame.body[0..4].try_into().unwrap());
                if caps & CLIENT_SSL != 0 {
                    self.passthrough = true;
                }
            }
            return Kind::Other;
        }
        // Commands start a new sequence (id 0); handshake and
        // authentication packets never have sequence id 0.
        if !continuation
            && frame.tag == 0
            && frame.len == frame.body.len()
            && frame.body.first() == Some(&COM_QUERY)
        {
            Kind::of_sql(&frame.body[1..])
        } else {
            Kind::Other
        }
    }

    pub(super) fn on_pg_message(&mut self, frame: &Frame<'_>) -> Kind {
        let complete = frame.len == frame.body.len();
        let mut fields = frame.body.split(|&b| b == 0);
        match frame.tag {
            // Query: SQL text, NUL-terminated.
            b'Q' => {
                // A simple query also destroys the unnamed portal.
                self.portals.remove(&b""[..]);
                if complete {
                    Kind::of_sql(fields.next().unwrap_or_default())
                } else {
                    Kind::Other
                }
            }
            // Parse: statement name, query, parameter types.
            b'P' => {
                let name = fields.next().unwrap_or_default().to_vec();
                // A query cut off by the capture limit is too long to be
                // COMMIT; a BEGIN that long is not worth holding.
                let kind = if complete {
                    Kind::of_sql(fields.next().unwrap_or_default())
                } else {
                    Kind::Other
                };
                self.statements.insert(name, kind);
                Kind::Other
            }
            // Bind: portal name, statement name, ...
            b'B' => {
                let portal = fields.next().unwrap_or_default().to_vec();
                let statement = fields.next().unwrap_or_default();
                let kind = self
                    .statements
                    .get(statement)
                    .copied()
                    .unwrap_or(Kind::Other);
                self.portals.insert(portal, kind);
                Kind::Other
            }
            // Execute: portal name, row limit.
            b'E' => {
                let portal = fields.next().unwrap_or_default();
                self.portals.get(portal).copied().unwrap_or(Kind::Other)
            }
            // Close: 'S' statement / 'P' portal, then the name.
            b'C' => {
                if let Some((&kind, rest)) = frame.body.split_first() {
                    let name = rest.split(|&b| b == 0).next().unwrap_or_default();
                    match kind {
                        b'S' => {
                            self.statements.remove(name);
                        }
                        b'P' => {
                            self.portals.remove(name);
                        }
                        _ => {}
                    }
                }
                Kind::Other
            }
            _ => Kind::Other,
        }
    }
}

/// Whether SQL text is a plain `COMMIT` (case-insensitive, surrounding
/// white space and one trailing `;` allowed; `COMMIT WORK` and
/// `COMMIT TRANSACTION` too, but not `COMMIT AND CHAIN` or
/// `COMMIT PREPARED`).
pub(super) fn is_commit_sql(sql: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(sql) else {
        return false;
    };
    let text = text.trim();
    let text = text.strip_suffix(';').unwrap_or(text).trim_end();
    let mut words = text.split_ascii_whitespace();
    let first = words
        .next()
        .is_some_and(|w| w.eq_ignore_ascii_case("COMMIT"));
    match (first, words.next(), words.next()) {
        (true, None, _) => true,
        (true, Some(w), None) => {
            w.eq_ignore_ascii_case("WORK") || w.eq_ignore_ascii_case("TRANSACTION")
        }
        _ => false,
    }
}

/// Whether SQL text starts with `word` (case-insensitive), e.g. a
/// `SAVEPOINT name`.
fn first_word_is(sql: &[u8], word: &str) -> bool {
    std::str::from_utf8(sql).is_ok_and(|text| {
        text.split_ascii_whitespace()
            .next()
            .is_some_and(|w| w.eq_ignore_ascii_case(word))
    })
}

/// Whether SQL text opens a transaction: `BEGIN` or `START TRANSACTION`,
/// with any modifiers (`BEGIN IMMEDIATE`, `BEGIN ISOLATION LEVEL …`,
/// `START TRANSACTION READ ONLY`), case-insensitive, one trailing `;`.
pub(super) fn is_begin_sql(sql: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(sql) else {
        return false;
    };
    let text = text.trim();
    let text = text.strip_suffix(';').unwrap_or(text).trim_end();
    if text.contains(';') {
        return false;
    }
    let mut words = text.split_ascii_whitespace();
    match words.next() {
        Some(w) if w.eq_ignore_ascii_case("BEGIN") => true,
        Some(w) if w.eq_ignore_ascii_case("START") => words
            .next()
            .is_some_and(|w| w.eq_ignore_ascii_case("TRANSACTION")),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn begin_statements() {
        for sql in [
            "BEGIN",
            "begin;",
            " BEGIN IMMEDIATE ",
            "BEGIN ISOLATION LEVEL SERIALIZABLE",
            "START TRANSACTION",
            "start transaction read only;",
        ] {
            assert!(is_begin_sql(sql.as_bytes()), "{sql}");
            assert_eq!(Kind::of_sql(sql.as_bytes()), Kind::Begin, "{sql}");
        }
        for sql in [
            "COMMIT",
            "BEGINS",
            "START",
            "SELECT 1",
            "BEGIN; COMMIT",
            "DO $$ BEGIN END $$",
        ] {
            assert!(!is_begin_sql(sql.as_bytes()), "{sql}");
        }
        assert_eq!(Kind::of_sql(b"COMMIT"), Kind::Commit);
    }
}

//! Durations, in idem's one grammar: a number and its unit (`ms`, `s`,
//! `m`, `h`, `d`), one or more of them (`30s`, `7d`, `500ms`, `1d 12h`),
//! never a bare number. The `idem` command line's flags, the console's
//! and the `#[idempotent]` attribute's `ttl` read it with [`parse`]; the
//! runtime's messages (a
//! `RetentionPolicy` (`idem_runtime::archive`) that is too short)
//! and the command line's output print it with [`human`], which `parse`
//! reads back. The guide's
//! [durations](https://docs.rs/idem-runtime/latest/idem_runtime/guide/attributes/index.html#durations) has the grammar.

pub use idem_syntax::duration::{DurationError, human, parse};

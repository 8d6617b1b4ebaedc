//! # The coupon double-deduction incident, replayed at peak
//!
//! The article's fault version and an `#[idempotent(strategy =
//! state_machine)]` handler drain the same orders under lost commit
//! acknowledgements and concurrent redeliveries; see
//! [`idem_examples::coupon`] for the whole story and the output.
//!
//! ```text
//! cargo run -p idem-examples --bin coupon              # SQLite, in a temporary file
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p idem-examples --bin coupon
//! DATABASE_URL=mysql://root@127.0.0.1:3306/test cargo run -p idem-examples --bin coupon
//! ```
//!
//! Exit status 1 if the `#[idempotent]` handler deducts a coupon twice or
//! loses a deduction, 2 on a setup error.

use clap::Parser;
use idem_examples::coupon::{self, Args};
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    match coupon::run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

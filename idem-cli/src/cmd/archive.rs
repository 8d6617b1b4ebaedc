//! `idem archive`, through [`idem_runtime::archive::Archiver`].

use crate::Fail;
use crate::opt::ArchiveArgs;
use crate::output::{Out, human};
use idem_runtime::archive::{ArchiveReport, Archiver};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use sqlx::AnyPool;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

#[derive(Serialize)]
struct ArchiveOutput {
    #[serde(flatten)]
    report: ArchiveReport,
    elapsed_secs: f64,
}

pub(crate) async fn run(pool: &AnyPool, args: ArchiveArgs, out: Out) -> Result<(), Fail> {
    if args.batch == 0 || args.batch > 10_000 {
        return Err(Fail::usage("--batch must be between 1 and 10000"));
    }
    let archiver = Archiver::new(pool.clone())
        .batch_size(args.batch)
        .outbox_retention(args.outbox_retention)
        .pause(args.pause);
    let bar = if out.json || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{spinner} archiving [{elapsed}] {msg}") {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(100));
        bar
    };
    bar.set_message("records 0, outbox 0, batches 0");
    let start = Instant::now();
    let result = archiver
        .run_once(|r| {
            bar.set_message(format!(
                "records {}, outbox {}, batches {}",
                r.records, r.outbox, r.batches
            ));
        })
        .await;
    bar.finish_and_clear();
    let report = result?;
    let output = ArchiveOutput {
        report,
        elapsed_secs: start.elapsed().as_secs_f64(),
    };
    out.emit(&output, || {
        format!(
            "archived {} record(s) to idem_record_history and {} outbox message(s) to \
             idem_outbox_history in {} batch(es), {}\n",
            report.records,
            report.outbox,
            report.batches,
            human(start.elapsed())
        )
    })
}

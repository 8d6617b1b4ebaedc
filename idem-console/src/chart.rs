//! The overview's live chart: the backlog (pending messages, sampled by
//! the console every few seconds) and deliveries per second (read from the
//! database's success times, so it needs no history of its own) over the
//! last minutes, drawn as inline SVG.

use crate::Inner;
use crate::read::{READ_TIMEOUT, SCAN_TIMEOUT, bounded};
use idem_runtime::Operable;
use idem_runtime::outbox::admin;
use maud::{Markup, PreEscaped};
use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::Weak;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How far back the chart looks.
pub(crate) const WINDOW: Duration = Duration::from_secs(600);
/// The width of one deliveries bucket.
pub(crate) const BUCKET: Duration = Duration::from_secs(10);
/// The most backlog points the chart keeps over its window, however
/// short the sampling interval: one per 2 s over 10 minutes.
pub(crate) const MAX_POINTS: usize = 300;

/// The backlog as sampled: `(unix seconds, pending messages)`, oldest
/// first, no older than the window, at most [`MAX_POINTS`] (and the
/// newest). Only the sampler adds to it: a page view reads it.
#[derive(Debug, Clone)]
pub(crate) struct Samples {
    window: Duration,
    points: VecDeque<(f64, i64)>,
}

pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Samples {
    pub(crate) fn new(window: Duration) -> Self {
        Samples {
            window,
            points: VecDeque::new(),
        }
    }

    /// Records `pending` at `at` and forgets what fell out of the window.
    /// Points closer than a [`MAX_POINTS`]th of the window to the one
    /// before replace the newest instead of adding one, so the chart holds
    /// at most `MAX_POINTS` and the newest however often it is sampled.
    pub(crate) fn push(&mut self, at: f64, pending: i64) {
        let spacing = self.window.as_secs_f64() / MAX_POINTS as f64;
        let n = self.points.len();
        match (
            n.checked_sub(2).map(|i| self.points[i]),
            self.points.back_mut(),
        ) {
            (Some((before, _)), Some(newest)) if at - before < spacing => {
                *newest = (at, pending);
            }
            _ => self.points.push_back((at, pending)),
        }
        let horizon = at - self.window.as_secs_f64();
        while self.points.front().is_some_and(|(t, _)| *t < horizon)
            || self.points.len() > MAX_POINTS + 1
        {
            self.points.pop_front();
        }
    }

    /// The samples, oldest first.
    pub(crate) fn points(&self) -> impl Iterator<Item = (f64, i64)> + '_ {
        self.points.iter().copied()
    }
}

/// Samples the backlog until the console is gone.
pub(crate) fn spawn_sampler<DB: Operable>(console: Weak<Inner<DB>>) {
    tokio::spawn(async move {
        loop {
            let Some(c) = console.upgrade() else { return };
            let every = c.sample_every;
            // Half an interval: a page that just read the backlog serves
            // the sample too.
            let fresh = every / 2;
            let backlog = c
                .figures
                .backlog
                .get(fresh, || {
                    bounded(READ_TIMEOUT, admin::backlog(&c.pool, None))
                })
                .await;
            // The delivered counts are refreshed here, so that pages and
            // scrapes find them read (see `Inner::stats`).
            if let Err(e) = c
                .figures
                .counts
                .get(every, || bounded(SCAN_TIMEOUT, admin::stats(&c.pool, None)))
                .await
            {
                tracing::debug!(error = %e, "idem console: counting the outbox failed");
            }
            match backlog {
                Ok(s) => {
                    if let Ok(mut samples) = c.samples.lock() {
                        samples.push(unix_now(), s.totals.pending);
                    }
                }
                Err(e) => tracing::debug!(error = %e, "idem console: backlog sample failed"),
            }
            drop(c);
            tokio::time::sleep(every).await;
        }
    });
}

const W: f64 = 720.0;
const H: f64 = 180.0;
const PAD_L: f64 = 48.0;
const PAD_R: f64 = 48.0;
const PAD_T: f64 = 12.0;
const PAD_B: f64 = 24.0;

/// A round upper bound for an axis.
fn nice_max(v: f64) -> f64 {
    if v <= 1.0 {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if v <= m * mag {
            return m * mag;
        }
    }
    10.0 * mag
}

/// The chart: `backlog` as sampled, `deliveries` per bucket (oldest
/// first, [`BUCKET`] wide, ending now), at `now`.
pub(crate) fn svg(backlog: &Samples, deliveries: &[u64], now: f64) -> Markup {
    let span = WINDOW.as_secs_f64();
    let x = |t: f64| PAD_L + (W - PAD_L - PAD_R) * ((t - (now - span)) / span).clamp(0.0, 1.0);
    let plot_h = H - PAD_T - PAD_B;
    // Whole messages: at least 5, so the five grid steps are whole too.
    let max_backlog = nice_max(backlog.points().map(|(_, p)| p as f64).fold(5.0, f64::max));
    let rates: Vec<f64> = deliveries
        .iter()
        .map(|n| *n as f64 / BUCKET.as_secs_f64())
        .collect();
    let max_rate = nice_max(rates.iter().copied().fold(0.0, f64::max));
    let y = |v: f64, max: f64| PAD_T + plot_h * (1.0 - (v / max).clamp(0.0, 1.0));

    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg id="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" role="img" aria-label="backlog and deliveries per second, last {m} minutes">"#,
        m = span / 60.0
    );
    // Grid and axes' labels.
    for i in 0..=5 {
        let f = f64::from(i) / 5.0;
        let gy = PAD_T + plot_h * (1.0 - f);
        let _ = write!(
            s,
            r#"<line class="grid" x1="{PAD_L}" x2="{}" y1="{gy:.1}" y2="{gy:.1}"/><text class="axis backlog" x="{}" y="{:.1}" text-anchor="end">{}</text><text class="axis rate" x="{}" y="{:.1}">{}</text>"#,
            W - PAD_R,
            PAD_L - 4.0,
            gy + 4.0,
            trim(max_backlog * f),
            W - PAD_R + 4.0,
            gy + 4.0,
            trim(max_rate * f),
        );
    }
    for minutes in (0..=10).step_by(2) {
        let t = now - f64::from(minutes) * 60.0;
        let label = if minutes == 0 {
            "now".to_string()
        } else {
            format!("-{minutes}m")
        };
        let _ = write!(
            s,
            r#"<text class="axis" x="{:.1}" y="{}" text-anchor="middle">{label}</text>"#,
            x(t),
            H - 6.0
        );
    }
    // Deliveries per second: one point per bucket, at its end.
    let n = rates.len();
    let rate_points: Vec<String> = rates
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let end = now - (n - 1 - i) as f64 * BUCKET.as_secs_f64();
            format!("{:.1},{:.1}", x(end), y(*r, max_rate))
        })
        .collect();
    let _ = write!(
        s,
        r#"<polyline class="rate" fill="none" points="{}"/>"#,
        rate_points.join(" ")
    );
    let backlog_points: Vec<String> = backlog
        .points()
        .map(|(t, p)| format!("{:.1},{:.1}", x(t), y(p as f64, max_backlog)))
        .collect();
    let _ = write!(
        s,
        r#"<polyline class="backlog" fill="none" points="{}"/>"#,
        backlog_points.join(" ")
    );
    s.push_str("</svg>");
    PreEscaped(s)
}

fn trim(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_forget_what_left_the_window() {
        let mut s = Samples::new(Duration::from_secs(10));
        s.push(100.0, 1);
        s.push(105.0, 2);
        s.push(111.0, 3);
        assert_eq!(s.points().collect::<Vec<_>>(), vec![(105.0, 2), (111.0, 3)]);
    }

    #[test]
    fn samples_are_bounded_however_often_they_are_taken() {
        let mut s = Samples::new(WINDOW);
        // Every 10 ms for the whole window: 60,000 samples.
        for i in 0..60_000 {
            s.push(f64::from(i) / 100.0, i64::from(i));
        }
        let points: Vec<_> = s.points().collect();
        assert!(points.len() <= MAX_POINTS + 1, "{}", points.len());
        assert!(points.len() >= MAX_POINTS - 1, "{}", points.len());
        assert_eq!(points.last(), Some(&(599.99, 59_999)), "the newest is kept");
        // Sampled every 2 s: every sample is a point.
        let mut s = Samples::new(WINDOW);
        for i in 0..10 {
            s.push(f64::from(i) * 2.0, 1);
        }
        assert_eq!(s.points().count(), 10);
    }

    #[test]
    fn the_chart_is_svg_of_numbers_only() {
        let mut s = Samples::new(WINDOW);
        s.push(1000.0, 40);
        s.push(1002.0, 12);
        let svg = svg(&s, &[0, 20, 35], 1002.0).into_string();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains(">50<"), "the backlog axis tops at 50: {svg}");
        assert!(svg.contains(">10<"), "in steps of 10: {svg}");
        assert!(svg.contains(">5<"), "3.5/s tops at 5: {svg}");
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(101.0), 200.0);
    }
}

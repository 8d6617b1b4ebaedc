//! The chart: horizontal bars of msg/s per variant, written as plain SVG
//! (no plotting crate, no fonts to find: the viewer renders the text).

use std::fmt::Write;

/// One bar.
#[derive(Debug, Clone)]
pub(crate) struct Bar {
    pub(crate) group: String,
    pub(crate) label: String,
    pub(crate) rate: f64,
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The SVG of `bars` (grouped in order of appearance), titled `title`,
/// with `note` under it.
pub(crate) fn svg(title: &str, note: &str, bars: &[Bar]) -> String {
    const LEFT: f64 = 230.0;
    const WIDTH: f64 = 460.0;
    const ROW: f64 = 26.0;
    let max = bars.iter().map(|b| b.rate).fold(1.0, f64::max);
    let mut groups: Vec<&str> = Vec::new();
    for b in bars {
        if !groups.contains(&b.group.as_str()) {
            groups.push(&b.group);
        }
    }
    let height = 70.0 + ROW * (bars.len() + groups.len()) as f64 + 10.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" viewBox="0 0 {w} {height}" font-family="sans-serif" font-size="13">"#,
        w = LEFT + WIDTH + 90.0
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="10" y="22" font-size="16" font-weight="bold">{}</text>"#,
        escape(title)
    );
    let _ = writeln!(
        s,
        r##"<text x="10" y="42" font-size="11" fill="#555">{}</text>"##,
        escape(note)
    );
    let mut y = 60.0;
    for g in groups {
        y += ROW;
        let _ = writeln!(
            s,
            r#"<text x="10" y="{:.0}" font-weight="bold">{}</text>"#,
            y - 8.0,
            escape(g)
        );
        for b in bars.iter().filter(|b| b.group == g) {
            let w = (b.rate / max * WIDTH).max(1.0);
            let fill = if b.label.starts_with("idem") {
                "#2b6cb0"
            } else {
                "#a0aec0"
            };
            let _ = writeln!(
                s,
                r#"<text x="{:.0}" y="{:.0}" text-anchor="end">{}</text>"#,
                LEFT - 8.0,
                y + 13.0,
                escape(&b.label)
            );
            let _ = writeln!(
                s,
                r#"<rect x="{LEFT}" y="{:.0}" width="{w:.1}" height="{:.0}" fill="{fill}"/>"#,
                y + 2.0,
                ROW - 8.0
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.0}">{:.0} msg/s</text>"#,
                LEFT + w + 6.0,
                y + 13.0,
                b.rate
            );
            y += ROW;
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_largest() {
        let bars = [
            Bar {
                group: "PostgreSQL".into(),
                label: "idem per-message".into(),
                rate: 1000.0,
            },
            Bar {
                group: "PostgreSQL".into(),
                label: "sqlxmq <0.6>".into(),
                rate: 500.0,
            },
            Bar {
                group: "SQLite".into(),
                label: "idem per-message".into(),
                rate: 250.0,
            },
        ];
        let s = svg("t", "n", &bars);
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert!(s.contains(r#"width="460.0""#) && s.contains(r#"width="230.0""#));
        assert!(s.contains("sqlxmq &lt;0.6&gt;") && s.contains("1000 msg/s"));
        assert_eq!(s.matches("<rect x=").count(), 3);
    }
}

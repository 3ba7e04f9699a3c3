//! A self-contained HTML report (inline SVG plots drawn with `plotters`, inline CSS, no scripts,
//! no external assets), so operators can open it on the appliance with no network.

use std::fmt::Write as _;

use plotters::prelude::*;

use crate::gate::{HEADLINE, Report, Summary};

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Grouped bars: one group per label, one bar per series, values in [0, max].
fn bars(title: &str, labels: &[String], series: &[(&str, Vec<f64>)], max: f64) -> String {
    let mut svg = String::new();
    {
        let width = 140 + 60 * labels.len().max(1) as u32 * series.len().max(1) as u32 / 2;
        let root =
            SVGBackend::with_string(&mut svg, (width.clamp(480, 1100), 320)).into_drawing_area();
        let draw = || -> Result<(), Box<dyn std::error::Error + '_>> {
            root.fill(&WHITE)?;
            let n = labels.len().max(1);
            let mut chart = ChartBuilder::on(&root)
                .caption(title, ("sans-serif", 18))
                .margin(10)
                .x_label_area_size(40)
                .y_label_area_size(50)
                .build_cartesian_2d(0f64..n as f64, 0f64..max)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(n)
                .x_label_formatter(&|x| {
                    let i = x.floor() as usize;
                    labels.get(i).cloned().unwrap_or_default()
                })
                .draw()?;
            let k = series.len().max(1) as f64;
            for (si, (name, values)) in series.iter().enumerate() {
                let color = Palette99::pick(si).to_rgba();
                chart
                    .draw_series(values.iter().enumerate().map(|(i, &v)| {
                        let x0 = i as f64 + 0.1 + 0.8 * si as f64 / k;
                        let x1 = x0 + 0.8 / k;
                        Rectangle::new([(x0, 0.0), (x1, v.max(0.0))], color.filled())
                    }))?
                    .label(*name)
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled())
                    });
            }
            chart
                .configure_series_labels()
                .border_style(BLACK)
                .background_style(WHITE.mix(0.8))
                .draw()?;
            root.present()?;
            Ok(())
        };
        if let Err(e) = draw() {
            return format!("<p>plot failed: {}</p>", escape(&e.to_string()));
        }
    }
    svg
}

fn mean(s: &Summary, m: &str) -> f64 {
    s.metrics.get(m).map_or(0.0, |e| e.mean)
}

fn summary_table(out: &mut String, rows: &[(String, &Summary)]) {
    out.push_str("<table><tr><th>group</th><th>cases</th><th>leaking</th>");
    for m in HEADLINE {
        let _ = write!(out, "<th>{m}</th>");
    }
    out.push_str("</tr>");
    for (name, s) in rows {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td class=\"{}\">{}</td>",
            escape(name),
            s.cases,
            if s.leaking_cases > 0 { "bad" } else { "ok" },
            s.leaking_cases
        );
        for m in HEADLINE {
            match s.metrics.get(m) {
                Some(e) => {
                    let _ = write!(
                        out,
                        "<td>{:.3}<small> [{:.3}, {:.3}]</small></td>",
                        e.mean, e.lo, e.hi
                    );
                }
                None => out.push_str("<td>–</td>"),
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em;color:#111}table{border-collapse:collapse;margin:1em 0}\
td,th{border:1px solid #bbb;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}\
small{color:#555}.bad{background:#fdd;font-weight:bold}.ok{background:#dfd}svg{display:block;margin:1em 0}";

/// Renders one report as a standalone HTML page.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Airlock eval: {set}</title>\
         <style>{STYLE}</style></head><body><h1>Airlock eval: {set}</h1>\
         <p>bundle <code>{ver}</code>, rung {rung}, {n} cases, <strong>{leaks} leaking</strong></p>",
        set = escape(&report.set),
        ver = escape(report.bundle_version.as_deref().unwrap_or("?")),
        rung = report.rung.map_or("auto".into(), |r| r.to_string()),
        n = report.overall.cases,
        leaks = report.leaks(),
    );
    let mut rows = vec![("all".to_owned(), &report.overall)];
    rows.extend(
        report
            .per_kind
            .iter()
            .map(|(k, s)| (format!("kind {k}"), s)),
    );
    rows.extend(
        report
            .per_phase
            .iter()
            .map(|(k, s)| (format!("phase {k}"), s)),
    );
    summary_table(&mut out, &rows);

    let kinds: Vec<String> = report.per_kind.keys().cloned().collect();
    let per_kind = |m: &'static str| -> (&'static str, Vec<f64>) {
        (m, report.per_kind.values().map(|s| mean(s, m)).collect())
    };
    out.push_str(&bars(
        "Quality per case kind",
        &kinds,
        &[
            per_kind("ndcg_10"),
            per_kind("answer_hit_rate"),
            per_kind("citation_precision"),
            per_kind("abstention_rate"),
        ],
        1.0,
    ));
    if !report.latency_ms.is_empty() {
        let stages: Vec<String> = report.latency_ms.keys().cloned().collect();
        let pick = |q: &str| -> Vec<f64> {
            report
                .latency_ms
                .values()
                .map(|m| m.get(q).copied().unwrap_or(0.0))
                .collect()
        };
        let (p50, p95) = (pick("p50"), pick("p95"));
        let max = p95.iter().copied().fold(1.0, f64::max) * 1.1;
        out.push_str(&bars(
            "Latency per stage (ms)",
            &stages,
            &[("p50", p50), ("p95", p95)],
            max,
        ));
    }
    out.push_str("<h2>Cases</h2><table><tr><th>id</th><th>kind</th><th>phase</th><th>nDCG@10</th><th>answer</th><th>leaks</th></tr>");
    for c in &report.cases {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td></tr>",
            escape(&c.id),
            escape(&c.kind),
            escape(&c.phase),
            c.ndcg_10.map_or("–".into(), |v| format!("{v:.3}")),
            match (c.answer_hit, c.abstained) {
                (Some(true), _) => "hit",
                (Some(false), _) => "miss",
                (None, Some(true)) => "abstained",
                (None, Some(false)) => "answered",
                (None, None) => "–",
            },
            if c.leaks.is_empty() { "ok" } else { "bad" },
            escape(
                &c.leaks
                    .iter()
                    .map(|l| format!("{}: {}", l.kind, l.what))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        );
    }
    out.push_str("</table></body></html>\n");
    out
}

/// Renders the per-rung quality comparison as a standalone HTML page.
pub fn render_rungs(reports: &[Report]) -> String {
    let labels: Vec<String> = reports
        .iter()
        .map(|r| r.rung.map_or("auto".into(), |x| format!("rung {x}")))
        .collect();
    let series: Vec<(&str, Vec<f64>)> = HEADLINE
        .iter()
        .filter(|m| reports.iter().any(|r| r.overall.metrics.contains_key(**m)))
        .map(|&m| (m, reports.iter().map(|r| mean(&r.overall, m)).collect()))
        .collect();
    let mut out = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Airlock eval per rung</title>\
         <style>{STYLE}</style></head><body><h1>Quality per ladder rung</h1>"
    );
    let rows: Vec<(String, &Summary)> = labels
        .iter()
        .cloned()
        .zip(reports.iter().map(|r| &r.overall))
        .collect();
    summary_table(&mut out, &rows);
    out.push_str(&bars("Headline metrics per rung", &labels, &series, 1.0));
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::metrics::{CaseScore, Leak};

    #[test]
    fn html_is_self_contained_escaped_and_has_plots() {
        let case = CaseScore {
            id: "<script>x</script>".into(),
            kind: "answerable".into(),
            phase: "v1".into(),
            ndcg_10: Some(0.5),
            recall_10: Some(1.0),
            recall_100: None,
            mrr_10: Some(1.0),
            answer_hit: Some(true),
            citation_precision: Some(1.0),
            citation_recall: Some(1.0),
            abstained: None,
            leaks: vec![Leak {
                kind: "string_in_answer".into(),
                what: "<b>".into(),
            }],
            error: None,
            retrieved: vec!["doc-1".into()],
            cited: vec!["doc-1".into()],
            answer: Some("<i>answer</i>".into()),
            invented_values: None,
            answer_words: None,
        };
        let lat = BTreeMap::from([("chat.total".to_owned(), vec![10.0, 20.0, 30.0])]);
        let r = Report::new("t", None, Some(1), vec![case], &lat);
        let html = render(&r);
        assert!(html.contains("<svg"), "has a plot");
        assert!(!html.contains("<script"), "no scripts, ids escaped");
        assert!(html.contains("&lt;script&gt;"));
        assert!(!html.contains("src=\"http"), "no external assets");
        let rungs = render_rungs(&[r.clone(), r]);
        assert!(rungs.contains("rung 1") && rungs.contains("<svg"));
    }
}

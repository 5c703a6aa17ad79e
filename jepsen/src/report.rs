//! `report.html`: one self-contained page (inline SVG and CSS, no scripts or links) with the
//! verdict, each checker's counts and problems, the schedule, the longest delivery gap per
//! fault, and a timeline: one lane per node with its faults, one lane per worker with its faults
//! (process faults, its links to the dispatchers, the readers' links to it) and the moments the
//! dispatcher removed it, a lane with the trainer's kills (with the trainer nemesis), a lane with
//! the leader of the moment, and elements received per
//! second with the longer delivery gaps marked.

use crate::checker::gaps::{fault_spans, DeliveryGaps};
use crate::checker::{CheckResult, Verdict};
use crate::history::{Event, Kind};
use crate::schedule::{NemesisKind, Schedule};
use std::collections::BTreeMap;
use std::fmt::Write;

const WIDTH: f64 = 1100.0;
const LEFT: f64 = 110.0;
const LANE: f64 = 26.0;
/// Delivery gaps at least this long are marked on the throughput lane.
const GAP_DRAWN_MS: u64 = 500;

fn color(kind: &str) -> &'static str {
    match kind {
        "kill" => "#d62728",
        "pause" => "#ff7f0e",
        "partition" => "#9467bd",
        "restart" => "#1f77b4",
        "worker-kill" => "#8c1c13",
        "worker-pause" => "#c77c02",
        "worker-restart" => "#0b4f8a",
        "worker-partition" => "#5b3a87",
        "reader-partition" => "#138d75",
        "trainer" => "#e377c2",
        _ => "#7f7f7f",
    }
}

fn node_color(node: u64) -> &'static str {
    [
        "#2ca02c", "#17becf", "#bcbd22", "#e377c2", "#8c564b", "#7f7f7f",
    ][(node as usize) % 6]
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A fault as drawn: its kind, its lanes (index and name), its start and end.
type Span = (String, Vec<(u64, String)>, u64, u64);

/// The lanes a fault is drawn in: its nodes (`nodes`), then its workers (`workers`), after
/// the node lanes; a trainer kill in the trainer's lane (`trainer_lane`).
fn lanes_of(
    value: &serde_json::Value,
    nodes: u64,
    trainer_lane: Option<u64>,
) -> Vec<(u64, String)> {
    if value["action"]["kind"] == "trainer-kill" {
        return trainer_lane
            .map(|lane| (lane, "trainer".to_string()))
            .into_iter()
            .collect();
    }
    let ids = |key: &str| -> Vec<u64> {
        value[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_u64())
            .collect()
    };
    let on_nodes = ids("nodes").into_iter().map(|n| (n, format!("node {n}")));
    let on_workers = ids("workers")
        .into_iter()
        .map(|w| (nodes + w, format!("worker {w}")));
    on_nodes.chain(on_workers).collect()
}

pub fn render(
    events: &[Event],
    schedule: &Schedule,
    results: &[CheckResult],
    verdict: Verdict,
    gaps: &DeliveryGaps,
    delivery: &str,
) -> String {
    let end_ms = events.last().map(|e| e.t_ms).unwrap_or(1).max(1);
    let x = |t: u64| LEFT + (WIDTH - LEFT - 10.0) * t as f64 / end_ms as f64;
    let nodes = schedule.nodes;
    let trainer_lane = schedule
        .nemeses
        .contains(&NemesisKind::Trainer)
        .then_some(nodes + u64::from(schedule.workers) + 1);
    let lanes = trainer_lane.unwrap_or(nodes + u64::from(schedule.workers));
    let mut svg = String::new();

    // Fault spans: (fault id) -> (kind, lanes, start, end)
    let starts: BTreeMap<u64, &Event> = events
        .iter()
        .filter(|e| e.process == "nemesis" && e.kind == Kind::Ok && e.f != "recover")
        .filter_map(|e| Some((e.value["fault"].as_u64()?, e)))
        .collect();
    let spans: BTreeMap<u64, Span> = fault_spans(events, end_ms)
        .into_iter()
        .map(|(id, kind, start, stop)| {
            let hit = starts
                .get(&id)
                .map(|e| lanes_of(&e.value, nodes, trainer_lane))
                .unwrap_or_default();
            (id, (kind, hit, start, stop))
        })
        .collect();
    let leader_y = 20.0 + LANE * lanes as f64;
    let thr_top = leader_y + LANE + 20.0;
    let thr_h = 120.0;
    let height = thr_top + thr_h + 40.0;
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    for n in 1..=nodes {
        let y = 20.0 + LANE * (n - 1) as f64;
        let _ = write!(
            svg,
            r##"<text x="5" y="{}">node {n}</text><line x1="{LEFT}" x2="{}" y1="{}" y2="{}" stroke="#ccc"/>"##,
            y + 16.0,
            WIDTH - 10.0,
            y + LANE / 2.0,
            y + LANE / 2.0
        );
    }
    for w in 1..=u64::from(schedule.workers) {
        let y = 20.0 + LANE * (nodes + w - 1) as f64;
        let _ = write!(
            svg,
            r##"<text x="5" y="{}">worker {w}</text><line x1="{LEFT}" x2="{}" y1="{}" y2="{}" stroke="#ccc"/>"##,
            y + 16.0,
            WIDTH - 10.0,
            y + LANE / 2.0,
            y + LANE / 2.0
        );
    }
    if let Some(lane) = trainer_lane {
        let y = 20.0 + LANE * (lane - 1) as f64;
        let _ = write!(
            svg,
            r##"<text x="5" y="{}">trainer</text><line x1="{LEFT}" x2="{}" y1="{}" y2="{}" stroke="#ccc"/>"##,
            y + 16.0,
            WIDTH - 10.0,
            y + LANE / 2.0,
            y + LANE / 2.0
        );
    }
    for (id, (kind, hit, start, stop)) in &spans {
        for (lane, name) in hit {
            let y = 20.0 + LANE * (*lane as f64 - 1.0) + 3.0;
            let _ = write!(
                svg,
                r#"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{}" fill="{}" opacity="0.8"><title>#{id} {kind} {name}: {start}–{stop} ms</title></rect>"#,
                x(*start),
                (x(*stop) - x(*start)).max(1.0),
                LANE - 6.0,
                color(kind)
            );
        }
    }
    // Workers the dispatcher removed, and worker processes that exited on their own.
    for e in events
        .iter()
        .filter(|e| (e.f == "worker-removed") || (e.f == "exit" && e.value["cause"] == "crash"))
    {
        let worker = e.value["worker"]
            .as_str()
            .unwrap_or(&e.process)
            .trim_start_matches("worker-")
            .parse::<u64>();
        if let Ok(w) = worker {
            let y = 20.0 + LANE * (nodes + w - 1) as f64;
            let _ = write!(
                svg,
                r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1:.1}" y2="{2:.1}" stroke="#000" stroke-width="2"><title>{3} at {4} ms</title></line>"##,
                x(e.t_ms),
                y + 1.0,
                y + LANE - 1.0,
                esc(&e.f),
                e.t_ms
            );
        }
    }
    // Leader lane.
    let _ = write!(svg, r#"<text x="5" y="{}">leader</text>"#, leader_y + 16.0);
    let leaders: Vec<(u64, u64)> = events
        .iter()
        .filter(|e| e.process == "monitor" && e.f == "leader")
        .filter_map(|e| Some((e.t_ms, e.value["node"].as_u64()?)))
        .collect();
    for (i, (t, node)) in leaders.iter().enumerate() {
        let next = leaders.get(i + 1).map(|l| l.0).unwrap_or(end_ms);
        let _ = write!(
            svg,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{}" fill="{}"><title>leader {node} from {t} ms</title></rect><text x="{:.1}" y="{:.1}" font-size="10">{node}</text>"#,
            x(*t),
            leader_y + 3.0,
            (x(next) - x(*t)).max(1.0),
            LANE - 6.0,
            node_color(*node),
            x(*t) + 2.0,
            leader_y + 17.0
        );
    }
    // Throughput: elements per second.
    let mut buckets = vec![0u64; (end_ms / 1000 + 1) as usize];
    for e in events.iter().filter(|e| e.f == "element") {
        buckets[(e.t_ms / 1000) as usize] += 1;
    }
    let max = buckets.iter().copied().max().unwrap_or(1).max(1);
    let _ = write!(
        svg,
        r#"<text x="5" y="{}">elements/s</text><text x="5" y="{}" font-size="10">max {max}</text>"#,
        thr_top + 14.0,
        thr_top + 28.0
    );
    for gap in gaps.gaps.iter().filter(|g| g.ms() >= GAP_DRAWN_MS) {
        let _ = write!(
            svg,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{thr_h}" fill="#d62728" opacity="0.25"><title>no element for {} ms from {} ms</title></rect>"##,
            x(gap.start_ms),
            thr_top,
            (x(gap.end_ms) - x(gap.start_ms)).max(1.0),
            gap.ms(),
            gap.start_ms
        );
    }
    for (s, n) in buckets.iter().enumerate() {
        let h = thr_h * *n as f64 / max as f64;
        let t = s as u64 * 1000;
        let _ = write!(
            svg,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="#555"><title>{s} s: {n} elements</title></rect>"##,
            x(t),
            thr_top + thr_h - h,
            (x(t + 1000) - x(t) - 1.0).max(1.0)
        );
    }
    // Heal line and time axis.
    if let Some(heal) = crate::checker::heal_time(events) {
        let _ = write!(
            svg,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="10" y2="{1}" stroke="#000" stroke-dasharray="4 3"/><text x="{2:.1}" y="12">heal</text>"##,
            x(heal),
            thr_top + thr_h,
            x(heal) + 3.0
        );
    }
    for s in (0..=end_ms / 1000).step_by(5) {
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{}" font-size="10">{s}s</text>"#,
            x(s * 1000),
            thr_top + thr_h + 15.0
        );
    }
    svg.push_str("</svg>");

    let mut html = String::new();
    let _ = write!(
        html,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>sluice-jepsen seed {}</title>\
         <style>body{{font-family:sans-serif;margin:20px}}td,th{{padding:2px 8px;text-align:left}}\
         .valid{{color:#2ca02c}}.invalid{{color:#d62728}}.unknown{{color:#ff7f0e}}</style></head><body>\
         <h1>sluice-jepsen: <span class=\"{verdict}\">{verdict}</span></h1>\
         <p>seed {}, {} nodes, {} workers, {} ms of faults, nemeses {:?}, {} delivery</p>",
        schedule.seed, schedule.seed, schedule.nodes, schedule.workers, schedule.time_ms, schedule.nemeses,
        esc(delivery)
    );
    let loss = |key: &str| {
        results
            .iter()
            .find(|r| r.name == "loss-bound")
            .and_then(|r| r.counts.get(key).copied())
            .unwrap_or(0)
    };
    let _ = write!(
        html,
        "<p>Splits lost: {} with a worker that died or was removed, {} while the worker lived, \
         {} with no lease recorded{}.</p>",
        loss("lost_with_worker"),
        loss("lost_while_worker_lived"),
        loss("lost_unleased"),
        if delivery == "exactly-once" {
            " (exactly-once delivery: each must be 0)"
        } else {
            ""
        }
    );
    html.push_str("<p>");
    for kind in NemesisKind::ALL.map(NemesisKind::name) {
        let _ = write!(
            html,
            "<span style=\"background:{};color:#fff;padding:1px 6px;margin-right:6px\">{kind}</span>",
            color(kind)
        );
    }
    html.push_str("</p>");
    html.push_str(&svg);
    html.push_str("<h2>Checks</h2><table><tr><th>check</th><th>verdict</th><th>counts</th><th>problems</th></tr>");
    for r in results {
        let counts: Vec<String> = r.counts.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = write!(
            html,
            "<tr><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td></tr>",
            r.name,
            r.verdict,
            r.verdict,
            esc(&counts.join(" ")),
            esc(&r.problems.join("; "))
        );
    }
    html.push_str("</table><h2>Delivery gaps</h2>");
    let _ = write!(
        html,
        "<p>The longest time no reader received an element while one waited: {} ms in the fault \
         phase; {} ms in gaps that overlap no worker fault (the ones <code>--max-delivery-gap</code> \
         bounds). Gaps of {GAP_DRAWN_MS} ms or more are shaded on the timeline.</p>",
        gaps.longest.map_or(0, |g| g.ms()),
        gaps.longest_bounded.map_or(0, |g| g.ms()),
    );
    html.push_str("<table><tr><th>fault</th><th>kind</th><th>from</th><th>to</th><th>longest gap begun during it</th></tr>");
    for f in &gaps.faults {
        let gap = f
            .longest_gap
            .map(|g| format!("{} ms (from {} ms)", g.ms(), g.start_ms))
            .unwrap_or_else(|| "none".into());
        let _ = write!(
            html,
            "<tr><td>#{}</td><td>{}</td><td>{} ms</td><td>{} ms</td><td>{gap}</td></tr>",
            f.fault,
            esc(&f.kind),
            f.start_ms,
            f.end_ms
        );
    }
    html.push_str("</table><h2>Schedule</h2><pre>");
    html.push_str(&esc(&schedule.describe()));
    html.push_str("</pre></body></html>\n");
    html
}

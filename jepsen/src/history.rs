//! `History`: the run's total, time-ordered record, one JSON object per line in
//! `history.jsonl`: `{t_ms, process, type, f, value}`.
//!
//! `type` follows Jepsen: `invoke` when an operation starts, then `ok` (it happened), `fail`
//! (it definitely did not happen) or `info` (unknown: a timeout or an unavailable quorum after
//! the request may have been sent). Facts that are not operations (an element received, a lease
//! granted, a leader seen) are single `ok` events. The order of lines is the order of `record`
//! calls, which is the order the checkers trust; `t_ms` is for people and the report.

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_client::Delivery;
use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The completion (or start) type of an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Invoke,
    Ok,
    Fail,
    Info,
}

/// One line of the history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub t_ms: u64,
    pub process: String,
    #[serde(rename = "type")]
    pub kind: Kind,
    pub f: String,
    pub value: Value,
}

impl Event {
    /// A hand-made event (checker tests).
    pub fn new(t_ms: u64, process: &str, kind: Kind, f: &str, value: Value) -> Event {
        Event {
            t_ms,
            process: process.into(),
            kind,
            f: f.into(),
            value,
        }
    }
}

/// The split range of a `lease` event's value, as the history records it (the checkers and the
/// lease book read leases through this one reading).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRange {
    pub iteration: u64,
    pub provider: u64,
    pub repetition: u64,
    pub start: u64,
    pub end: u64,
}

impl LeaseRange {
    /// `None` when a field is missing (an end-of-splits lease has a range of its own kind).
    pub fn of(value: &Value) -> Option<LeaseRange> {
        let field = |k: &str| value[k].as_u64();
        Some(LeaseRange {
            iteration: field("iteration")?,
            provider: field("provider")?,
            repetition: field("repetition")?,
            start: field("start")?,
            end: field("end")?,
        })
    }

    /// Provider 0, repetition 0: a `range` job's splits, what the harness reads.
    pub fn is_first_range(&self) -> bool {
        self.provider == 0 && self.repetition == 0
    }
}

/// A delivery as the history (and `--delivery`) spells it: `exactly-once` or `at-most-once`.
pub fn delivery_name(delivery: Delivery) -> &'static str {
    match delivery {
        Delivery::ExactlyOnce => "exactly-once",
        Delivery::AtMostOnce => "at-most-once",
    }
}

/// `--delivery`'s parser: `exactly-once` or `at-most-once` (an underscore works as the dash).
pub fn parse_delivery(text: &str) -> Result<Delivery, String> {
    text.trim()
        .parse::<Delivery>()
        .map_err(|_| format!("invalid delivery '{text}': expected exactly-once or at-most-once"))
}

/// The delivery a run's history records (its `harness setup` event), if it records one:
/// histories of older builds do not.
pub fn recorded_delivery(events: &[Event]) -> Option<Delivery> {
    events
        .iter()
        .find(|e| e.process == "harness" && e.f == "setup" && e.kind == Kind::Invoke)
        .and_then(|e| e.value["delivery"].as_str())
        .and_then(|d| parse_delivery(d).ok())
}

/// A clone-able handle that appends events to `history.jsonl`.
#[derive(Clone)]
pub struct History {
    inner: Arc<Inner>,
}

struct Inner {
    start: Instant,
    path: PathBuf,
    /// A std mutex: held only to serialize and buffer one line, never across `.await`; the
    /// lock also fixes the total order of the history.
    out: Mutex<BufWriter<std::fs::File>>,
}

impl History {
    pub fn create(path: &Path) -> anyhow::Result<History> {
        let file = std::fs::File::create(path)
            .with_context(|| format!("create history {}", path.display()))?;
        Ok(History {
            inner: Arc::new(Inner {
                start: Instant::now(),
                path: path.to_path_buf(),
                out: Mutex::new(BufWriter::new(file)),
            }),
        })
    }

    /// Milliseconds since the run started.
    pub fn now_ms(&self) -> u64 {
        self.inner.start.elapsed().as_millis() as u64
    }

    pub fn record(&self, process: &str, kind: Kind, f: &str, value: Value) {
        let mut out = self.inner.out.lock().expect("history lock poisoned");
        let event = Event {
            t_ms: self.now_ms(),
            process: process.to_string(),
            kind,
            f: f.to_string(),
            value,
        };
        // A failed write leaves a short history; the final flush reports it as a harness failure.
        if let Ok(line) = serde_json::to_string(&event) {
            let _ = writeln!(out, "{line}");
        }
    }

    pub fn flush(&self) -> anyhow::Result<()> {
        let mut out = self.inner.out.lock().expect("history lock poisoned");
        out.flush()
            .with_context(|| format!("write history {}", self.inner.path.display()))
    }
}

/// Reads a history file back, in order.
pub fn load(path: &Path) -> anyhow::Result<Vec<Event>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("open history {}", path.display()))?;
    let mut events = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.context("read history")?;
        if line.trim().is_empty() {
            continue;
        }
        let event: Event =
            serde_json::from_str(&line).with_context(|| format!("history line {}", i + 1))?;
        events.push(event);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_delivery_is_read_back_as_the_history_spells_it() {
        for delivery in [Delivery::ExactlyOnce, Delivery::AtMostOnce] {
            assert_eq!(parse_delivery(delivery_name(delivery)), Ok(delivery));
        }
        assert_eq!(parse_delivery("at_most_once"), Ok(Delivery::AtMostOnce));
        assert_eq!(
            parse_delivery("once"),
            Err("invalid delivery 'once': expected exactly-once or at-most-once".to_string())
        );
        let setup = |value| vec![Event::new(0, "harness", Kind::Invoke, "setup", value)];
        assert_eq!(
            recorded_delivery(&setup(json!({"seed": 1, "delivery": "at-most-once"}))),
            Some(Delivery::AtMostOnce)
        );
        // An older build's history records none.
        assert_eq!(recorded_delivery(&setup(json!({"seed": 1}))), None);
    }
}

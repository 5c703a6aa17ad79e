//! `Report`: the bench's output. Each figure prints one row as it is measured; the JSON object
//! of every figure (the keys BENCHMARKS.md's history uses, values rounded to one decimal) is
//! printed once at the end, when asked for.

use serde_json::{json, Map, Value};

#[derive(Default)]
pub(crate) struct Report {
    figures: Map<String, Value>,
    /// Appended to every key put from now on (`_tls` for the pass with TLS and tokens).
    suffix: String,
}

impl Report {
    /// Prints a row and keeps the figure for the JSON object.
    pub(crate) fn put(&mut self, key: &str, value: f64, unit: &str) {
        let key = format!("{key}{}", self.suffix);
        println!("{key:<28} {value:>14.1} {unit}");
        self.figures
            .insert(key, json!((value * 10.0).round() / 10.0));
    }

    /// Like [`Report::put`] for a ratio near 1, kept to three decimals (one would hide it).
    pub(crate) fn put_ratio(&mut self, key: &str, value: f64) {
        let key = format!("{key}{}", self.suffix);
        println!("{key:<28} {value:>14.3}");
        self.figures
            .insert(key, json!((value * 1000.0).round() / 1000.0));
    }

    /// Suffixes the keys of every figure put from now on.
    pub(crate) fn set_suffix(&mut self, suffix: &str) {
        self.suffix = suffix.to_string();
    }

    /// Every figure put so far, as one JSON object.
    pub(crate) fn into_json(self) -> Value {
        Value::Object(self.figures)
    }
}

/// The median of `values` (the upper one of an even count); sorts them.
pub(crate) fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

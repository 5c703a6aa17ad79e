//! A strict reader of the metrics text (OpenMetrics, as `/metrics` serves it): each line a
//! `# HELP`, `# TYPE` or `# UNIT` comment, a sample `name{label="value",...} number`, or the
//! closing `# EOF`. Tests use it to check that what a node serves parses, and to look series up.

use crate::error::OpsError;
use std::collections::BTreeMap;

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Every sample of `text`, in order; the first malformed line is an error naming it.
pub fn parse(text: &str) -> Result<Vec<Sample>, OpsError> {
    let mut samples = Vec::new();
    let mut ended = false;
    for (index, line) in text.lines().enumerate() {
        let bad = |message: &str| OpsError::Exposition {
            line: index + 1,
            message: message.to_string(),
            text: line.to_string(),
        };
        if ended {
            return Err(bad("a line after # EOF"));
        }
        if line == "# EOF" {
            ended = true;
            continue;
        }
        if let Some(comment) = line.strip_prefix("# ") {
            let kind = comment.split(' ').next().unwrap_or_default();
            if !matches!(kind, "HELP" | "TYPE" | "UNIT") {
                return Err(bad("a comment other than HELP, TYPE or UNIT"));
            }
            continue;
        }
        samples.push(sample(line).map_err(|m| bad(&m))?);
    }
    if !ended {
        return Err(OpsError::Exposition {
            line: text.lines().count(),
            message: "no closing # EOF".into(),
            text: String::new(),
        });
    }
    Ok(samples)
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(['{', ' '])
        .ok_or_else(|| "a sample without a value".to_string())?;
    let name = &line[..name_end];
    if !is_name(name) {
        return Err(format!("{name:?} is not a metric name"));
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        let close = after
            .find("} ")
            .ok_or_else(|| "labels without a closing brace".to_string())?;
        for pair in split_labels(&after[..close])? {
            let (key, value) = pair;
            if !is_name(&key) {
                return Err(format!("{key:?} is not a label name"));
            }
            labels.insert(key, value);
        }
        rest = &after[close + 1..];
    }
    let value = rest
        .split_whitespace()
        .next()
        .ok_or_else(|| "a sample without a value".to_string())?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|_| format!("{v:?} is not a number"))?,
    };
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// `a="x",b="y"` as pairs; values may hold escaped quotes and commas.
fn split_labels(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once("=\"")
            .ok_or_else(|| format!("label {rest:?} is not key=\"value\""))?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => break,
                },
                '"' => {
                    end = Some(i);
                    break;
                }
                c => value.push(c),
            }
        }
        let end = end.ok_or_else(|| format!("label {key:?} has no closing quote"))?;
        pairs.push((key.to_string(), value));
        rest = after[end + 1..]
            .strip_prefix(',')
            .unwrap_or(&after[end + 1..]);
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_formed_text_parses_and_each_kind_of_malformed_line_is_named() {
        let good = "# HELP x_total Things.\n# TYPE x counter\nx_total{a=\"1\",b=\"q\\\"\"} 3\ny 1.5\n# EOF\n";
        let samples = parse(good).expect("parses");
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].labels["b"], "q\"");
        assert_eq!(samples[1].value, 1.5);
        let cases = [
            ("x 1\n", "no closing # EOF"),
            ("# EOF\nx 1\n", "a line after # EOF"),
            ("# hello\n# EOF\n", "a comment other than"),
            ("9x 1\n# EOF\n", "is not a metric name"),
            ("x{a=1} 1\n# EOF\n", "is not key=\"value\""),
            ("x one\n# EOF\n", "is not a number"),
        ];
        for (text, says) in cases {
            let err = parse(text).expect_err(text).to_string();
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }
}

//! The chaos harness (issue: "Chaos harness (jepsen/)"): real `sluice` processes, nemeses, a
//! history and checkers. Not built yet; this crate holds its place in the workspace.

//! `JournalIdentity`: the cluster and the node a journal belongs to, recorded in the data dir's
//! `IDENTITY` file.
//!
//! A Raft voter must never forget its log or its vote: one that comes back from a lost disk
//! with a fresh, empty journal can help elect a leader that lacks committed entries. So a
//! journal is created only when the caller says so (`IfMissing::Create`), and once created it
//! names its cluster and node: a data dir that was swapped, copied from another replica, or
//! given to the wrong cluster is refused by name instead of served.
//!
//! Invariants: the file is written once, durably, while the journal is created (before
//! `FORMAT`), and never rewritten; the one exception is a journal created before identities
//! existed, which adopts the identity it is first opened with (see `Journal::open`). The file
//! is plain text so an operator can read which replica a data dir belongs to:
//!
//! ```text
//! sluice-identity 1
//! cluster sluice
//! node 3
//! ```

use std::fmt;

use crate::error::JournalError;

/// Name of the identity file inside the data dir.
pub const IDENTITY_FILE: &str = "IDENTITY";
/// First line of an identity file: the version of its own layout.
const IDENTITY_HEADER: &str = "sluice-identity 1";
/// Longest cluster id accepted (it is one line of a small file, and shown in every refusal).
const MAX_CLUSTER_ID_LEN: usize = 64;

/// Which cluster and which node (Raft id) a journal belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalIdentity {
    cluster_id: String,
    node_id: u64,
}

impl JournalIdentity {
    /// Refuses (with [`JournalError::InvalidIdentity`]) a cluster id that is empty, longer
    /// than 64 bytes, or has a character outside `A-Z a-z 0-9 . _ -`.
    pub fn new(cluster_id: impl Into<String>, node_id: u64) -> Result<Self, JournalError> {
        let cluster_id = cluster_id.into();
        check_cluster_id(&cluster_id).map_err(|reason| JournalError::InvalidIdentity {
            reason: format!("cluster id {cluster_id:?} {reason}"),
        })?;
        Ok(JournalIdentity {
            cluster_id,
            node_id,
        })
    }

    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// The content of an identity file recording `self`.
    pub(crate) fn to_file_content(&self) -> String {
        format!(
            "{IDENTITY_HEADER}\ncluster {}\nnode {}\n",
            self.cluster_id, self.node_id
        )
    }

    /// Parses an identity file; the error says what is wrong with it (the caller names the
    /// file).
    pub(crate) fn from_file_content(content: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(content).map_err(|_| "is not UTF-8 text".to_string())?;
        let lines: Vec<&str> = text.lines().collect();
        let [header, cluster, node] = lines[..] else {
            return Err(format!("has {} lines, expected 3", lines.len()));
        };
        if header != IDENTITY_HEADER {
            return Err(format!(
                "starts with {header:?}, expected {IDENTITY_HEADER:?}"
            ));
        }
        let cluster_id = cluster
            .strip_prefix("cluster ")
            .ok_or_else(|| format!("has {cluster:?} where \"cluster NAME\" belongs"))?;
        let node_id = node
            .strip_prefix("node ")
            .and_then(|n| n.parse::<u64>().ok())
            .ok_or_else(|| format!("has {node:?} where \"node ID\" belongs"))?;
        check_cluster_id(cluster_id)
            .map_err(|reason| format!("names a cluster id that {reason}"))?;
        Ok(JournalIdentity {
            cluster_id: cluster_id.to_string(),
            node_id,
        })
    }
}

impl fmt::Display for JournalIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cluster '{}' node {}", self.cluster_id, self.node_id)
    }
}

/// Why `cluster_id` is not a valid cluster id, if it is not.
fn check_cluster_id(cluster_id: &str) -> Result<(), &'static str> {
    if cluster_id.is_empty() {
        return Err("is empty");
    }
    if cluster_id.len() > MAX_CLUSTER_ID_LEN {
        return Err("is longer than 64 bytes");
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if !cluster_id.chars().all(allowed) {
        return Err("may only hold letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ids_are_checked() {
        let long = "x".repeat(65);
        let cases: &[(&str, Option<&str>)] = &[
            ("sluice", None),
            ("prod-eu.1_a", None),
            (&long[..64], None),
            ("", Some("cluster id \"\" is empty")),
            (&long, Some("is longer than 64 bytes")),
            ("a b", Some("cluster id \"a b\" may only hold")),
            ("a\nnode 2", Some("may only hold")),
            ("é", Some("may only hold")),
        ];
        for (cluster_id, refusal) in cases {
            let got = JournalIdentity::new(*cluster_id, 1);
            match refusal {
                None => assert_eq!(got.expect("valid").cluster_id(), *cluster_id),
                Some(says) => {
                    let err = got.expect_err("refused").to_string();
                    assert!(err.contains(says), "{cluster_id:?}: {err}");
                }
            }
        }
    }

    #[test]
    fn file_content_round_trips_and_malformed_files_say_why() {
        let identity = JournalIdentity::new("prod", 3).expect("valid");
        let content = identity.to_file_content();
        assert_eq!(content, "sluice-identity 1\ncluster prod\nnode 3\n");
        assert_eq!(
            JournalIdentity::from_file_content(content.as_bytes()),
            Ok(identity)
        );
        let cases: &[(&[u8], &str)] = &[
            (b"", "has 0 lines, expected 3"),
            (b"\xff\xfe", "is not UTF-8 text"),
            (b"sluice-identity 2\ncluster a\nnode 1\n", "starts with"),
            (
                b"sluice-identity 1\nclusters a\nnode 1\n",
                "\"cluster NAME\"",
            ),
            (b"sluice-identity 1\ncluster a\nnode x\n", "\"node ID\""),
            (b"sluice-identity 1\ncluster a\nnode -1\n", "\"node ID\""),
            (b"sluice-identity 1\ncluster a b\nnode 1\n", "may only hold"),
            (
                b"sluice-identity 1\ncluster a\nnode 1\nmore\n",
                "has 4 lines",
            ),
        ];
        for (content, says) in cases {
            let err = JournalIdentity::from_file_content(content).expect_err("malformed");
            assert!(err.contains(says), "{content:?}: {err}");
        }
    }
}

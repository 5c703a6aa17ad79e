//! The replicated record of exactly-once delivery: per job, whether it delivers exactly once;
//! per task stream (a *lineage*), the splits it was leased and the elements its readers
//! received, so that another worker can take the stream over where its readers stand.
//!
//! A lineage is one stream of elements, numbered from 0, produced by one task and, after its
//! worker failed, by the tasks that took it over. Its content is a function of the dataset's
//! definition and the splits leased to it, in order (static sharding: of the shard it reads), so
//! a worker that takes it over runs the pipeline again from the start on the same splits and
//! skips the elements the readers received; its output from there on is what the failed worker
//! would have produced. (This needs a pipeline whose output is determined by its input splits;
//! see docs/guide.md.)
//!
//! A lineage moves when its worker is removed or restarts: its task is dropped and the lineage
//! waits until every client of the iteration has let go of the dropped task, reporting what it
//! received from it; only then is a new task created for it on a live worker, so no reader can
//! still be taking elements from the old one while the new one produces them again.

use serde::{Deserialize, Serialize};
use sluice_types::{ClientId, IndexRuns, IterationId, JobId, TaskId};
use std::collections::{BTreeMap, BTreeSet};

/// Runs of received indices one report may carry per task, at most.
pub const MAX_REPORT_RUNS: usize = 4096;
/// Tasks one report may name, at most.
pub const MAX_REPORT_TASKS: usize = 1024;
/// Runs a lineage's received set may hold: readers receive long runs, so only a reader that
/// reports garbage gets near it.
pub const MAX_LINEAGE_RUNS: usize = 1 << 16;

/// A lineage's key: its iteration and the first task that ran it.
pub type LineageKey = (IterationId, TaskId);

/// Splits `[start, end)` of `repetition` of split provider `provider`, leased to a lineage.
///
/// Encoded only inside a list of leases (`recorded_leases`), never alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordedLease {
    pub provider: u32,
    pub repetition: u64,
    pub start: u64,
    pub end: u64,
}

/// The encoding of a list of recorded leases, readable from snapshots of builds before split
/// providers were recorded. Those encoded each lease as the triple `(repetition, start, end)`,
/// all of provider 0. A lease of another provider is preceded by a *switch*, the triple
/// `(provider, 1, 0)`: a lease always has `start < end` (empty ones are never recorded), so a
/// triple with `start > end` can only be a switch. The leases after a switch are of its
/// provider until the next switch; the list starts at provider 0, so a list of provider 0 only
/// is encoded as before. (A recorded lease with `start >= end` holds no split and is left out.)
pub mod recorded_leases {
    use super::RecordedLease;
    use serde::de::{Error, SeqAccess, Visitor};
    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// One triple as it is encoded.
    #[derive(Serialize, Deserialize)]
    struct Triple {
        repetition: u64,
        start: u64,
        end: u64,
    }

    fn switch(provider: u32) -> Triple {
        Triple {
            repetition: u64::from(provider),
            start: 1,
            end: 0,
        }
    }

    pub fn serialize<S: Serializer>(leases: &[RecordedLease], s: S) -> Result<S::Ok, S::Error> {
        let kept = || leases.iter().filter(|l| l.start < l.end);
        let mut provider = 0;
        let mut len = 0;
        for lease in kept() {
            len += 1 + usize::from(lease.provider != provider);
            provider = lease.provider;
        }
        let mut seq = s.serialize_seq(Some(len))?;
        provider = 0;
        for lease in kept() {
            if lease.provider != provider {
                seq.serialize_element(&switch(lease.provider))?;
                provider = lease.provider;
            }
            seq.serialize_element(&Triple {
                repetition: lease.repetition,
                start: lease.start,
                end: lease.end,
            })?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<RecordedLease>, D::Error> {
        struct Leases;
        impl<'de> Visitor<'de> for Leases {
            type Value = Vec<RecordedLease>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of recorded leases")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                // Not preallocated from the claimed length: the codec bounds what is read.
                let mut leases = Vec::new();
                let mut provider = 0;
                while let Some(t) = seq.next_element::<Triple>()? {
                    if t.start > t.end {
                        provider = u32::try_from(t.repetition).map_err(|_| {
                            A::Error::custom(format!(
                                "recorded lease switches to split provider {}, past the largest",
                                t.repetition
                            ))
                        })?;
                        continue;
                    }
                    leases.push(RecordedLease {
                        provider,
                        repetition: t.repetition,
                        start: t.start,
                        end: t.end,
                    });
                }
                Ok(leases)
            }
        }
        d.deserialize_seq(Leases)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lineage {
    /// The task producing it, or (while it moves) the dropped task it moves from.
    pub task: TaskId,
    /// `task` produces it; `false` while it moves.
    pub running: bool,
    /// While it moves: the clients of the iteration that have not yet let go of `task`.
    pub waiting: BTreeSet<ClientId>,
    /// Every lease granted to its tasks, in the order granted (the order their pipelines
    /// consumed each provider's).
    #[serde(with = "recorded_leases")]
    pub leases: Vec<RecordedLease>,
    /// Indices of the elements its readers received.
    pub delivered: IndexRuns,
    /// The worker whose task started it: for static sharding, whose shard it reads.
    pub origin_worker: String,
    /// Times it moved.
    pub moves: u64,
}

impl Lineage {
    pub fn new(task: TaskId, worker: &str) -> Lineage {
        Lineage {
            task,
            running: true,
            waiting: BTreeSet::new(),
            leases: Vec::new(),
            delivered: IndexRuns::new(),
            origin_worker: worker.to_string(),
            moves: 0,
        }
    }

    /// It moves and every client has let go of its old task: it needs a worker.
    pub fn ready_to_move(&self) -> bool {
        !self.running && self.waiting.is_empty()
    }
}

/// What one client received from one task, as it reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryReport {
    pub task_id: TaskId,
    /// Runs `[start, end)` of the lineage's element indices received since the last report.
    pub runs: Vec<(u64, u64)>,
    /// The client has stopped reading the task for good (it was asked to let go of it): no
    /// element of it will reach the client after what this report lists.
    pub released: bool,
}

/// The exactly-once part of the state, one trailing field of `DispatcherState`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExactlyOnce {
    /// Jobs that deliver exactly once (jobs of builds before it are read as at most once).
    pub jobs: BTreeSet<JobId>,
    pub lineages: BTreeMap<LineageKey, Lineage>,
    /// Every task of a lineage (current or earlier), to its lineage.
    pub tasks: BTreeMap<TaskId, LineageKey>,
    /// The process (incarnation) of each registered worker as it last reported it: another one
    /// under the same address is a restarted worker, whose lineages move.
    pub incarnations: BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_journal::codec::{decode, encode};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Leases(#[serde(with = "recorded_leases")] Vec<RecordedLease>);

    /// Triples `(repetition, start, end)`.
    type Triples = Vec<(u64, u64, u64)>;

    /// How builds before split providers encoded a lineage's leases.
    #[derive(Serialize)]
    struct OldLeases(Triples);

    fn lease(provider: u32, repetition: u64, start: u64, end: u64) -> RecordedLease {
        RecordedLease {
            provider,
            repetition,
            start,
            end,
        }
    }

    #[test]
    fn leases_of_provider_0_are_encoded_as_before_and_others_after_a_switch() {
        // (leases, the triples encoded)
        let cases: Vec<(Vec<RecordedLease>, Triples)> = vec![
            (vec![], vec![]),
            (
                vec![lease(0, 0, 0, 2), lease(0, 1, 4, 9)],
                vec![(0, 0, 2), (1, 4, 9)],
            ),
            (
                vec![
                    lease(1, 0, 0, 2),
                    lease(1, 0, 2, 3),
                    lease(0, 0, 0, 1),
                    lease(u32::MAX, 7, 5, 6),
                ],
                vec![
                    (1, 1, 0),
                    (0, 0, 2),
                    (0, 2, 3),
                    (0, 1, 0),
                    (0, 0, 1),
                    (u64::from(u32::MAX), 1, 0),
                    (7, 5, 6),
                ],
            ),
        ];
        for (leases, triples) in cases {
            let bytes = encode(&Leases(leases.clone()));
            assert_eq!(bytes, encode(&OldLeases(triples.clone())), "{leases:?}");
            assert_eq!(decode::<Leases>(&bytes).unwrap(), Leases(leases));
        }
    }

    #[test]
    fn old_snapshots_decode_as_provider_0_and_bad_switches_are_refused() {
        let old = encode(&OldLeases(vec![(0, 0, 2), (3, 1, 8)]));
        assert_eq!(
            decode::<Leases>(&old).unwrap(),
            Leases(vec![lease(0, 0, 0, 2), lease(0, 3, 1, 8)])
        );
        let bad = encode(&OldLeases(vec![(1 << 40, 1, 0), (0, 0, 1)]));
        let err = decode::<Leases>(&bad).unwrap_err().to_string();
        assert!(err.contains("split provider 1099511627776"), "{err}");
        // Empty leases (never recorded) are left out rather than read back as switches.
        let bytes = encode(&Leases(vec![lease(3, 0, 5, 5), lease(0, 0, 1, 2)]));
        assert_eq!(
            decode::<Leases>(&bytes).unwrap(),
            Leases(vec![lease(0, 0, 1, 2)])
        );
    }
}

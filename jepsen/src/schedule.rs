//! `Schedule`: the fault plan of one run, generated up front from the seed alone, so a rerun
//! with the same seed, length, node count and nemesis list replays exactly the same plan.
//!
//! Invariants: faults never overlap (the next one starts at least 500 ms after the previous one
//! healed), and one fault touches at most a minority of the nodes ((n - 1) / 2), so a quorum is
//! always up and connected. Targets such as "the leader" are resolved when the fault starts
//! (the history records which node it was); the plan itself holds no runtime facts.

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A kind of fault the user can ask for with `--nemesis`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NemesisKind {
    /// SIGKILL, then a restart from the same data dir when the fault ends.
    Kill,
    /// SIGSTOP, then SIGCONT.
    Pause,
    /// Raft links cut through the proxies.
    Partition,
    /// SIGTERM (a clean shutdown), then a restart from the same data dir.
    Restart,
}

impl NemesisKind {
    pub const ALL: [NemesisKind; 4] = [
        NemesisKind::Kill,
        NemesisKind::Pause,
        NemesisKind::Partition,
        NemesisKind::Restart,
    ];

    pub fn name(self) -> &'static str {
        match self {
            NemesisKind::Kill => "kill",
            NemesisKind::Pause => "pause",
            NemesisKind::Partition => "partition",
            NemesisKind::Restart => "restart",
        }
    }
}

impl fmt::Display for NemesisKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for NemesisKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        NemesisKind::ALL
            .into_iter()
            .find(|k| k.name() == s.trim())
            .ok_or_else(|| {
                format!("unknown nemesis '{s}': expected kill, pause, partition or restart")
            })
    }
}

/// Which node a process fault hits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// Whoever leads when the fault starts.
    Leader,
    Node(u64),
}

/// How a partition cuts links.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// The leader cut off from everyone, both directions.
    IsolateLeader,
    /// The nodes listed (a minority) cut off from the rest, both directions.
    Halves(Vec<u64>),
    /// Connections the leader opens to the others are cut; the others still reach it.
    OneWayFromLeader,
    /// Connections the others open to the leader are cut; the leader still reaches them.
    OneWayToLeader,
}

/// What a cut link does with connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkMode {
    /// Forward both ways.
    Pass,
    /// Accept, read and drop: a silent partition that only timeouts detect.
    Blackhole,
    /// Close at once with a reset: a refused connection.
    Reset,
}

/// One fault's action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Action {
    Kill { target: Target },
    Pause { target: Target },
    Restart { target: Target },
    Partition { shape: Shape, mode: LinkMode },
}

impl Action {
    pub fn kind(&self) -> NemesisKind {
        match self {
            Action::Kill { .. } => NemesisKind::Kill,
            Action::Pause { .. } => NemesisKind::Pause,
            Action::Restart { .. } => NemesisKind::Restart,
            Action::Partition { .. } => NemesisKind::Partition,
        }
    }

    /// Whether the fault is aimed at the leader of the moment.
    pub fn aims_at_leader(&self) -> bool {
        match self {
            Action::Kill { target } | Action::Pause { target } | Action::Restart { target } => {
                *target == Target::Leader
            }
            Action::Partition { shape, .. } => !matches!(shape, Shape::Halves(_)),
        }
    }
}

/// One planned fault: starts `at_ms` after the fault phase began, lasts `hold_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub id: u32,
    pub at_ms: u64,
    pub hold_ms: u64,
    pub action: Action,
}

impl Fault {
    pub fn at(&self) -> Duration {
        Duration::from_millis(self.at_ms)
    }
    pub fn end(&self) -> Duration {
        Duration::from_millis(self.at_ms + self.hold_ms)
    }
}

/// The plan of one run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    pub seed: u64,
    pub time_ms: u64,
    pub nodes: u64,
    pub nemeses: Vec<NemesisKind>,
    pub faults: Vec<Fault>,
}

/// The first fault waits this long, so the cluster and workload are warm.
const FIRST_FAULT: Duration = Duration::from_millis(2000);
/// Starts of consecutive faults are 3–5 s apart; a fault is held 1–4 s.
const GAP_MS: (u64, u64) = (3000, 5000);
const HOLD_MS: (u64, u64) = (1000, 4000);
/// Quiet time after a fault heals before the next may start.
const SETTLE_MS: u64 = 500;

impl Schedule {
    /// The plan for `seed`. Every enabled nemesis appears before any appears twice (a shuffled
    /// bag), so a run long enough for `nemeses.len()` faults covers them all; the first kill,
    /// pause and restart aim at the leader, later ones at the leader or a random node.
    /// Partition shapes are drawn from a second bag.
    pub fn generate(seed: u64, time: Duration, nodes: u64, nemeses: &[NemesisKind]) -> Schedule {
        let mut rng = StdRng::seed_from_u64(seed);
        let time_ms = time.as_millis() as u64;
        let minority = (nodes.saturating_sub(1) / 2) as usize;
        let mut faults = Vec::new();
        let mut bag: Vec<NemesisKind> = Vec::new();
        let mut shapes: Vec<u8> = Vec::new();
        let mut aimed_at_leader: Vec<NemesisKind> = Vec::new();
        let mut at = FIRST_FAULT.as_millis() as u64;
        while minority > 0 && !nemeses.is_empty() {
            let hold = rng.random_range(HOLD_MS.0..=HOLD_MS.1);
            if at + hold + SETTLE_MS > time_ms {
                break;
            }
            if bag.is_empty() {
                bag = nemeses.to_vec();
                bag.sort();
                bag.dedup();
                bag.shuffle(&mut rng);
            }
            let kind = bag.pop().expect("the bag was just refilled");
            let first_of_kind = !aimed_at_leader.contains(&kind);
            aimed_at_leader.push(kind);
            let target = if first_of_kind || rng.random_bool(0.5) {
                Target::Leader
            } else {
                Target::Node(rng.random_range(1..=nodes))
            };
            let action = match kind {
                NemesisKind::Kill => Action::Kill { target },
                NemesisKind::Pause => Action::Pause { target },
                NemesisKind::Restart => Action::Restart { target },
                NemesisKind::Partition => {
                    // Shapes come from their own shuffled bag, so a run with a few partitions
                    // still sees different ones.
                    if shapes.is_empty() {
                        shapes = vec![0, 1, 2, 3];
                        shapes.shuffle(&mut rng);
                    }
                    let shape = match shapes.pop().expect("the bag was just refilled") {
                        0 => Shape::IsolateLeader,
                        1 => {
                            let all: Vec<u64> = (1..=nodes).collect();
                            let size = rng.random_range(1..=minority);
                            let mut side: Vec<u64> =
                                all.choose_multiple(&mut rng, size).copied().collect();
                            side.sort();
                            Shape::Halves(side)
                        }
                        2 => Shape::OneWayFromLeader,
                        _ => Shape::OneWayToLeader,
                    };
                    let mode = if rng.random_bool(0.5) {
                        LinkMode::Blackhole
                    } else {
                        LinkMode::Reset
                    };
                    Action::Partition { shape, mode }
                }
            };
            faults.push(Fault {
                id: faults.len() as u32 + 1,
                at_ms: at,
                hold_ms: hold,
                action,
            });
            let gap = rng.random_range(GAP_MS.0..=GAP_MS.1);
            at = (at + gap).max(at + hold + SETTLE_MS);
        }
        Schedule {
            seed,
            time_ms,
            nodes,
            nemeses: nemeses.to_vec(),
            faults,
        }
    }

    /// One line per fault, for the terminal.
    pub fn describe(&self) -> String {
        let mut out = format!(
            "schedule (seed {}, {} faults over {} ms):\n",
            self.seed,
            self.faults.len(),
            self.time_ms
        );
        for f in &self.faults {
            out += &format!(
                "  #{:<2} at {:>6} ms hold {:>4} ms  {}\n",
                f.id,
                f.at_ms,
                f.hold_ms,
                serde_json::to_string(&f.action).unwrap_or_default()
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let a = Schedule::generate(7, Duration::from_secs(45), 3, &NemesisKind::ALL);
        let b = Schedule::generate(7, Duration::from_secs(45), 3, &NemesisKind::ALL);
        assert_eq!(a, b);
        let c = Schedule::generate(8, Duration::from_secs(45), 3, &NemesisKind::ALL);
        assert_ne!(a, c);
    }

    #[test]
    fn faults_do_not_overlap_and_cover_every_nemesis() {
        for seed in 0..50 {
            let s = Schedule::generate(seed, Duration::from_secs(30), 3, &NemesisKind::ALL);
            for pair in s.faults.windows(2) {
                assert!(pair[1].at() >= pair[0].end(), "seed {seed}: overlap");
            }
            for f in &s.faults {
                assert!(f.end() <= Duration::from_secs(30));
                assert!((1000..=4000).contains(&f.hold_ms));
                if let Action::Partition {
                    shape: Shape::Halves(side),
                    ..
                } = &f.action
                {
                    assert_eq!(side.len(), 1, "a minority of 3");
                }
            }
            for kind in NemesisKind::ALL {
                assert!(
                    s.faults.iter().any(|f| f.action.kind() == kind),
                    "seed {seed}: no {kind}"
                );
            }
        }
    }
}

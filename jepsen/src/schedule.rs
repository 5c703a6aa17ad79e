//! `Schedule`: the fault plan of one run, generated up front from the seed alone, so a rerun
//! with the same seed, length, node count and nemesis list replays exactly the same plan.
//!
//! Three tracks play at once: dispatcher faults (kill, pause, restart, Raft partitions), worker
//! faults (kill, pause, restart of a worker process, its links to the dispatchers cut, the
//! readers' links to it cut) and trainer faults (the trainer's reading process SIGKILLed, then
//! restarted from its last state when the fault ends; see `trainer`). Within a track faults
//! never overlap (the next one starts at least
//! 500 ms after the previous one healed); worker faults never take a dispatcher down, and one
//! dispatcher fault touches at most a minority of the nodes ((n - 1) / 2), so a quorum is always
//! up and connected. Targets such as "the leader" are resolved when the fault starts (the
//! history records which node it was); the plan itself holds no runtime facts.

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
    /// SIGKILL of a worker process, then a new process at the same address.
    #[serde(rename = "worker-kill")]
    WorkerKill,
    /// SIGSTOP of a worker process, then SIGCONT.
    #[serde(rename = "worker-pause")]
    WorkerPause,
    /// SIGTERM of a worker process (a clean shutdown), then a new process at the same address.
    #[serde(rename = "worker-restart")]
    WorkerRestart,
    /// A worker's links to the dispatchers cut (all of them or the leader's; both ways or one).
    #[serde(rename = "worker-partition")]
    WorkerPartition,
    /// The readers' links to one worker cut (both ways or one).
    #[serde(rename = "reader-partition")]
    ReaderPartition,
    /// SIGKILL of the trainer's reading process, which restarts from its last state when the
    /// fault ends.
    Trainer,
}

/// The track a fault plays on: one fault at a time per track.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Track {
    Dispatchers,
    Workers,
    Trainer,
}

impl NemesisKind {
    pub const ALL: [NemesisKind; 10] = [
        NemesisKind::Kill,
        NemesisKind::Pause,
        NemesisKind::Partition,
        NemesisKind::Restart,
        NemesisKind::WorkerKill,
        NemesisKind::WorkerPause,
        NemesisKind::WorkerRestart,
        NemesisKind::WorkerPartition,
        NemesisKind::ReaderPartition,
        NemesisKind::Trainer,
    ];

    pub fn name(self) -> &'static str {
        match self {
            NemesisKind::Kill => "kill",
            NemesisKind::Pause => "pause",
            NemesisKind::Partition => "partition",
            NemesisKind::Restart => "restart",
            NemesisKind::WorkerKill => "worker-kill",
            NemesisKind::WorkerPause => "worker-pause",
            NemesisKind::WorkerRestart => "worker-restart",
            NemesisKind::WorkerPartition => "worker-partition",
            NemesisKind::ReaderPartition => "reader-partition",
            NemesisKind::Trainer => "trainer",
        }
    }

    /// The track the fault plays on.
    pub fn track(self) -> Track {
        match self {
            NemesisKind::Kill
            | NemesisKind::Pause
            | NemesisKind::Partition
            | NemesisKind::Restart => Track::Dispatchers,
            NemesisKind::WorkerKill
            | NemesisKind::WorkerPause
            | NemesisKind::WorkerRestart
            | NemesisKind::WorkerPartition
            | NemesisKind::ReaderPartition => Track::Workers,
            NemesisKind::Trainer => Track::Trainer,
        }
    }

    /// Whether the fault hits workers or their links (the worker track).
    pub fn on_workers(self) -> bool {
        self.track() == Track::Workers
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
                let names: Vec<&str> = NemesisKind::ALL.iter().map(|k| k.name()).collect();
                format!(
                    "unknown nemesis '{s}': expected one of {}",
                    names.join(", ")
                )
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

/// Which of a worker's links to the dispatchers a worker partition cuts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerShape {
    /// The worker cut off from every dispatcher.
    AllDispatchers,
    /// The worker cut off from the leader of the moment only.
    Leader,
}

/// What a cut link does with connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkMode {
    /// Forward both ways.
    Pass,
    /// Accept, read and drop: a silent partition that only timeouts detect.
    Blackhole,
    /// Close at once with a reset: a refused connection.
    Reset,
    /// Forward what the serving side sends, drop what the connecting side sends (one way).
    DropRequests,
    /// Forward what the connecting side sends, drop what the serving side sends (one way: a
    /// request is served, its reply lost).
    DropReplies,
}

impl LinkMode {
    /// The modes a link between a caller and a server may be cut with.
    pub const CUTS: [LinkMode; 4] = [
        LinkMode::Blackhole,
        LinkMode::Reset,
        LinkMode::DropRequests,
        LinkMode::DropReplies,
    ];
}

/// One fault's action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Action {
    Kill {
        target: Target,
    },
    Pause {
        target: Target,
    },
    Restart {
        target: Target,
    },
    Partition {
        shape: Shape,
        mode: LinkMode,
    },
    /// Worker `worker` (1-based) is SIGKILLed.
    #[serde(rename = "worker-kill")]
    WorkerKill {
        worker: u32,
    },
    #[serde(rename = "worker-pause")]
    WorkerPause {
        worker: u32,
    },
    #[serde(rename = "worker-restart")]
    WorkerRestart {
        worker: u32,
    },
    #[serde(rename = "worker-partition")]
    WorkerPartition {
        worker: u32,
        shape: WorkerShape,
        mode: LinkMode,
    },
    #[serde(rename = "reader-partition")]
    ReaderPartition {
        worker: u32,
        mode: LinkMode,
    },
    /// The trainer's reading process is SIGKILLed; it restarts from its last state after the
    /// hold.
    #[serde(rename = "trainer-kill")]
    TrainerKill,
}

impl Action {
    pub fn kind(&self) -> NemesisKind {
        match self {
            Action::Kill { .. } => NemesisKind::Kill,
            Action::Pause { .. } => NemesisKind::Pause,
            Action::Restart { .. } => NemesisKind::Restart,
            Action::Partition { .. } => NemesisKind::Partition,
            Action::WorkerKill { .. } => NemesisKind::WorkerKill,
            Action::WorkerPause { .. } => NemesisKind::WorkerPause,
            Action::WorkerRestart { .. } => NemesisKind::WorkerRestart,
            Action::WorkerPartition { .. } => NemesisKind::WorkerPartition,
            Action::ReaderPartition { .. } => NemesisKind::ReaderPartition,
            Action::TrainerKill => NemesisKind::Trainer,
        }
    }

    /// The worker a worker fault hits.
    pub fn worker(&self) -> Option<u32> {
        match self {
            Action::WorkerKill { worker }
            | Action::WorkerPause { worker }
            | Action::WorkerRestart { worker }
            | Action::WorkerPartition { worker, .. }
            | Action::ReaderPartition { worker, .. } => Some(*worker),
            Action::Kill { .. }
            | Action::Pause { .. }
            | Action::Restart { .. }
            | Action::Partition { .. }
            | Action::TrainerKill => None,
        }
    }

    /// Whether the fault is aimed at the leader of the moment.
    pub fn aims_at_leader(&self) -> bool {
        match self {
            Action::Kill { target } | Action::Pause { target } | Action::Restart { target } => {
                *target == Target::Leader
            }
            Action::Partition { shape, .. } => !matches!(shape, Shape::Halves(_)),
            Action::WorkerKill { .. }
            | Action::WorkerPause { .. }
            | Action::WorkerRestart { .. }
            | Action::WorkerPartition { .. }
            | Action::ReaderPartition { .. }
            | Action::TrainerKill => false,
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
    /// Defaults to 0, so any saved schedule.json loads for `check`.
    #[serde(default)]
    pub workers: u32,
    pub nemeses: Vec<NemesisKind>,
    /// Both tracks, by start time.
    pub faults: Vec<Fault>,
}

/// The first fault waits this long, so the cluster and workload are warm.
const FIRST_FAULT: Duration = Duration::from_millis(2000);
/// Starts of consecutive faults are 3–5 s apart; a fault is held 1–4 s.
const GAP_MS: (u64, u64) = (3000, 5000);
const HOLD_MS: (u64, u64) = (1000, 4000);
/// Quiet time after a fault heals before the next may start.
const SETTLE_MS: u64 = 500;
/// The worker track starts this much after the dispatcher track, so the two rarely begin at
/// the same moment.
const WORKER_TRACK_OFFSET_MS: u64 = 1500;
/// Mixed into the seed for the worker track's own generator, so a seed's dispatcher track does
/// not depend on whether worker faults are asked for.
const WORKER_TRACK_SEED: u64 = 0x7755_0000_0000_0001;
/// The trainer track's own generator, likewise.
const TRAINER_TRACK_SEED: u64 = 0x7755_0000_0000_0002;
/// The trainer track starts this much after the dispatcher track: the trainer has taken its
/// first states by then.
const TRAINER_TRACK_OFFSET_MS: u64 = 700;
/// Starts of consecutive trainer kills are 1.5–4 s apart; the reader stays down 0–1 s.
const TRAINER_GAP_MS: (u64, u64) = (1500, 4000);
const TRAINER_DOWN_MS: (u64, u64) = (0, 1000);

impl Schedule {
    /// The plan for `seed`: both tracks, merged by start time and numbered in that order.
    pub fn generate(
        seed: u64,
        time: Duration,
        nodes: u64,
        workers: u32,
        nemeses: &[NemesisKind],
    ) -> Schedule {
        let time_ms = time.as_millis() as u64;
        let of_track = |track: Track| -> Vec<NemesisKind> {
            nemeses
                .iter()
                .copied()
                .filter(|k| k.track() == track)
                .collect()
        };
        let mut faults = dispatcher_track(seed, time_ms, nodes, &of_track(Track::Dispatchers));
        faults.extend(worker_track(
            seed,
            time_ms,
            workers,
            &of_track(Track::Workers),
        ));
        if nemeses.contains(&NemesisKind::Trainer) {
            faults.extend(trainer_track(seed, time_ms));
        }
        faults.sort_by_key(|f| f.at_ms);
        for (i, fault) in faults.iter_mut().enumerate() {
            fault.id = i as u32 + 1;
        }
        Schedule {
            seed,
            time_ms,
            nodes,
            workers,
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

/// Start and hold of the next fault of a track, or `None` when the run is over.
fn next_slot(rng: &mut StdRng, at: u64, time_ms: u64) -> Option<u64> {
    let hold = rng.random_range(HOLD_MS.0..=HOLD_MS.1);
    (at + hold + SETTLE_MS <= time_ms).then_some(hold)
}

/// Where the fault after one at `at` held `hold` may start.
fn after(rng: &mut StdRng, at: u64, hold: u64) -> u64 {
    let gap = rng.random_range(GAP_MS.0..=GAP_MS.1);
    (at + gap).max(at + hold + SETTLE_MS)
}

/// Takes the next kind from a shuffled bag of `kinds`, refilling it when empty, so every kind
/// appears before any appears twice.
fn draw(rng: &mut StdRng, bag: &mut Vec<NemesisKind>, kinds: &[NemesisKind]) -> NemesisKind {
    if bag.is_empty() {
        *bag = kinds.to_vec();
        bag.sort();
        bag.dedup();
        bag.shuffle(rng);
    }
    bag.pop().expect("the bag was just refilled")
}

/// The worker track: faults on one random worker at a time, kinds from a shuffled bag, link
/// cuts with a mode drawn from every way a link can be cut.
fn worker_track(seed: u64, time_ms: u64, workers: u32, nemeses: &[NemesisKind]) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed ^ WORKER_TRACK_SEED);
    let mut faults = Vec::new();
    let mut bag = Vec::new();
    let mut at = FIRST_FAULT.as_millis() as u64 + WORKER_TRACK_OFFSET_MS;
    while workers > 0 && !nemeses.is_empty() {
        let Some(hold) = next_slot(&mut rng, at, time_ms) else {
            break;
        };
        let worker = rng.random_range(1..=workers);
        let mode = *LinkMode::CUTS.choose(&mut rng).expect("not empty");
        let action = match draw(&mut rng, &mut bag, nemeses) {
            NemesisKind::WorkerKill => Action::WorkerKill { worker },
            NemesisKind::WorkerPause => Action::WorkerPause { worker },
            NemesisKind::WorkerRestart => Action::WorkerRestart { worker },
            NemesisKind::WorkerPartition => Action::WorkerPartition {
                worker,
                shape: if rng.random_bool(0.5) {
                    WorkerShape::AllDispatchers
                } else {
                    WorkerShape::Leader
                },
                mode,
            },
            NemesisKind::ReaderPartition => Action::ReaderPartition { worker, mode },
            other => unreachable!("{other} is not a worker fault"),
        };
        faults.push(Fault {
            id: 0,
            at_ms: at,
            hold_ms: hold,
            action,
        });
        at = after(&mut rng, at, hold);
    }
    faults
}

/// The trainer track: kills of the trainer's reading process, more often than the other
/// tracks' faults (a kill costs the run little), each followed by a short down time.
fn trainer_track(seed: u64, time_ms: u64) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed ^ TRAINER_TRACK_SEED);
    let mut faults = Vec::new();
    let mut at = FIRST_FAULT.as_millis() as u64 + TRAINER_TRACK_OFFSET_MS;
    loop {
        let hold = rng.random_range(TRAINER_DOWN_MS.0..=TRAINER_DOWN_MS.1);
        if at + hold + SETTLE_MS > time_ms {
            break;
        }
        faults.push(Fault {
            id: 0,
            at_ms: at,
            hold_ms: hold,
            action: Action::TrainerKill,
        });
        at += rng
            .random_range(TRAINER_GAP_MS.0..=TRAINER_GAP_MS.1)
            .max(hold + SETTLE_MS);
    }
    faults
}

/// The dispatcher track. Every enabled nemesis appears before any appears twice (a shuffled
/// bag), so a run long enough for `nemeses.len()` faults covers them all; the first kill,
/// pause and restart aim at the leader, later ones at the leader or a random node.
/// Partition shapes are drawn from a second bag.
fn dispatcher_track(seed: u64, time_ms: u64, nodes: u64, nemeses: &[NemesisKind]) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let minority = (nodes.saturating_sub(1) / 2) as usize;
    let mut faults = Vec::new();
    let mut bag: Vec<NemesisKind> = Vec::new();
    let mut shapes: Vec<u8> = Vec::new();
    let mut aimed_at_leader: Vec<NemesisKind> = Vec::new();
    let mut at = FIRST_FAULT.as_millis() as u64;
    while minority > 0 && !nemeses.is_empty() {
        let Some(hold) = next_slot(&mut rng, at, time_ms) else {
            break;
        };
        let kind = draw(&mut rng, &mut bag, nemeses);
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
            other => unreachable!("{other} is not a dispatcher fault"),
        };
        faults.push(Fault {
            id: 0,
            at_ms: at,
            hold_ms: hold,
            action,
        });
        at = after(&mut rng, at, hold);
    }
    faults
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let a = Schedule::generate(7, Duration::from_secs(45), 3, 2, &NemesisKind::ALL);
        let b = Schedule::generate(7, Duration::from_secs(45), 3, 2, &NemesisKind::ALL);
        assert_eq!(a, b);
        let c = Schedule::generate(8, Duration::from_secs(45), 3, 2, &NemesisKind::ALL);
        assert_ne!(a, c);
    }

    #[test]
    fn faults_do_not_overlap_and_cover_every_nemesis() {
        for seed in 0..50 {
            let s = Schedule::generate(seed, Duration::from_secs(30), 3, 2, &NemesisKind::ALL);
            for of in [Track::Dispatchers, Track::Workers, Track::Trainer] {
                let track: Vec<&Fault> = s
                    .faults
                    .iter()
                    .filter(|f| f.action.kind().track() == of)
                    .collect();
                for pair in track.windows(2) {
                    assert!(pair[1].at() >= pair[0].end(), "seed {seed}: overlap");
                }
            }
            for (i, f) in s.faults.iter().enumerate() {
                assert_eq!(f.id as usize, i + 1, "numbered by start");
                if let Some(worker) = f.action.worker() {
                    assert!((1..=2).contains(&worker), "seed {seed}: worker {worker}");
                }
            }
            for f in &s.faults {
                assert!(f.end() <= Duration::from_secs(30));
                if f.action == Action::TrainerKill {
                    assert!(f.hold_ms <= 1000, "seed {seed}: trainer down too long");
                } else {
                    assert!((1000..=4000).contains(&f.hold_ms));
                }
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

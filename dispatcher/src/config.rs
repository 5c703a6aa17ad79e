//! `DispatcherConfig`: what one dispatcher replica needs to start, validated once.

use crate::network_faults::NetworkFaults;
use sluice_journal::JournalIdentity;
use sluice_security::ServerSecurity;
use sluice_types::NodeId;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The cluster id of a quorum that was given none.
pub const DEFAULT_CLUSTER_ID: &str = "sluice";

#[derive(Clone, Debug)]
pub struct DispatcherConfig {
    /// This replica's Raft id.
    pub id: NodeId,
    /// Address of the client API (the `Dispatcher` service, for workers and clients); port 0
    /// binds a free port.
    pub listen: String,
    /// Address of the Raft peer listener (the `RaftPeer` service, for the other replicas only);
    /// port 0 binds a free port.
    pub peer_listen: String,
    /// The client address put in the membership, which followers name as the leader hint;
    /// `None`: the bound client address (wrong when listening on `0.0.0.0`).
    pub advertise_address: Option<String>,
    /// The journal directory (sled db, format header, identity). A missing or empty one is
    /// refused unless `init` or `join` is set.
    pub data_dir: PathBuf,
    /// The quorum's name, the same on every replica; recorded in each replica's journal, so a
    /// data dir of another cluster is refused.
    pub cluster_id: String,
    /// First start of a replica of a new quorum: create its journal in a missing or empty
    /// `data_dir`, and (on the replica with the lowest id in `peers`) initialize the quorum.
    /// On a replica that has its journal it changes nothing. Never set it on a restart: a
    /// replica that lost its data dir would come back with no log and no vote.
    pub init: bool,
    /// Every replica's id and peer address, the same on every node. Empty: a one-node cluster
    /// of this replica at its bound peer address.
    pub peers: BTreeMap<NodeId, String>,
    /// Join an existing cluster (`sluice admin add-node`) instead of initializing one: create
    /// an empty journal in a missing or empty `data_dir`, and wait until a leader adds it.
    pub join: bool,
    /// With `init` on an empty journal and other `peers`: how long the start waits for the
    /// peers' answers to its check that they form no cluster that knows this replica (see
    /// `sluice admin` and the recovery path in the operations guide), so that a refusal comes
    /// before the replica says it serves. Past it the check goes on in the background, and the
    /// replica takes part in Raft only once enough peers have answered.
    pub init_check_wait: Duration,
    /// Raft leader heartbeat period.
    pub heartbeat_interval: Duration,
    /// Raft election timeout range; a follower that hears no leader for a random time in it
    /// starts an election.
    pub election_timeout: (Duration, Duration),
    /// Entries between snapshots (log compaction).
    pub snapshot_logs_since_last: u64,
    /// Entries kept in the log behind a snapshot, so a briefly lagging replica catches up from
    /// the log; one further behind gets the snapshot.
    pub logs_kept_after_snapshot: u64,
    /// How long a write waits to be committed before its caller hears `Unavailable` (and
    /// retries it with the same request id, perhaps at a newer leader). A leader cut off from
    /// its quorum answers this way after it.
    pub commit_timeout: Duration,
    /// A worker silent this long is removed and its unfinished tasks dropped (decided by the
    /// leader, replicated).
    pub worker_timeout: Duration,
    /// A client silent this long is released from its iteration.
    pub client_timeout: Duration,
    /// An iteration without clients this long is garbage collected; `None` never collects.
    /// The same timeout later removes ended iterations without clients, and jobs without
    /// iterations, from the state.
    pub job_gc_timeout: Option<Duration>,
    /// A dataset no job has read for this long is removed from the state (`from_dataset_id`
    /// of it then fails); `None` keeps datasets forever.
    pub dataset_gc_timeout: Option<Duration>,
    /// Whether distributed_epoch iterations are collected too (tf.data's default: no).
    pub gc_dynamic_jobs: bool,
    /// How this replica reaches some peers, overriding their address in the membership (a chaos
    /// harness routes each directed link through its own proxy). Usually empty.
    pub raft_routes: BTreeMap<NodeId, String>,
    /// Raft links cut by a test harness (partitions); `None` outside tests.
    pub faults: Option<Arc<NetworkFaults>>,
    /// The fixed worker list of static sharding (tf.data's `worker_addresses`): `host:port`,
    /// `host`, or `host:%port%` / `host:%port_name%` for any port. A worker's index is its
    /// entry's position. Empty: any worker may register, and static sharding policies fail.
    /// Every replica must run with the same list.
    pub worker_addresses: Vec<String>,
    /// TLS and authentication of every listener, and what this replica presents to its peers.
    pub security: ServerSecurity,
    /// The only directories `files()` datasets may name (canonicalized at start; each must be
    /// an existing directory). Empty: every files source is refused, the safe default.
    pub data_roots: Vec<PathBuf>,
    /// Per-store settings of object stores (`--object-store-config`): the JSON file of
    /// endpoints, regions and credentials by bucket (see `sluice_formats::ObjectStoreSettings`),
    /// loaded at start, for listing patterns at registration. `None`: the environment's only.
    pub object_store_config: Option<PathBuf>,
    /// The largest dataset definition a registration may carry, in bytes (encoded, after its
    /// file patterns are expanded). Definitions travel through the Raft log to every replica,
    /// and openraft gives an append one heartbeat interval to reach a follower: a larger limit
    /// needs a longer heartbeat. Every replica must run with the same value: it also sets how
    /// large a Raft message the peers accept.
    pub max_definition_size: u64,
    /// The most ops a registered definition may have (`--max-pipeline-ops`); more is refused
    /// with `InvalidArgument` before anything else is done with it.
    pub max_pipeline_ops: usize,
    /// The deepest nesting of tuples and dicts a registered definition may hold
    /// (`--max-pipeline-depth`).
    pub max_pipeline_depth: usize,
    /// Where the operations listener serves `/metrics`, `/live`, `/ready` and the status page
    /// (plain HTTP, read-only); port 0 binds a free port. `None`: no such listener.
    pub metrics_listen: Option<String>,
    /// The most bytes of blobs (the large tensors of definitions, kept as files under
    /// `data_dir/blobs`, see `blobs`) this replica stores (`--max-blob-store-size`); an upload
    /// past it is refused with `ResourceExhausted`.
    pub max_blob_store_size: u64,
    /// How long a blob no registered definition names is kept before it is deleted
    /// (`--blob-gc-grace`): an upload is followed by the registration that names it within it.
    pub blob_gc_grace: Duration,
    /// How often the replica deletes unnamed blobs and fetches the named ones it lacks.
    pub blob_maintenance_interval: Duration,
}

/// The default of [`DispatcherConfig::max_definition_size`].
pub const DEFAULT_MAX_DEFINITION_SIZE: u64 = 16 * 1024 * 1024;

/// The largest accepted value of [`DispatcherConfig::max_definition_size`]: with its margins
/// it must stay below protobuf's 2 GiB message bound.
pub const MAX_MAX_DEFINITION_SIZE: u64 = crate::state::MAX_DEFINITION_BYTES;

/// What a `RegisterDataset` request carries beside its definition (ids, element spec), and
/// what a log entry carries beside its requests, at most, before the client API refuses it.
pub const MESSAGE_MARGIN: usize = 4 * 1024 * 1024;

/// The smallest decode limit of the peer listener (Raft appends and snapshot chunks).
const MIN_PEER_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig {
            id: 1,
            listen: "127.0.0.1:0".into(),
            peer_listen: "127.0.0.1:0".into(),
            advertise_address: None,
            data_dir: PathBuf::from("sluice-data"),
            cluster_id: DEFAULT_CLUSTER_ID.into(),
            init: false,
            peers: BTreeMap::new(),
            join: false,
            init_check_wait: Duration::from_secs(3),
            heartbeat_interval: Duration::from_millis(50),
            election_timeout: (Duration::from_millis(200), Duration::from_millis(400)),
            snapshot_logs_since_last: 50_000,
            logs_kept_after_snapshot: 1000,
            commit_timeout: crate::proposer::COMMIT_TIMEOUT,
            worker_timeout: Duration::from_secs(10),
            client_timeout: Duration::from_secs(300),
            job_gc_timeout: Some(Duration::from_secs(300)),
            dataset_gc_timeout: Some(Duration::from_secs(24 * 3600)),
            gc_dynamic_jobs: false,
            raft_routes: BTreeMap::new(),
            faults: None,
            worker_addresses: Vec::new(),
            security: ServerSecurity::default(),
            data_roots: Vec::new(),
            object_store_config: None,
            max_definition_size: DEFAULT_MAX_DEFINITION_SIZE,
            max_pipeline_ops: sluice_pipeline::DEFAULT_MAX_PIPELINE_OPS,
            max_pipeline_depth: sluice_pipeline::DEFAULT_MAX_PIPELINE_DEPTH,
            metrics_listen: None,
            max_blob_store_size: DEFAULT_MAX_BLOB_STORE_SIZE,
            blob_gc_grace: Duration::from_secs(600),
            blob_maintenance_interval: Duration::from_secs(30),
        }
    }
}

/// The default of [`DispatcherConfig::max_blob_store_size`]: 8 GiB.
pub const DEFAULT_MAX_BLOB_STORE_SIZE: u64 = 8 << 30;

impl DispatcherConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !self.peers.is_empty() && !self.peers.contains_key(&self.id) {
            let ids: Vec<String> = self.peers.keys().map(|k| k.to_string()).collect();
            return Err(format!(
                "--id {} is not in --peers (ids: {})",
                self.id,
                ids.join(", ")
            ));
        }
        if self.init && self.join {
            return Err(
                "--init and --join exclude each other: --init creates a new quorum, \
                 --join waits to be added to a running one"
                    .into(),
            );
        }
        self.journal_identity()?;
        let (min, max) = self.election_timeout;
        if min <= self.heartbeat_interval || max <= min {
            return Err(format!(
                "election timeout {min:?}..{max:?} must exceed the heartbeat interval {:?} and \
                 be a non-empty range",
                self.heartbeat_interval
            ));
        }
        if self.commit_timeout.is_zero() {
            return Err("the commit timeout must be positive".into());
        }
        if self.worker_timeout < Duration::from_millis(200)
            || self.client_timeout < Duration::from_millis(200)
        {
            return Err("worker and client timeouts must be at least 200ms".into());
        }
        if let Some(empty) = self.worker_addresses.iter().find(|a| a.trim().is_empty()) {
            return Err(format!(
                "worker addresses must not be empty, got {empty:?} in {:?}",
                self.worker_addresses
            ));
        }
        if let Some(advertised) = &self.advertise_address {
            if !is_host_port(advertised) {
                return Err(format!("advertise address '{advertised}' is not HOST:PORT"));
            }
        }
        if let Some(listen) = &self.metrics_listen {
            if !is_host_port(listen) {
                return Err(format!("--metrics-listen '{listen}' is not HOST:PORT"));
            }
        }
        if self.snapshot_logs_since_last == 0 {
            return Err("snapshot interval must be at least one entry".into());
        }
        if self.max_definition_size == 0 || self.max_definition_size > MAX_MAX_DEFINITION_SIZE {
            return Err(format!(
                "--max-definition-size {} must be between 1 and {MAX_MAX_DEFINITION_SIZE} bytes",
                self.max_definition_size
            ));
        }
        if self.max_pipeline_ops == 0 || self.max_pipeline_depth == 0 {
            return Err(format!(
                "--max-pipeline-ops {} and --max-pipeline-depth {} must be positive",
                self.max_pipeline_ops, self.max_pipeline_depth
            ));
        }
        Ok(())
    }

    /// The pipeline limits registrations are checked against.
    pub fn pipeline_limits(&self) -> sluice_pipeline::PipelineLimits {
        sluice_pipeline::PipelineLimits {
            max_ops: self.max_pipeline_ops,
            max_depth: self.max_pipeline_depth,
        }
    }

    /// The identity this replica's journal must have: its cluster id and node id.
    pub fn journal_identity(&self) -> Result<JournalIdentity, String> {
        JournalIdentity::new(self.cluster_id.clone(), self.id).map_err(|e| e.to_string())
    }

    /// The client API's decode limit: the largest definition plus the margin, so a request a
    /// little over the limit still reaches the handler and gets its error naming the flag.
    pub fn client_message_limit(&self) -> usize {
        self.max_definition_bytes().saturating_add(MESSAGE_MARGIN)
    }

    /// The peer listener's decode limit, which every replica assumes of the others: above the
    /// largest log entry (one definition and its margin) with room for a second, so an append
    /// is only ever too large for several entries, and openraft can split it.
    pub fn peer_message_limit(&self) -> usize {
        self.client_message_limit()
            .saturating_mul(2)
            .max(MIN_PEER_MESSAGE_BYTES)
    }

    /// [`DispatcherConfig::max_definition_size`] as a length.
    pub fn max_definition_bytes(&self) -> usize {
        usize::try_from(self.max_definition_size).unwrap_or(usize::MAX)
    }

    /// Parses `host:port,host:%port%,...` (the static-sharding worker list).
    pub fn parse_worker_addresses(text: &str) -> Vec<String> {
        text.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// Parses `1=host:port,2=host:port,...` (peer addresses).
    pub fn parse_peers(text: &str) -> Result<BTreeMap<NodeId, String>, String> {
        let mut peers = BTreeMap::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (id, addr) = item
                .split_once('=')
                .ok_or_else(|| format!("invalid peer '{item}': expected ID=HOST:PORT"))?;
            let id: NodeId = id
                .trim()
                .parse()
                .map_err(|_| format!("invalid peer '{item}': '{id}' is not a node id"))?;
            let addr = addr.trim();
            if !is_host_port(addr) {
                return Err(format!("invalid peer '{item}': '{addr}' is not HOST:PORT"));
            }
            if peers.insert(id, addr.to_string()).is_some() {
                return Err(format!("invalid peers: node id {id} appears twice"));
            }
        }
        Ok(peers)
    }
}

/// Whether `addr` has the form `HOST:PORT`.
fn is_host_port(addr: &str) -> bool {
    addr.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peers a text parses to, or the error text.
    type Parsed = Result<Vec<(u64, &'static str)>, &'static str>;

    #[test]
    fn validate_table() {
        let cases: Vec<(DispatcherConfig, Option<&str>)> = vec![
            (DispatcherConfig::default(), None),
            (
                DispatcherConfig {
                    init: true,
                    cluster_id: "prod-eu.1".into(),
                    ..DispatcherConfig::default()
                },
                None,
            ),
            (
                DispatcherConfig {
                    join: true,
                    ..DispatcherConfig::default()
                },
                None,
            ),
            (
                DispatcherConfig {
                    init: true,
                    join: true,
                    ..DispatcherConfig::default()
                },
                Some("--init and --join exclude each other"),
            ),
            (
                DispatcherConfig {
                    cluster_id: "my cluster".into(),
                    ..DispatcherConfig::default()
                },
                Some("invalid journal identity: cluster id \"my cluster\" may only hold"),
            ),
            (
                DispatcherConfig {
                    cluster_id: String::new(),
                    ..DispatcherConfig::default()
                },
                Some("cluster id \"\" is empty"),
            ),
        ];
        for (config, refusal) in cases {
            match (config.validate(), refusal) {
                (Ok(()), None) => {}
                (Err(e), Some(says)) => assert!(e.contains(says), "{config:?}: {e}"),
                (got, want) => panic!("{config:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn peers_parse_table() {
        let cases: &[(&str, Parsed)] = &[
            ("1=127.0.0.1:5001", Ok(vec![(1, "127.0.0.1:5001")])),
            (
                "1=a:1, 2=b:2,3=c:3",
                Ok(vec![(1, "a:1"), (2, "b:2"), (3, "c:3")]),
            ),
            ("1", Err("invalid peer '1': expected ID=HOST:PORT")),
            ("x=a:1", Err("invalid peer 'x=a:1': 'x' is not a node id")),
            ("1=a", Err("invalid peer '1=a': 'a' is not HOST:PORT")),
            ("1=a:1,1=b:2", Err("invalid peers: node id 1 appears twice")),
        ];
        for (text, want) in cases {
            let got = DispatcherConfig::parse_peers(text);
            let want = want
                .clone()
                .map(|v| v.into_iter().map(|(k, a)| (k, a.to_string())).collect());
            assert_eq!(got, want.map_err(|e: &str| e.to_string()), "{text}");
        }
    }

    #[test]
    fn the_definition_limit_is_bounded_and_sets_both_decode_limits() {
        let mib = 1024 * 1024;
        for (size, valid) in [(0, false), (1, true), (64 * mib, true), (2048 * mib, false)] {
            let config = DispatcherConfig {
                max_definition_size: size,
                ..DispatcherConfig::default()
            };
            assert_eq!(config.validate().is_ok(), valid, "{size}");
        }
        let default = DispatcherConfig::default();
        assert_eq!(default.client_message_limit(), 20 * mib as usize);
        assert_eq!(default.peer_message_limit(), 256 * mib as usize);
        let raised = DispatcherConfig {
            max_definition_size: 512 * mib,
            ..DispatcherConfig::default()
        };
        assert_eq!(raised.peer_message_limit(), 2 * 516 * mib as usize);
    }
}

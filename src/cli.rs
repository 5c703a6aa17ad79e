//! Argument definitions of the `sluice` CLI, kept stable: tests and the chaos harness drive it.

use anyhow::Context;
use clap::builder::FalseyValueParser;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

const DEFAULT_LOG: &str = "warn,openraft=error";

/// TLS and authentication of a server (dispatcher or worker).
#[derive(Args, Debug, Clone, Default)]
pub struct ServerSecurityArgs {
    /// This server's certificate (PEM). With --tls-key, every listener of it speaks TLS.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// The CA (PEM) that callers' certificates are verified against (replicas require them of
    /// each other); the servers this one calls are verified against it too.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Tokens this server accepts (`ROLE NAME TOKEN` lines) and presents when it calls others;
    /// or one shared token (also from SLUICE_AUTH_TOKEN).
    #[arg(long, env = "SLUICE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Serve beyond loopback without TLS and authentication (only on a network you trust).
    #[arg(long)]
    pub insecure: bool,
}

impl ServerSecurityArgs {
    pub fn load(&self) -> anyhow::Result<sluice_security::ServerSecurity> {
        Ok(sluice_security::ServerSecurity::load(
            &sluice_security::ServerSecurityFiles {
                tls_cert: self.tls_cert.clone(),
                tls_key: self.tls_key.clone(),
                tls_ca: self.tls_ca.clone(),
                token_file: self.auth_token_file.clone(),
                insecure: self.insecure,
            },
        )?)
    }
}

/// TLS and authentication of a caller (`read`, `register`, `status`, `admin`).
#[derive(Args, Debug, Clone, Default)]
pub struct ClientSecurityArgs {
    /// The CA (PEM) the servers' certificates are verified against; turns TLS on.
    #[arg(long, env = "SLUICE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM) for mutual TLS.
    #[arg(long, env = "SLUICE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "SLUICE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// The token to present (a file with one token, or `ROLE NAME TOKEN` lines of which the
    /// command's role is used); or SLUICE_AUTH_TOKEN.
    #[arg(long, env = "SLUICE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
}

impl ClientSecurityArgs {
    /// What this command presents, acting as `role`.
    pub fn load(
        &self,
        role: sluice_security::Role,
    ) -> anyhow::Result<sluice_security::ClientSecurity> {
        Ok(sluice_security::ClientSecurity::load(
            &sluice_security::ClientSecurityFiles {
                tls_ca: self.tls_ca.clone(),
                tls_cert: self.tls_cert.clone(),
                tls_key: self.tls_key.clone(),
                token_file: self.auth_token_file.clone(),
            },
            role,
        )?)
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "sluice",
    version,
    about = "A fault-tolerant data service for ML input pipelines"
)]
pub struct Cli {
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info` or `sluice_dispatcher=debug`.
    #[arg(long, global = true, env = "SLUICE_LOG", default_value = DEFAULT_LOG)]
    pub log: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run one dispatcher replica.
    Dispatcher(DispatcherArgs),
    /// Run a worker.
    Worker(WorkerArgs),
    /// Read a dataset through the service and print one JSON value per element.
    Read(ReadArgs),
    /// Register a dataset and print its id.
    Register(RegisterArgs),
    /// Print the dispatcher's view of the cluster and its state as JSON.
    Status(StatusArgs),
    /// Change the dispatcher quorum's membership.
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Run the showcase: a local cluster, a distributed epoch, and a summary.
    Demo(DemoArgs),
    /// Measure throughput and latencies on loopback (servers as child processes).
    Bench(sluice_bench::BenchArgs),
    /// Make a cluster's CA, certificates and tokens (offline), for --tls-* and --auth-token-file.
    Certs(CertsArgs),
}

#[derive(Args, Debug)]
pub struct CertsArgs {
    /// Directory to write into (created; existing files are never overwritten).
    #[arg(long)]
    pub out: PathBuf,
    /// A host name or IP address the dispatcher replicas are reached at (repeatable), on the
    /// dispatcher's certificate only; localhost, 127.0.0.1 and ::1 are always included.
    #[arg(long = "host")]
    pub hosts: Vec<String>,
    /// A host name (wildcards allowed) or IP address every worker certificate names
    /// (repeatable), e.g. the workers' DNS zone.
    #[arg(long = "worker-host")]
    pub worker_hosts: Vec<String>,
    /// A worker that gets its own certificate and token, as NAME or NAME=HOST[,HOST...] with
    /// the hosts it is reached at (repeatable); without any, all workers share one `worker`
    /// identity.
    #[arg(long = "worker")]
    pub workers: Vec<String>,
    /// Validity of the certificates, in days.
    #[arg(long, default_value_t = 365)]
    pub days: u32,
}

#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Add a replica started with `sluice dispatcher --join`: a learner until it has caught up,
    /// then a voter. One that does not catch up in time is removed again, voters unchanged.
    AddNode(AddNodeArgs),
    /// Remove a replica (voter or learner) from the quorum; refused if the voters answering the
    /// leader would be no majority, unless --force.
    RemoveNode(RemoveNodeArgs),
}

#[derive(Args, Debug)]
pub struct AddNodeArgs {
    /// Dispatcher replicas, comma-separated.
    #[arg(long)]
    pub dispatcher: String,
    /// The new replica's id.
    #[arg(long)]
    pub id: u64,
    /// The new replica's Raft peer address (its `--peer-listen`). Its client address enters
    /// the membership once it has caught up and recorded it.
    #[arg(long)]
    pub peer_addr: String,
    /// How long the new replica may take to catch up with the leader's log before it is
    /// removed again (the voters stay as they were).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub catch_up_timeout: std::time::Duration,
    #[command(flatten)]
    pub security: ClientSecurityArgs,
}

#[derive(Args, Debug)]
pub struct RemoveNodeArgs {
    /// Dispatcher replicas, comma-separated.
    #[arg(long)]
    pub dispatcher: String,
    /// The replica's id.
    #[arg(long)]
    pub id: u64,
    /// Remove a voter even when the voters answering the leader would then be no majority
    /// (the cluster accepts no write until enough of them are back).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub security: ClientSecurityArgs,
}

#[derive(Args, Debug)]
pub struct DispatcherArgs {
    /// This replica's id in --peers, or `from-hostname`: the host name's trailing `-N` plus
    /// one (a StatefulSet pod `NAME-0` is replica 1).
    #[arg(long, value_name = "N|from-hostname", default_value = "1")]
    pub id: crate::node_id_arg::NodeIdArg,
    /// Address of the client API, for clients, workers and admins (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Address of the Raft peer listener, for the other replicas only. Default: this node's
    /// entry in --peers, else `127.0.0.1:0` (any free port).
    #[arg(long, value_name = "HOST:PORT")]
    pub peer_listen: Option<String>,
    /// The client address followers name as the leader hint. Default: the bound --listen
    /// address (set it when listening on `0.0.0.0`).
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise_address: Option<String>,
    /// Journal directory. A missing or empty one is refused unless --init or --join is given;
    /// a journal of another cluster or node is refused always.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The quorum's name, the same on every replica of it; recorded in the journal, so a data
    /// dir of another cluster is refused.
    #[arg(long, value_name = "NAME", default_value = sluice_dispatcher::DEFAULT_CLUSTER_ID)]
    pub cluster_id: String,
    /// First start of a new quorum: create the journal in a missing or empty --data-dir, and
    /// (on the replica with the lowest id in --peers) initialize the quorum. With an empty
    /// journal and other --peers, it first asks them, and refuses to start if they already form
    /// a cluster in which this id has served (or one without it). Harmless on a replica that
    /// has its journal; never needed on a restart. Also SLUICE_INIT=true.
    #[arg(long, conflicts_with = "join", env = "SLUICE_INIT", value_parser = FalseyValueParser::new())]
    pub init: bool,
    /// Every replica's peer address: `1=HOST:PEERPORT,2=HOST:PEERPORT,3=HOST:PEERPORT`, the
    /// same on every node. Omit for a one-node dispatcher.
    #[arg(long, default_value = "")]
    pub peers: String,
    /// How this node reaches some peers, overriding --peers for its own Raft traffic:
    /// `2=HOST:PORT,3=HOST:PORT` (a chaos harness routes each link through a proxy).
    #[arg(long, default_value = "")]
    pub raft_routes: String,
    /// Join an existing quorum: create an empty journal in a missing or empty --data-dir and
    /// wait to be added with `sluice admin add-node`. Harmless on a replica that has its
    /// journal. Also SLUICE_JOIN=true.
    #[arg(long, env = "SLUICE_JOIN", value_parser = FalseyValueParser::new())]
    pub join: bool,
    /// With --init, an empty data dir and other --peers: how long the start waits for the
    /// peers' answers before it says it serves (READY). A refusal within it comes before READY;
    /// past it the check goes on, and the replica votes for nobody until enough peers answer.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3s")]
    pub init_check_wait: Duration,
    /// Raft heartbeat period.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "50ms")]
    pub heartbeat_interval: Duration,
    /// Raft election timeout, lower bound (the upper bound is twice this). A dead leader is
    /// replaced after one to two of these (followers honour the old leader's lease first).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "200ms")]
    pub election_timeout: Duration,
    /// Log entries between snapshots. Each snapshot encodes and writes the whole state (some
    /// megabytes under thousands of workers and clients); too often, and a busy leader spends
    /// its time on them.
    #[arg(long, default_value_t = 50_000)]
    pub snapshot_every: u64,
    /// A worker silent this long is removed: its exactly-once tasks move to other workers, its
    /// other unfinished tasks are dropped.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub worker_timeout: Duration,
    /// A client silent this long is released from its iteration.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5m")]
    pub client_timeout: Duration,
    /// An iteration without clients this long is garbage collected; an ended one without
    /// clients, and a job without iterations, this long idle are forgotten (`never` keeps them).
    #[arg(long, value_parser = parse_optional_duration, default_value = "5m")]
    pub job_gc_timeout: MaybeDuration,
    /// Collect distributed_epoch iterations without clients too (by default they keep their
    /// place, so a reader that comes back continues them).
    #[arg(long)]
    pub gc_dynamic_jobs: bool,
    /// A dataset no job has read for this long is forgotten (`never` to keep datasets).
    #[arg(long, value_parser = parse_optional_duration, default_value = "24h")]
    pub dataset_gc_timeout: MaybeDuration,
    /// The largest dataset definition a registration may carry, e.g. `16MiB` (the same on
    /// every replica); larger ones are refused before they reach the Raft log.
    #[arg(long, value_parser = parse_size, default_value = "16MiB")]
    pub max_definition_size: u64,
    /// The most bytes of blobs (large tensors of definitions, kept outside the Raft log as
    /// files under the data dir) this replica stores, e.g. `8GiB`; uploads past it are refused.
    #[arg(long, value_parser = parse_size, default_value = "8GiB")]
    pub max_blob_store_size: u64,
    /// How long a blob that no registered definition names is kept before it is deleted (an
    /// upload must be followed by its registration within this time).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    pub blob_gc_grace: Duration,
    #[command(flatten)]
    pub pipeline_limits: PipelineLimitArgs,
    /// Fixed worker list for static sharding (file, data, file_or_data, hint), the same on every
    /// replica: `HOST:PORT`, `HOST` or `HOST:%port%` (any port) entries, comma-separated. A
    /// worker's index is the position of its entry.
    #[arg(long, default_value = "")]
    pub worker_addresses: String,
    #[command(flatten)]
    pub security: ServerSecurityArgs,
    /// A directory `files()` datasets may read below (repeatable), or an object-store URL
    /// prefix (`s3://bucket/prefix`) they may read objects below. Without one, every files
    /// source is refused.
    #[arg(long = "data-root", value_name = "DIR|URL")]
    pub data_roots: Vec<PathBuf>,
    /// Per-store settings of object stores, for listing patterns at registration: a JSON file
    /// of endpoint, region, credentials (inline, `{"env": NAME}` or `{"file": PATH}`) and
    /// client options by `SCHEME://BUCKET` or `SCHEME://` (see the guide). They override the
    /// environment's and are never shown in logs, status pages or errors.
    #[arg(long, value_name = "FILE")]
    pub object_store_config: Option<PathBuf>,
    /// Serve `/metrics` (Prometheus), `/live`, `/ready` and the status page (`/`) over plain HTTP at
    /// HOST:PORT (port 0: any free port; the READY line then names it as `metrics=HOST:PORT`).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<String>,
    /// Threads that serve the client API: requests, long polls, the proposer and the timers
    /// (default: one per core; Raft runs on a thread of its own). Where replicas share
    /// cores with each other or with other busy processes, give each its share: a runtime's
    /// threads wake each other for every task one of them could take over, and on cores that
    /// are already busy that costs more than it gains.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
}

/// A duration that may be absent (`never`); an alias, so clap does not take the argument for an
/// optional one.
pub type MaybeDuration = Option<Duration>;

/// A duration, or `never`.
fn parse_optional_duration(text: &str) -> Result<Option<Duration>, humantime::DurationError> {
    match text {
        "never" => Ok(None),
        _ => humantime::parse_duration(text).map(Some),
    }
}

/// How large a definition a server builds (dispatcher and worker alike).
#[derive(Args, Debug)]
pub struct PipelineLimitArgs {
    /// The most ops a dataset definition may have, counting those of nested datasets (each
    /// nested dataset one more, for its source); a larger one is refused with
    /// INVALID_ARGUMENT (at registration on a dispatcher, before its task runs on a worker).
    #[arg(long, value_name = "N", default_value_t = sluice_pipeline::DEFAULT_MAX_PIPELINE_OPS)]
    pub max_pipeline_ops: usize,
    /// The deepest nesting of tuples and dicts a definition may hold (in a from_slices or
    /// from_tensors source, or a Python op's output spec), and of datasets in datasets (zip,
    /// concatenate, sample_from_datasets, choose_from_datasets).
    #[arg(long, value_name = "N", default_value_t = sluice_pipeline::DEFAULT_MAX_PIPELINE_DEPTH)]
    pub max_pipeline_depth: usize,
}

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// Dispatcher replicas, comma-separated.
    #[arg(long)]
    pub dispatcher: String,
    /// Address to serve on and register under (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Worker tags (repeatable), e.g. COLOCATED.
    #[arg(long = "tag")]
    pub tags: Vec<String>,
    /// Address to register under and that clients dial, `HOST:PORT` (`%port%` stands for the
    /// bound port). Required when --listen is an unspecified address (0.0.0.0 or [::]).
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise_address: Option<String>,
    /// Memory per cross-trainer cache task, e.g. `64MiB`, `10GB` or `500` (bytes); at most the
    /// memory budget. Default: 10GiB, or half the memory budget if that is less.
    #[arg(long, value_parser = parse_size)]
    pub cross_trainer_cache_size: Option<u64>,
    /// Bytes the buffers of all tasks together may hold (batches being built, shuffle buffers,
    /// prefetch queues, cross-trainer caches), same units; an op past it fails its task with
    /// RESOURCE_EXHAUSTED. Default: half the machine's memory (8GiB if unknown).
    #[arg(long, value_parser = parse_size)]
    pub memory_budget: Option<u64>,
    /// Bytes of the memory budget that only a task within its fair share (the budget less the
    /// reserve, divided among the tasks holding memory) may take, so that one task's buffers
    /// cannot fail another's small ones; same units. Default: an eighth of the budget.
    #[arg(long, value_parser = parse_size)]
    pub memory_reserve: Option<u64>,
    #[command(flatten)]
    pub pipeline_limits: PipelineLimitArgs,
    /// A directory kept across restarts (created if missing): a fatal signal (abort, stack
    /// overflow, segfault) records there the tasks it interrupted, and the next start reports
    /// them, so their iterations fail instead of crashing other workers. Give each worker its
    /// own. Without it, no records are kept.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    #[command(flatten)]
    pub security: ServerSecurityArgs,
    /// A directory tasks may read files below (repeatable), or an object-store URL prefix
    /// (`s3://bucket/prefix`) they may read objects below; the store's credentials come from
    /// this process's environment (`AWS_ACCESS_KEY_ID`, ...). Without one, every file is
    /// refused.
    #[arg(long = "data-root", value_name = "DIR|URL")]
    pub data_roots: Vec<PathBuf>,
    /// Per-store settings of object stores: a JSON file of endpoint, region, credentials
    /// (inline, `{"env": NAME}` or `{"file": PATH}`) and client options by `SCHEME://BUCKET` or
    /// `SCHEME://` (see the guide). They override the environment's and are never shown in
    /// logs, status pages or errors.
    #[arg(long, value_name = "FILE")]
    pub object_store_config: Option<PathBuf>,
    /// Compress elements (of datasets registered with `auto` compression) for readers on this
    /// machine too. By default a task is compressed once a reader from another machine reads
    /// it: set this when readers reach the worker through a local proxy (a service mesh's
    /// sidecar, an SSH tunnel).
    #[arg(long)]
    pub compress_local_readers: bool,
    /// Send elements to readers on this machine over the socket only. By default a reader on
    /// the worker's machine, of the worker's user, reads large elements from a shared memory
    /// region of its stream instead, which saves both processes the copies through the kernel.
    #[arg(long)]
    pub no_shared_memory: bool,
    /// Run pipelines' Python functions in executor processes of this interpreter (it must
    /// import sluice, numpy and cloudpickle, at the clients' Python and cloudpickle versions).
    /// Without it, pipelines with Python functions are refused. Their code runs on this
    /// worker: serve only trusted, authenticated clients.
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// Python executor processes (default: one per core); needs --python.
    #[arg(long, value_name = "N", requires = "python")]
    pub python_executors: Option<usize>,
    /// First and largest number of splits a distributed_epoch task leases at once, `FIRST,MAX`
    /// (default 8,65536); leases double from the first while they are used up quickly.
    #[arg(long, value_name = "FIRST,MAX", value_parser = parse_split_lease)]
    pub split_lease: Option<(u32, u32)>,
    /// Print `LEASE <json>` on stdout for every split lease this worker gets (a chaos harness
    /// records them).
    #[arg(long, hide = true)]
    pub print_leases: bool,
    /// Serve `/metrics` (Prometheus), `/live`, `/ready` over plain HTTP at
    /// HOST:PORT (port 0: any free port; the READY line then names it as `metrics=HOST:PORT`).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<String>,
}

/// `FIRST,MAX`: two positive split counts, the first at most the second.
fn parse_split_lease(text: &str) -> Result<(u32, u32), String> {
    let parse = |part: &str| {
        part.trim()
            .parse::<u32>()
            .map_err(|e| format!("{text}: {e}"))
    };
    let (first, max) = text
        .split_once(',')
        .ok_or_else(|| format!("{text}: expected FIRST,MAX"))?;
    let (first, max) = (parse(first)?, parse(max)?);
    if first == 0 || max < first {
        return Err(format!("{text}: FIRST must be positive and at most MAX"));
    }
    Ok((first, max))
}

/// A size in bytes with an optional unit: `500`, `64KiB`, `64MiB`, `10GB` (case-insensitive).
fn parse_size(text: &str) -> Result<u64, String> {
    let size = byte_unit::Byte::parse_str(text, true)
        .map_err(|e| format!("{text}: {e}"))?
        .as_u64();
    if size == 0 {
        return Err(format!("{text}: the size must be positive"));
    }
    Ok(size)
}

#[derive(Args, Debug)]
pub struct ReadArgs {
    /// Dispatcher replicas, comma-separated.
    #[arg(long)]
    pub dispatcher: String,
    /// A dataset expression, e.g. `range(10).map(square)`.
    #[arg(
        long,
        conflicts_with = "dataset_id",
        required_unless_present = "dataset_id"
    )]
    pub dataset: Option<String>,
    /// A registered dataset id.
    #[arg(long)]
    pub dataset_id: Option<String>,
    /// parallel_epochs, distributed_epoch, off, dynamic, file, data, file_or_data, hint.
    #[arg(
        long,
        visible_alias = "processing-mode",
        default_value = "parallel_epochs"
    )]
    pub mode: String,
    /// Share the job with every consumer using this name.
    #[arg(long)]
    pub job_name: Option<String>,
    /// Elements requested or buffered at most (memory bound: element size × this).
    #[arg(long)]
    pub max_outstanding_requests: Option<i64>,
    /// auto or none (used when --dataset registers the dataset).
    #[arg(long, default_value = "auto")]
    pub compression: String,
    /// auto (all but other hosts' workers tagged COLOCATED), any, or local (workers in this
    /// process only).
    #[arg(long, default_value = "auto")]
    pub target_workers: String,
    /// exactly-once (every element of a finite epoch reaches the job's readers once, also when
    /// workers fail; distributed_epoch and the static sharding modes) or at-most-once
    /// (tf.data's: what a failed worker held is lost).
    #[arg(long, default_value = "exactly-once")]
    pub delivery: String,
    /// Cross-trainer cache: read the named job's shared elements as this trainer (needs
    /// --job-name and an infinite dataset).
    #[arg(long)]
    pub trainer_id: Option<String>,
    /// Use the cross-trainer cache (implied by --trainer-id, which it requires).
    #[arg(long)]
    pub cross_trainer_cache: bool,
    /// Ops applied locally after the service, e.g. `map(square).batch(2)`.
    #[arg(long)]
    pub local: Option<String>,
    /// Stop after N elements.
    #[arg(long)]
    pub take: Option<u64>,
    /// Read at most this many elements per second.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Epochs to read (each a new iteration of the job).
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Print only the number of elements read, as `{"elements": N}`, instead of the elements.
    #[arg(long)]
    pub count: bool,
    /// Coordinated reads: this consumer's index (with --num-consumers and --job-name).
    #[arg(long)]
    pub consumer_index: Option<u32>,
    /// Coordinated reads: consumers reading the job in lockstep rounds.
    #[arg(long)]
    pub num_consumers: Option<u32>,
    /// Take the reader's state every N elements (after the elements before it are written out)
    /// and write it to --state-file as JSON (needs a named, exactly-once job).
    #[arg(long, requires = "state_file")]
    pub state_every: Option<u64>,
    /// Where --state-every writes the state (replaced atomically each time).
    #[arg(long)]
    pub state_file: Option<std::path::PathBuf>,
    /// Resume the epoch from a state written by --state-file: the elements read before it was
    /// taken are not delivered again, everything else is, once.
    #[arg(long)]
    pub resume: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub security: ClientSecurityArgs,
}

#[derive(Args, Debug)]
pub struct RegisterArgs {
    #[arg(long)]
    pub dispatcher: String,
    #[arg(long)]
    pub dataset: String,
    #[arg(long)]
    pub dataset_id: Option<String>,
    #[arg(long, default_value = "auto")]
    pub compression: String,
    #[command(flatten)]
    pub security: ClientSecurityArgs,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[arg(long)]
    pub dispatcher: String,
    #[command(flatten)]
    pub security: ClientSecurityArgs,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Number of generated TFRecord files.
    #[arg(long, default_value_t = 512)]
    pub files: u64,
    /// Records per file.
    #[arg(long, default_value_t = 250)]
    pub records: u64,
    /// Elements per second the demo client reads at most (0: unlimited).
    #[arg(long, default_value_t = 40000.0)]
    pub rate: f64,
}

pub fn init_tracing(cli: &Cli) {
    // The demo prints a report; replicas it kills on purpose would fill it with Raft warnings.
    let spec = match cli.command {
        Command::Demo(_) | Command::Bench(_) if cli.log == DEFAULT_LOG => "error,openraft=off",
        _ => cli.log.as_str(),
    };
    let filter = tracing_subscriber::EnvFilter::try_new(spec)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    use crate::commands;
    match cli.command {
        Command::Dispatcher(args) => commands::dispatcher(args).await,
        Command::Worker(args) => commands::worker(args).await,
        Command::Read(args) => commands::read(args).await,
        Command::Register(args) => commands::register(args).await,
        Command::Status(args) => commands::status(args).await,
        Command::Admin(command) => commands::admin(command).await,
        Command::Demo(args) => crate::demo::run(args).await,
        Command::Bench(args) => {
            let sluice = std::env::current_exe().context("locate the sluice binary")?;
            sluice_bench::run(args, &sluice).await
        }
        Command::Certs(args) => commands::certs(args),
    }
}

/// An error chain on one line: `context: cause: cause`.
pub fn one_line(e: &anyhow::Error) -> String {
    e.chain()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(": ")
        .replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_lease_sizes_are_two_increasing_positive_counts() {
        let cases = [
            ("16,64", Ok((16, 64))),
            (" 8 , 8 ", Ok((8, 8))),
            ("16", Err("16: expected FIRST,MAX")),
            ("0,4", Err("0,4: FIRST must be positive and at most MAX")),
            (
                "64,16",
                Err("64,16: FIRST must be positive and at most MAX"),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(
                parse_split_lease(text),
                want.map_err(String::from),
                "{text}"
            );
        }
        assert!(parse_split_lease("a,4").unwrap_err().starts_with("a,4: "));
    }
}

//! The Sluice dispatcher: a replicated state machine that decides who processes what.
//!
//! Requests reach the `DispatcherService` (`service`) on any replica; writes go through the
//! `proposer` into the Raft log (openraft, journaled by `sluice-journal`), and every replica
//! applies committed entries to its [`state::DispatcherState`]. Reads that must be current are
//! served by the leader after a linearizable check. A replica that is not the leader answers
//! `Unavailable` with the leader's client address in the `x-sluice-leader` metadata entry.
//! Raft traffic between replicas has a listener of its own, never the client API's.
//!
//! The ids, enums and lease types the state persists are `sluice_types`'. Only `state` is a
//! public module (tests and tools inspect a replica's state); everything else used outside is
//! re-exported here.
//!
//! Layout:
//! - `state`: `DispatcherState` and its pure `apply` (the replicated data).
//! - `raft_types`: the openraft type configuration.
//! - `config`: `DispatcherConfig`.
//! - `dispatcher_handle`: starting and stopping a replica.
//! - `grpc_servers`: the two listeners, the client API and the Raft peer listener.
//! - `client_addr_announcer`: puts each replica's client address in the membership.
//! - `proposer`: group commit of concurrent requests into one log entry.
//! - `liveness`, `timers`: leader-local heartbeat times, and the timers' pure `decide` (worker
//!   expiry, client timeouts, iteration garbage collection) with the thin loop that proposes
//!   what it decides.
//! - `service`: the gRPC dispatcher service (thin handlers: decode, delegate, map).
//! - `registration`: the leader's preparation of a dataset registration (file expansion, split
//!   counts, element spec).
//! - `state_reader`: linearizable reads of the applied state and long polls on it.
//! - `watchers`: the long polls waiting on each worker and iteration, woken by what entries touch.
//! - `read_batch`: one quorum confirmation shared by concurrent linearizable reads.
//! - `admissions`: the cluster's fetch key and the admissions readers present to workers.
//! - `heartbeats`: worker and client heartbeats (liveness, registration, long polls).
//! - `leader_watch`: who this replica believes leads, changing only with the leader or term
//!   (the `WatchLeader` streams).
//! - `membership`: adding and removing replicas without losing the quorum.
//! - `init_check`: a replica started with `--init` asks its peers before it takes part in Raft.
//! - `raft_error`: the one map from openraft's errors to `DispatcherError`.
//! - `convert`: protobuf ↔ domain conversions.
//! - `raft_network`, `raft_service`: Raft traffic between replicas over tonic.
//! - `raft_runtime`: the thread Raft runs on, apart from the client API.
//! - `network_faults`: cut Raft links, for partition tests.
//! - `cluster_status`: the JSON of `sluice status`.
//! - `dispatcher_ops`: the metrics listener's side of a replica: readiness, the status page.
//! - `dispatcher_metrics`: the replica's metrics (Raft, group commit, leases, state sizes).
//! - `metered_log`: the proposer's log, measured.
//! - `task_remover`: the leader's barrier for removing a task from coordinated reads.
//! - `error`: `DispatcherError` and its mapping to gRPC status codes.
//! - `access`: which role may make each call, and the ownership rule for workers' tasks.

mod access;
mod admissions;
mod blobs;
mod client_addr_announcer;
mod cluster_status;
mod config;
mod convert;
mod dispatcher_handle;
mod dispatcher_metrics;
mod dispatcher_ops;
mod error;
mod grpc_servers;
mod heartbeats;
mod init_check;
mod leader_watch;
mod liveness;
mod membership;
mod metered_log;
mod network_faults;
mod proposer;
mod raft_error;
mod raft_network;
mod raft_runtime;
mod raft_service;
mod raft_types;
mod read_batch;
mod registration;
mod service;
pub mod state;
mod state_reader;
mod task_remover;
mod timers;
mod watchers;

pub use blobs::MAX_BLOB_BYTES;
pub use config::{DispatcherConfig, DEFAULT_CLUSTER_ID};
pub use dispatcher_handle::DispatcherHandle;
pub use error::DispatcherError;
pub use network_faults::NetworkFaults;
pub use raft_types::{Raft, TypeConfig};

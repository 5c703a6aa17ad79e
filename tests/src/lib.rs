//! Test support for Sluice's cross-crate tests.
//!
//! Layout:
//! - `TestCluster`: the test kit's `LocalCluster` (replicas and workers in this process, real
//!   gRPC on 127.0.0.1 port 0, a temp dir per replica, kill and restart), with tracing set up.
//! - `process`: the test kit's helpers to run the real `sluice` binary as child processes.
//! - `wait`: waiting on conditions with deadlines (never on sleeps).
//! - `cut_proxy`: a TCP proxy whose live connections a test can cut.
//! - `fault_proxy`: an HTTP proxy that answers some requests 503 and cuts some responses.
//! - `http`: a minimal HTTP GET, for the metrics listener.

pub use sluice_testkit::process;
pub mod cut_proxy;
pub mod fault_proxy;
pub mod http;
pub mod wait;

pub use sluice_testkit::{
    local_dispatcher_config, Azurite, FakeGcs, LocalCluster, MotoServer, S3sFs,
};

/// The bytes of a TFRecord file holding `records`.
pub fn tfrecord_bytes(records: &[String]) -> anyhow::Result<Vec<u8>> {
    let mut writer = sluice_formats::tfrecord::TfRecordWriter::new(Vec::new());
    for r in records {
        writer.write_record(r.as_bytes())?;
    }
    Ok(writer.into_inner()?)
}

/// The values of string elements (records read as they are), sorted: what a read gave, to
/// compare with what was written whatever order the workers delivered it in.
pub fn sorted_strings(elements: &[sluice_element::Element]) -> Vec<String> {
    let mut out: Vec<String> = elements
        .iter()
        .map(|e| e.to_json().as_str().expect("a string element").to_string())
        .collect();
    out.sort();
    out
}

/// The local cluster, as the tests call it.
pub type TestCluster = LocalCluster;

/// Starts a cluster with tracing set up for tests.
pub async fn start_cluster(replicas: usize, workers: usize) -> anyhow::Result<TestCluster> {
    init_tracing();
    LocalCluster::start(replicas, workers).await
}
pub use wait::{wait_until, wait_until_blocking, HANG};

/// Installs a tracing subscriber once (filter from `SLUICE_TEST_LOG`, default `warn`).
pub fn init_tracing() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = std::env::var("SLUICE_TEST_LOG").unwrap_or_else(|_| "warn".into());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    });
}

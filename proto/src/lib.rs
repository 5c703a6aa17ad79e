//! Protobuf messages and tonic services of Sluice, generated at build time (see `build.rs`).
//!
//! Layout:
//! - `dataset`: tensors, element specs and the pipeline definition (`DatasetDef`).
//! - `dispatcher`: the dispatcher's client- and worker-facing service.
//! - `worker`: the worker's element-streaming service.
//! - `raft`: the Raft peer service between dispatcher replicas (openraft messages as bytes).
//! - `example`: TensorFlow's `tf.train.Example` record format, wire-compatible.
//!
//! Nothing but generated code lives here; conversions to domain types belong to the crates that
//! own those types.

#![allow(clippy::all, missing_docs)]

/// Modules nested as the protobuf packages are, so generated cross-package paths resolve.
mod generated {
    pub mod sluice {
        pub mod dataset {
            pub mod v1 {
                tonic::include_proto!("sluice.dataset.v1");
            }
        }
        pub mod dispatcher {
            pub mod v1 {
                tonic::include_proto!("sluice.dispatcher.v1");
            }
        }
        pub mod worker {
            pub mod v1 {
                tonic::include_proto!("sluice.worker.v1");
            }
        }
        pub mod raft {
            pub mod v1 {
                tonic::include_proto!("sluice.raft.v1");
            }
        }
        pub mod example {
            pub mod v1 {
                tonic::include_proto!("sluice.example.v1");
            }
        }
    }
}

pub use generated::sluice::dataset::v1 as dataset;
pub use generated::sluice::dispatcher::v1 as dispatcher;
pub use generated::sluice::example::v1 as example;
pub use generated::sluice::raft::v1 as raft;
pub use generated::sluice::worker::v1 as worker;

/// gRPC metadata key carrying the current leader's client address on an `Unavailable` reply from a
/// dispatcher that is not the leader.
pub const LEADER_METADATA_KEY: &str = "x-sluice-leader";

/// The most leases one `LeaseSplitsBatch` call may carry; a replica refuses a larger batch as
/// `InvalidArgument`, and a client sends the rest in its next call.
pub const MAX_LEASES_PER_CALL: usize = 256;

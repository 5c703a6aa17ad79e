//! Generates the prost/tonic code for every `.proto` file under `proto/` with `protox`, a pure-Rust
//! protobuf compiler, so a fresh machine needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/dataset.proto",
        "proto/dispatcher.proto",
        "proto/worker.proto",
        "proto/raft.proto",
        "proto/example.proto",
    ];
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .bytes(".sluice.worker.v1.ElementBatch.packed")
        .bytes(".sluice.worker.v1.ElementBatch.payloads")
        .bytes(".sluice.worker.v1.GetElementResponse.element")
        .bytes(".sluice.example.v1.BytesList.value")
        .bytes(".sluice.dispatcher.v1.PutBlobChunk.data")
        .bytes(".sluice.dispatcher.v1.BlobChunk.data")
        .bytes(".sluice.raft.v1.BlobPart.data")
        .bytes(".sluice.dataset.v1.TensorProto.data")
        .compile_fds(fds)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}

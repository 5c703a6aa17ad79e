//! The client's side of a raw fetch stream (the protocol is in `raw_frame`): a TCP connection to
//! the worker's port that carries one task's `Fetch` stream, opened as a gRPC `Fetch` is: send
//! the first request, then read batches and send more requests (credits) as they are granted.
//!
//! Requests go through a channel to a small task that writes them, as the gRPC client's request
//! stream does, so the reader never waits on a write. The connection closes when both the batch
//! stream and the request sender are dropped.

use crate::raw_frame::{request_bytes, Batches, FrameReader, MAGIC};
use sluice_proto::worker::FetchRequest;
use std::io;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// As the gRPC channels to workers and dispatchers.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Requests queued for the writer at most (a stream sends one each time half its credits came
/// back, so a few at most are ever in flight).
const QUEUED_REQUESTS: usize = 16;

/// Connects to a worker's port (`host:port`), with `TCP_NODELAY`: a request or the tail of a
/// frame must not wait for the peer's delayed ACK.
pub async fn connect(address: &str) -> io::Result<TcpStream> {
    let socket = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address))
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connect to {address}: timed out after {CONNECT_TIMEOUT:?}"),
            )
        })??;
    socket.set_nodelay(true)?;
    Ok(socket)
}

/// Opens the fetch stream `first` names on a connected socket. Whether the worker serves the task
/// is the first message's answer (a status, as a gRPC `Fetch` would fail). `max_credits` bounds
/// the elements of one batch (see `raw_frame` limits).
pub async fn open(
    socket: TcpStream,
    first: FetchRequest,
    max_credits: u32,
) -> io::Result<(mpsc::Sender<FetchRequest>, Batches)> {
    let (read, mut write) = socket.into_split();
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&request_bytes(&first));
    write.write_all(&hello).await?;
    let (requests_tx, mut requests) = mpsc::channel::<FetchRequest>(QUEUED_REQUESTS);
    tokio::spawn(async move {
        while let Some(request) = requests.recv().await {
            if write.write_all(&request_bytes(&request)).await.is_err() {
                // The worker went away; the reader learns it from the batch stream.
                return;
            }
        }
    });
    let batches = FrameReader::new(read, max_credits as usize).into_batches();
    Ok((requests_tx, batches))
}

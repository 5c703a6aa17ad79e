//! The fuzz target of a worker's raw fetch port (`fuzz_raw_fetch_port`; see `sluice-fuzz`):
//! a client sends the magic and then fuzzed bytes (the `raw_requests` corpus: a token and
//! requests, mutated) and closes its side. Whatever it sent, the worker must close the
//! connection in time, and keep serving: a well-behaved reader still reads its task whole.

use super::tests::{read_raw_as, start_with, task, DEADLINE};
use sluice_element::{Element, Tensor};
use sluice_fuzz::FuzzTarget;
use sluice_pipeline::Dataset;
use sluice_rpc::raw_frame::MAGIC;
use sluice_security::{ClientSecurity, ServerSecurity};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a worker may keep a connection whose client closed its side: its handshake and
/// first-request deadlines, and its linger, are 5 s each.
const CLOSE_WITHIN: Duration = Duration::from_secs(12);
/// Bytes of frames read from one connection at most (the tasks are small).
const READ_AT_MOST: u64 = 16 << 20;

#[test]
fn fuzz_raw_fetch_port() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    // Task 7 is the one the seed requests name; task 8 is read after the run.
    let worker = rt.block_on(start_with(
        vec![task(7, Dataset::range(50)), task(8, Dataset::range(20))],
        &ServerSecurity::default(),
    ));
    let addr = worker.addr;
    FuzzTarget::new("raw_requests").run(|input| {
        rt.block_on(async {
            let mut socket = TcpStream::connect(addr)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            // The worker may close before it read everything: a failed write is its answer.
            let _ = socket.write_all(&MAGIC).await;
            let _ = socket.write_all(input).await;
            let _ = socket.shutdown().await;
            let mut answer = Vec::new();
            let mut limited = (&mut socket).take(READ_AT_MOST);
            match tokio::time::timeout(CLOSE_WITHIN, limited.read_to_end(&mut answer)).await {
                Ok(_) => Ok(()),
                Err(_) => Err(format!(
                    "the worker kept the connection open {CLOSE_WITHIN:?} after the client \
                     closed its side ({} bytes of answer)",
                    answer.len()
                )),
            }
        })
    });
    let elements = rt
        .block_on(async {
            tokio::time::timeout(
                DEADLINE,
                read_raw_as(&ClientSecurity::default(), addr, 8, 4),
            )
            .await
        })
        .expect("read in time")
        .expect("the worker still serves");
    let expected: Vec<Element> = (0..20).map(|i| Tensor::scalar_i64(i).into()).collect();
    assert_eq!(elements, expected);
    drop(worker);
}

/// `fuzz/corpus/raw_requests/crash-closed-before-first-request`: the handshake (a token), then
/// the client closes its side. The stream waited for its first request on a channel the
/// connection's own task held open, so the connection and its task stayed forever.
#[tokio::test]
async fn a_client_that_closes_before_its_first_request_is_answered_at_once() {
    let input = std::fs::read(
        sluice_fuzz::Corpus::dir("raw_requests").join("crash-closed-before-first-request"),
    )
    .expect("the input is in the corpus");
    let worker = start_with(vec![task(7, Dataset::range(5))], &ServerSecurity::default()).await;
    let mut socket = TcpStream::connect(worker.addr).await.expect("connect");
    socket.write_all(&MAGIC).await.expect("write");
    socket.write_all(&input).await.expect("write");
    socket.shutdown().await.expect("close the sending side");
    // Well within the worker's 5 s deadlines: the answer does not wait for one.
    let mut frames = sluice_rpc::raw_frame::FrameReader::new(socket, 1);
    let answer = tokio::time::timeout(Duration::from_secs(3), frames.next())
        .await
        .expect("an answer at once");
    let status = answer.expect_err("a status frame");
    assert!(status.message().contains("request"), "{status:?}");
}

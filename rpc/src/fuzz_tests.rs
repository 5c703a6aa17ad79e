//! The fuzz targets of the raw fetch protocol's decoders (see `sluice-fuzz`): the frames a
//! reader takes off a worker's connection (`raw_frames`), and the handshake token and requests
//! a worker takes off a client's (`raw_requests`). Each must end in batches or a status, never
//! a panic, and never hold memory out of proportion to the bytes received (beyond the
//! protocol's documented `PREALLOC_BYTES` ahead of them).
//!
//! A long session: `SLUICE_FUZZ_CASES=100000 cargo nextest run -p sluice-rpc --profile fuzz
//! -E 'test(fuzz_)'`.

use bytes::Bytes;
use futures::StreamExt;
use sluice_element::{Compression, Element, Packed, PackedBuilder, Tensor};
use sluice_fuzz::proptest::prelude::*;
use sluice_fuzz::proptest::test_runner::TestRunner;
use sluice_fuzz::{AllocMeter, FuzzTarget};
use sluice_proto::worker::{ElementBatch, FetchRequest};
use tonic::Status;

use crate::raw_frame::{
    hello_bytes, read_token, request_bytes, requests, Frame, FrameReader, MAGIC, PREALLOC_BYTES,
};

#[global_allocator]
static METER: AllocMeter = AllocMeter;

/// The credits a fuzzed reader grants: a frame has at most this many payloads.
const MAX_PARTS: usize = 64;
/// Frames or requests read from one input at most (each takes at least a byte).
const MAX_MESSAGES: usize = 4096;
const PER_BYTE: usize = 256;
const SLACK: usize = 256 << 10;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime")
}

fn within(what: &str, peak: usize, input: usize, ahead: usize) -> Result<(), String> {
    let bound = input * PER_BYTE + ahead + SLACK;
    if peak > bound {
        return Err(format!(
            "{what} held {peak} bytes at once for {input} bytes of input (bound {bound})"
        ));
    }
    Ok(())
}

async fn frames_of(batches: &[ElementBatch]) -> Vec<u8> {
    let mut out = Vec::new();
    for batch in batches {
        let frame = match batch.status_code {
            0 => Frame::batch(batch.clone(), None).expect("a frame"),
            code => Frame::status(&Status::new(code.into(), batch.status_message.clone())),
        };
        frame.write_to(&mut out).await.expect("writes to a Vec");
    }
    out
}

fn packed_batch(elements: &[Element], compression: Compression) -> ElementBatch {
    let mut b = PackedBuilder::default();
    for el in elements {
        b.push(el, compression);
    }
    let (packed, lengths, each_length, payloads) = b.finish().into_wire();
    ElementBatch {
        packed,
        lengths,
        each_length,
        payloads,
        ..Default::default()
    }
}

fn frame_seeds(rt: &tokio::runtime::Runtime) -> Vec<Vec<u8>> {
    let small: Vec<Element> = (0..8).map(|i| Tensor::scalar_i64(i).into()).collect();
    let large = Tensor::from_f32s(vec![20_000], &vec![1.5; 20_000]).expect("a tensor");
    let strings = Tensor::scalar_string("a string element").into();
    let streams = [
        vec![packed_batch(&small, Compression::Auto)],
        vec![
            packed_batch(&[large.into(), strings], Compression::None),
            ElementBatch {
                end_of_sequence: true,
                ..Default::default()
            },
        ],
        vec![ElementBatch {
            status_code: tonic::Code::NotFound as i32,
            status_message: "task 7 not found".into(),
            ..Default::default()
        }],
        vec![ElementBatch {
            error: "a pipeline error".into(),
            ..Default::default()
        }],
    ];
    streams.iter().map(|s| rt.block_on(frames_of(s))).collect()
}

/// Reads every frame of `input` as a client would, and decodes its elements.
async fn read_frames(input: &[u8]) -> Vec<Result<ElementBatch, Status>> {
    let mut reader = FrameReader::new(input, MAX_PARTS);
    let mut out = Vec::new();
    while out.len() < MAX_MESSAGES {
        match reader.next().await {
            Ok(Some(batch)) => {
                if let Ok(packed) = Packed::from_wire(
                    batch.packed.clone(),
                    batch.lengths.clone(),
                    batch.each_length,
                    batch.payloads.clone(),
                ) {
                    packed.into_decoder().for_each(drop);
                }
                out.push(Ok(batch));
            }
            Ok(None) => break,
            Err(status) => {
                out.push(Err(status));
                break;
            }
        }
    }
    out
}

fn arb_batch() -> impl Strategy<Value = ElementBatch> {
    let bytes = || prop::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from);
    (
        prop::collection::vec(bytes(), 0..6),
        prop::collection::vec(bytes(), 0..6),
        any::<bool>(),
        "[a-z ]{0,12}",
    )
        .prop_map(|(heads, payloads, end_of_sequence, error)| {
            let payloads = if payloads.len() == heads.len() {
                payloads
            } else {
                Vec::new()
            };
            ElementBatch {
                lengths: heads.iter().map(|h| h.len() as u64).collect(),
                packed: heads.concat().into(),
                payloads,
                end_of_sequence,
                error,
                ..Default::default()
            }
        })
}

#[test]
fn fuzz_raw_frames() {
    let rt = runtime();
    let target = FuzzTarget::new("raw_frames")
        .seeds(frame_seeds(&rt))
        .dictionary(&[
            &[0u8, 0, 0, 0][..],
            &[0x22],
            &[0x2a],
            &[0x3a],
            &[0x40],
            &[0x18, 1],
        ]);
    // What a worker writes, a reader reads back as it was.
    TestRunner::new(target.config())
        .run(&prop::collection::vec(arb_batch(), 1..4), |batches| {
            let back = rt.block_on(async {
                let bytes = frames_of(&batches).await;
                read_frames(&bytes).await
            });
            let back: Vec<ElementBatch> =
                back.into_iter().collect::<Result<_, _>>().expect("reads");
            prop_assert_eq!(back, batches);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("raw frame round trip: {e}"));
    target.run(|input| {
        let (read, peak) = AllocMeter::peak_during(|| rt.block_on(read_frames(input)));
        within("the frame reader", peak, input.len(), PREALLOC_BYTES)?;
        if read.len() > input.len() + 1 {
            return Err(format!("{} frames from {} bytes", read.len(), input.len()));
        }
        Ok(())
    });
}

fn request(task_id: u64, credits: u32, trainer_id: &str) -> FetchRequest {
    FetchRequest {
        task_id,
        credits,
        client_id: 3,
        trainer_id: trainer_id.into(),
        acknowledges: true,
        received: 12,
        incarnation: 99,
        window: credits,
        admission: Vec::new(),
        shared_memory: true,
        region_mapped: false,
    }
}

/// A client's bytes after the magic: the token's length and bytes, then requests.
fn request_seeds() -> Vec<Vec<u8>> {
    let first = request(7, 16, "");
    let more = [
        request(7, 8, ""),
        request(7, 0, ""),
        request(9, 1, "trainer-a"),
    ];
    let mut with_token = hello_bytes(Some(b"a secret token"), &first);
    for r in &more {
        with_token.extend(request_bytes(r));
    }
    let anonymous = hello_bytes(None, &request(1, u32::MAX, "t"));
    [with_token, anonymous]
        .into_iter()
        .map(|hello| hello[MAGIC.len()..].to_vec())
        .collect()
}

/// Reads the token and every request of `input` as a worker would.
async fn read_requests(
    input: &[u8],
) -> (
    Result<Option<Vec<u8>>, Status>,
    Vec<Result<FetchRequest, Status>>,
) {
    let mut reader = std::io::Cursor::new(input.to_vec());
    let token = read_token(&mut reader).await;
    if token.is_err() {
        return (token, Vec::new());
    }
    let read = requests(reader).take(MAX_MESSAGES).collect().await;
    (token, read)
}

#[test]
fn fuzz_raw_requests() {
    let rt = runtime();
    let target = FuzzTarget::new("raw_requests")
        .seeds(request_seeds())
        .dictionary(&[
            &[0u8, 0, 0, 0][..],
            &[0x08],
            &[0x10],
            &[0x22],
            &[0xff, 0xff, 0xff, 0xff],
        ]);
    // What a client writes, a worker reads back as it was.
    TestRunner::new(target.config())
        .run(
            &prop::collection::vec((any::<u64>(), any::<u32>(), "[a-z]{0,8}"), 1..6),
            |sent| {
                let sent: Vec<FetchRequest> =
                    sent.iter().map(|(t, c, id)| request(*t, *c, id)).collect();
                let mut bytes = hello_bytes(Some(b"token"), &sent[0]);
                for r in &sent[1..] {
                    bytes.extend(request_bytes(r));
                }
                let (token, back) = rt.block_on(read_requests(&bytes[MAGIC.len()..]));
                prop_assert_eq!(token.expect("a token"), Some(b"token".to_vec()));
                let back: Vec<FetchRequest> =
                    back.into_iter().collect::<Result<_, _>>().expect("reads");
                prop_assert_eq!(back, sent);
                Ok(())
            },
        )
        .unwrap_or_else(|e| panic!("raw request round trip: {e}"));
    target.run(|input| {
        let ((_, read), peak) = AllocMeter::peak_during(|| rt.block_on(read_requests(input)));
        within("the request reader", peak, input.len(), 0)?;
        if read.len() > input.len() / 4 + 1 {
            return Err(format!(
                "{} requests from {} bytes",
                read.len(),
                input.len()
            ));
        }
        Ok(())
    });
}

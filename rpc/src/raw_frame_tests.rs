use super::*;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use std::io::Cursor;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::ReadBuf;

/// A reader that hands out its bytes a few at a time, now and then after a `Pending`.
struct Trickle {
    data: Vec<u8>,
    pos: usize,
    max: usize,
    rng: StdRng,
}

impl AsyncRead for Trickle {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.rng.random_bool(0.2) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let n = this
            .rng
            .random_range(1..=this.max)
            .min(buf.remaining())
            .min(this.data.len() - this.pos);
        buf.put_slice(&this.data[this.pos..this.pos + n]);
        this.pos += n;
        Poll::Ready(Ok(()))
    }
}

/// A writer that takes at most `max` bytes a call, across however many slices it is given.
struct Stingy {
    out: Vec<u8>,
    max: usize,
    rng: StdRng,
}

impl AsyncWrite for Stingy {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let mut budget = this.rng.random_range(1..=this.max);
        let mut written = 0;
        for buf in bufs {
            let n = buf.len().min(budget);
            this.out.extend_from_slice(&buf[..n]);
            written += n;
            budget -= n;
            if budget == 0 {
                break;
            }
        }
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn bytes_of(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// A message whose elements (back to back in `packed`) are `heads`.
fn heads(heads: Vec<Bytes>) -> ElementBatch {
    ElementBatch {
        lengths: heads.iter().map(|h| h.len() as u64).collect(),
        packed: heads.concat().into(),
        ..Default::default()
    }
}

/// A batch of large elements (a head each, then its data) and one whole element.
fn large_batch() -> ElementBatch {
    ElementBatch {
        payloads: vec![bytes_of(300_000, 4), Bytes::new(), bytes_of(70_000, 5)],
        ..heads(vec![bytes_of(40, 1), bytes_of(7, 2), bytes_of(40, 3)])
    }
}

fn tiny_batch() -> ElementBatch {
    ElementBatch {
        end_of_sequence: true,
        ..heads((0..1000).map(|i| bytes_of(i % 13 + 1, i as u8)).collect())
    }
}

async fn encode(batches: &[ElementBatch]) -> Vec<u8> {
    let mut out = Vec::new();
    for batch in batches {
        Frame::batch(batch.clone(), None)
            .expect("a frame")
            .write_to(&mut out)
            .await
            .expect("writes to a Vec");
    }
    out
}

async fn read_all<R: AsyncRead + Unpin>(
    reader: R,
    max_parts: usize,
) -> Result<Vec<ElementBatch>, Status> {
    let mut reader = FrameReader::new(reader, max_parts);
    let mut out = Vec::new();
    while let Some(batch) = reader.next().await? {
        out.push(batch);
    }
    Ok(out)
}

#[tokio::test]
async fn payloads_travel_outside_the_header_and_come_back_in_place() {
    let batches = vec![large_batch(), ElementBatch::default(), tiny_batch()];
    let wire = encode(&batches).await;
    let header_len = u32::from_le_bytes(wire[..4].try_into().unwrap()) as usize;
    assert!(
        header_len < 200,
        "the first header holds heads and lengths only ({header_len} bytes)"
    );
    assert_eq!(
        &wire[4 + header_len..4 + header_len + 300_000],
        &bytes_of(300_000, 4)[..],
        "the first payload follows the header as is"
    );
    assert_eq!(read_all(&wire[..], 16).await.unwrap(), batches);
}

#[tokio::test]
async fn frames_survive_reads_and_writes_of_any_size() {
    let batches = vec![large_batch(), tiny_batch(), large_batch()];
    let whole = encode(&batches).await;
    for seed in 0..40u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut writer = Stingy {
            out: Vec::new(),
            max: rng.random_range(1..=70_000),
            rng: StdRng::seed_from_u64(seed),
        };
        for batch in &batches {
            let frame = Frame::batch(batch.clone(), None).unwrap();
            frame.write_to(&mut writer).await.unwrap();
        }
        assert_eq!(
            writer.out, whole,
            "seed {seed}: partial writes lose no byte"
        );
        let reader = Trickle {
            data: writer.out,
            pos: 0,
            max: rng.random_range(1..=9_000),
            rng: StdRng::seed_from_u64(seed),
        };
        let got = FrameReader::new(reader, 16).into_batches();
        let got: Vec<ElementBatch> = stream::unfold(got, |mut b| async move {
            b.message().await.unwrap().map(|batch| (batch, b))
        })
        .collect()
        .await;
        assert_eq!(got, batches, "seed {seed}: partial reads");
    }
}

#[tokio::test]
async fn a_status_frame_reads_as_the_same_status_and_ends_the_stream() {
    let statuses = [
        Status::unavailable("Task 7 not found"),
        Status::failed_precondition("Got request for local task 7, which has been deleted."),
        Status::invalid_argument("a fetch stream must start with a request naming the task"),
        Status::new(Code::Ok, "not an error"),
    ];
    for status in statuses {
        let mut wire = Vec::new();
        Frame::status(&status).write_to(&mut wire).await.unwrap();
        let mut batches = FrameReader::new(Cursor::new(wire), 16).into_batches();
        let got = batches.message().await.unwrap_err();
        let want = if status.code() == Code::Ok {
            Code::Unknown
        } else {
            status.code()
        };
        assert_eq!((got.code(), got.message()), (want, status.message()));
        assert!(batches.message().await.unwrap().is_none(), "then the end");
    }
}

#[tokio::test]
async fn a_connection_closed_mid_frame_is_a_broken_stream() {
    let wire = encode(&[large_batch()]).await;
    for cut in [2, 10, 4 + 60, wire.len() - 1] {
        let error = read_all(&wire[..cut], 16).await.unwrap_err();
        assert_eq!(error.code(), Code::Unavailable, "cut at {cut}: {error}");
    }
    assert_eq!(read_all(&wire[..0], 16).await.unwrap(), vec![]);
}

#[tokio::test]
async fn lengths_beyond_the_bounds_are_errors() {
    // More payloads than credits.
    let wire = encode(&[large_batch()]).await;
    let error = read_all(&wire[..], 2).await.unwrap_err();
    assert_eq!(error.code(), Code::Internal);
    assert!(error.message().contains("3 payloads"), "{error}");

    // A payload larger than any part, and payloads inside the header.
    for header in [
        ElementBatch {
            payload_lengths: vec![MAX_PART_BYTES + 1],
            ..heads(vec![bytes_of(3, 0)])
        },
        ElementBatch {
            payloads: vec![bytes_of(3, 1)],
            ..heads(vec![bytes_of(3, 0)])
        },
    ] {
        let mut wire = length_prefixed(&header).unwrap();
        wire.extend_from_slice(&[0; 64]);
        let error = read_all(&wire[..], 16).await.unwrap_err();
        assert_eq!(error.code(), Code::Internal, "{error}");
    }

    // A header or payload claiming gigabytes: an error once the bytes run out, and never a
    // buffer sized by the claim.
    let mut wire = (3u32 << 30).to_le_bytes().to_vec();
    wire.extend_from_slice(&[0; 100]);
    let mut reader = FrameReader::new(&wire[..], 16);
    assert_eq!(reader.next().await.unwrap_err().code(), Code::Unavailable);
    assert!(reader.staging.capacity() <= 2 * PREALLOC_BYTES);
    let header = ElementBatch {
        payload_lengths: vec![MAX_PART_BYTES],
        ..heads(vec![bytes_of(3, 0)])
    };
    let mut wire = length_prefixed(&header).unwrap();
    wire.extend_from_slice(&[0; 100]);
    let error = read_all(&wire[..], 16).await.unwrap_err();
    assert_eq!(error.code(), Code::Unavailable);
}

#[tokio::test]
async fn garbage_is_an_error_never_a_panic() {
    let valid = encode(&[large_batch(), tiny_batch()]).await;
    for seed in 0..300u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let wire = match seed % 3 {
            // Random bytes.
            0 => {
                let mut wire = vec![0u8; rng.random_range(0..3000)];
                rng.fill_bytes(&mut wire);
                wire
            }
            // A valid stream with bytes flipped.
            1 => {
                let mut wire = valid.clone();
                for _ in 0..rng.random_range(1..8) {
                    let at = rng.random_range(0..wire.len().min(2000));
                    wire[at] = rng.random();
                }
                wire
            }
            // A small header length, then random bytes.
            _ => {
                let len = rng.random_range(0..200u32);
                let mut wire = len.to_le_bytes().to_vec();
                let mut body = vec![0u8; rng.random_range(0..400)];
                rng.fill_bytes(&mut body);
                wire.extend_from_slice(&body);
                wire
            }
        };
        // Any outcome but a panic or a hang; garbage that happens to parse is fine.
        let _ = read_all(&wire[..], 64).await;
        let _: Vec<_> = requests(Cursor::new(wire)).collect().await;
    }
}

#[tokio::test]
async fn requests_round_trip_and_oversized_ones_are_refused() {
    let sent: Vec<FetchRequest> = (0..5)
        .map(|i| FetchRequest {
            task_id: 7,
            credits: i,
            client_id: 3,
            trainer_id: if i == 0 {
                "trainer".into()
            } else {
                String::new()
            },
            // A reader that acknowledges, on odd requests.
            acknowledges: i % 2 == 1,
            received: u64::from(i) * 1000,
            incarnation: u64::from(i % 2) * u64::MAX,
            window: i * 16,
            // The reader's admission, in its first request.
            admission: if i == 0 { vec![0xa5; 32] } else { Vec::new() },
            shared_memory: i == 0,
            region_mapped: i == 4,
        })
        .collect();
    let wire: Vec<u8> = sent.iter().flat_map(request_bytes).collect();
    let reader = Trickle {
        data: wire,
        pos: 0,
        max: 3,
        rng: StdRng::seed_from_u64(1),
    };
    let got: Vec<FetchRequest> = requests(reader)
        .map(|r| r.expect("a request"))
        .collect()
        .await;
    assert_eq!(got, sent);

    let mut wire = request_bytes(&sent[1]);
    wire.extend_from_slice(&(1u32 << 20).to_le_bytes());
    wire.extend_from_slice(&[0; 100]);
    let got: Vec<_> = requests(Cursor::new(wire)).collect().await;
    assert_eq!(got.len(), 2, "a request, then the error, then the end");
    assert_eq!(got[1].as_ref().unwrap_err().code(), Code::InvalidArgument);

    let wire = request_bytes(&sent[1]);
    let got: Vec<_> = requests(Cursor::new(wire[..wire.len() - 1].to_vec()))
        .collect()
        .await;
    assert_eq!(got[0].as_ref().unwrap_err().code(), Code::Unavailable);
}

/// The handshake as the worker reads it: the magic, then the token (or none), then requests.
#[tokio::test]
async fn a_hello_carries_the_token_between_the_magic_and_the_first_request() {
    let first = FetchRequest {
        task_id: 4,
        credits: 8,
        ..Default::default()
    };
    let token = b"0123456789abcdef0123";
    /// A token sent, and the token the worker reads.
    type HelloCase<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);
    let cases: &[HelloCase] = &[(Some(token), Some(token)), (None, None), (Some(b""), None)];
    for (sent, want) in cases {
        let wire = hello_bytes(*sent, &first);
        assert_eq!(wire[..MAGIC.len()], MAGIC);
        let mut reader = Trickle {
            data: wire[MAGIC.len()..].to_vec(),
            pos: 0,
            max: 3,
            rng: StdRng::seed_from_u64(2),
        };
        let got = read_token(&mut reader).await.expect("a token field");
        assert_eq!(got.as_deref(), *want);
        let requests: Vec<FetchRequest> = requests(reader)
            .map(|r| r.expect("a request"))
            .collect()
            .await;
        assert_eq!(requests, std::slice::from_ref(&first));
    }
}

#[tokio::test]
async fn a_token_field_past_its_bound_or_cut_short_is_refused() {
    let cases: Vec<(Vec<u8>, Code)> = vec![
        (
            ((MAX_TOKEN_BYTES + 1) as u32).to_le_bytes().to_vec(),
            Code::Unauthenticated,
        ),
        (u32::MAX.to_le_bytes().to_vec(), Code::Unauthenticated),
        (
            [&20u32.to_le_bytes()[..], b"short"].concat(),
            Code::Unavailable,
        ),
        (vec![1, 0], Code::Unavailable),
    ];
    for (wire, code) in cases {
        let got = read_token(&mut Cursor::new(wire.clone())).await;
        assert_eq!(got.unwrap_err().code(), code, "{wire:?}");
    }
}

/// The wire form of a header as the worker writes it, with no payload bytes after it.
fn header_frame(batch: &ElementBatch) -> Vec<u8> {
    length_prefixed(batch).expect("a header")
}

#[tokio::test]
async fn a_mapped_region_carries_the_parts_and_packed_elements_a_frame_places_there() {
    let mut region = RegionWriter::with_size(8 << 20).unwrap();
    let mut wire = Vec::new();
    Frame::offer(&region).write_to(&mut wire).await.unwrap();
    // Placed: the 300,000- and 70,000-byte parts, and the tiny batch's 7 KiB of packed heads;
    // the empty part follows its header on the socket.
    let batches = [large_batch(), tiny_batch()];
    let mut placed = 0;
    for batch in &batches {
        let frame = Frame::batch(batch.clone(), Some(&mut region)).unwrap();
        placed += frame.placed_bytes();
        frame.write_to(&mut wire).await.unwrap();
    }
    assert_eq!(placed, 370_000 + batches[1].packed.len() as u64);

    let (requests, mut said) = mpsc::channel(4);
    let mut reader = FrameReader::new(&wire[..], 1000).mapping_regions(requests);
    for want in &batches {
        let got = reader.next().await.unwrap().expect("a batch");
        assert_eq!(got.payloads, want.payloads);
        assert_eq!(got.packed, want.packed);
        assert!(got.payload_offsets.is_empty() && got.packed_offset == 0);
    }
    assert!(reader.next().await.unwrap().is_none());
    assert!(said.recv().await.expect("a request").region_mapped);
    assert!(
        said.recv().await.is_none(),
        "one request, and the sender dropped"
    );
    assert_eq!(region.lent(), 3, "not reclaimed until the next placement");
    assert!(region.place(&[0; 4096]).is_some());
    assert_eq!(region.lent(), 1, "every part read was freed");

    // A reader that did not ask ignores an offer and reads what follows over the socket.
    let mut wire = Vec::new();
    Frame::offer(&region).write_to(&mut wire).await.unwrap();
    wire.extend(encode(&batches).await);
    let got = read_all(&wire[..], 1000).await.unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].payloads, batches[0].payloads);
}

#[tokio::test]
async fn frames_that_name_a_region_the_reader_has_not_mapped_are_refused() {
    let cases = [
        (
            "a part in a region",
            ElementBatch {
                payload_lengths: vec![5000],
                payload_offsets: vec![128],
                ..Default::default()
            },
            "places bytes in a region this stream has not mapped",
        ),
        (
            "packed elements in a region",
            ElementBatch {
                packed_offset: 128,
                packed_length: 10,
                ..Default::default()
            },
            "places bytes in a region this stream has not mapped",
        ),
        (
            "packed elements in a region and in the header",
            ElementBatch {
                packed_offset: 128,
                packed_length: 10,
                packed: bytes_of(10, 1),
                ..Default::default()
            },
            "places its elements in a region and carries them too",
        ),
        (
            "fewer places than parts",
            ElementBatch {
                payload_lengths: vec![1, 2],
                payload_offsets: vec![0],
                ..Default::default()
            },
            "places 1 of its 2 payloads",
        ),
    ];
    for (case, batch, message) in cases {
        let err = read_all(&header_frame(&batch)[..], 64).await.unwrap_err();
        assert_eq!(err.code(), Code::Internal, "{case}");
        assert!(err.message().contains(message), "{case}: {}", err.message());
    }
}

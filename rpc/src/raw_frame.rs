//! The raw fetch protocol: a worker's `Fetch` stream over a TCP connection (in TLS when the
//! worker has a certificate), without gRPC, so that large tensors go from the worker's buffers
//! to the socket and from the socket into the client's buffers without being copied into and out
//! of a protobuf encoding on the way.
//!
//! It runs on the worker's gRPC port: the worker tells the two apart by the first bytes a
//! connection carries (after the TLS handshake, if any): an HTTP/2 client starts with
//! `PRI * HTTP/2.0`, a raw client with [`MAGIC`].
//!
//! ```text
//! client -> worker:  MAGIC ("SLUICE\0\x02"), [u32 LE token length][token],
//!                    then requests: [u32 LE length][FetchRequest]...
//! worker -> client:  frames: [u32 LE header length][ElementBatch header][payload 0][payload 1]...
//! ```
//!
//! - The magic's last byte is the protocol version. A client of another version gets a status
//!   frame (`FailedPrecondition`) naming both, rather than a closed connection.
//! - The token is the caller's credential, as gRPC calls carry it in `authorization: Bearer`: the
//!   secret itself, at most [`MAX_TOKEN_BYTES`]; length 0 means none (a client certificate, or a
//!   worker without authentication). The worker authenticates it (a verified client certificate
//!   counts when there is no token) and requires the client role before it reads a request; a
//!   refusal is a status frame (`Unauthenticated`, `PermissionDenied`), and nothing is served.
//! - Requests are the gRPC `Fetch` stream's messages: the first names the task (and the trainer,
//!   for cross-trainer cache jobs) and carries the reader's client id and its admission to the
//!   task's iteration, which the worker checks before it serves anything (a refusal is a
//!   `PermissionDenied` status frame); every one may grant credits and acknowledge what arrived
//!   (see worker.proto). The client closes its side when it stops reading; after the end of
//!   sequence, it first acknowledges the end.
//! - A frame is one `ElementBatch` of the gRPC stream (see worker.proto) with its `payloads` moved
//!   out: their lengths go into `payload_lengths` and their bytes follow the header, in order.
//!   The reader puts them back, so a batch reads as the gRPC stream would deliver it.
//! - A reader on the worker's machine may ask for a shared memory region in its first request
//!   (`shared_memory`). A worker that grants one sends a frame that only offers it (`region`)
//!   before any batch; once the reader said it mapped it (`region_mapped`, a request the worker
//!   keeps to itself), a frame's `payload_offsets` name the payloads the worker placed in the
//!   region instead of writing them after the header, and `packed_offset` its packed elements
//!   (see `raw_region`).
//! - A header with a non-zero `status_code` is a status frame: the stream ends with the
//!   `tonic::Status` (code and message) that a gRPC `Fetch` would have ended with, so callers
//!   classify both transports' failures alike. The connection closes after it.
//! - The worker closes the connection after the batch that ends the stream (end of sequence, a
//!   pipeline error) or a status frame; after an end of sequence to a reader that acknowledges,
//!   once the reader acknowledged it or closed its side (or a few seconds passed). A connection
//!   closed at any other point is a broken stream (as a gRPC stream ending early), to be retried.
//!
//! Limits, so that a garbage or hostile peer gets an error and never a panic or an allocation
//! out of proportion to the bytes it actually sent: a request is at most `MAX_REQUEST_BYTES`; a
//! frame has at most as many payloads as the reader could have granted credits for; a payload is
//! at most `MAX_PART_BYTES` (a gRPC message's own bound); bytes placed in a region lie within it,
//! and a region offered is at most `raw_region::MAX_OFFERED_BYTES`; and no buffer is allocated
//! more than `PREALLOC_BYTES` ahead of the bytes received. A header has no bound of its own
//! beyond its u32 length: whole elements (tuples, compressed ones) travel inside it and may be
//! large.
//!
//! Wire parsing works on any `AsyncRead`/`AsyncWrite` (tests use byte slices); the sockets are
//! the reader's (`raw_fetch`, used by the client and by the worker's tests) and the worker's
//! (`sluice_worker::raw_fetch`).

use crate::raw_region::{RegionReader, RegionWriter};
use bytes::{Buf, Bytes, BytesMut};
use futures::stream::{self, BoxStream, StreamExt};
use prost::Message;
use sluice_proto::worker::{ElementBatch, FetchRequest, RegionOffer};
use std::io::{self, IoSlice};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tonic::{Code, Status};
use tracing::debug;

/// The first bytes a raw fetch client sends; the last byte is the protocol version.
pub const MAGIC: [u8; 8] = *b"SLUICE\x00\x02";
/// A handshake's token at most (a token file's tokens are far shorter).
pub const MAX_TOKEN_BYTES: usize = 4 << 10;
/// A request's encoding at most.
pub const MAX_REQUEST_BYTES: usize = 64 << 10;
/// One payload at most.
pub const MAX_PART_BYTES: u64 = u32::MAX as u64;
/// Bytes of a buffer allocated ahead of the bytes that fill it at most: a larger part is read
/// into a buffer that grows as its bytes arrive.
pub const PREALLOC_BYTES: usize = 64 << 20;
/// Bytes read at once while looking for the next frame's header: enough for the header of a
/// batch of large elements, small enough that copying the payload bytes read along with it out
/// of the staging buffer costs little.
const READ_AHEAD: usize = 4 << 10;
/// Slices handed to one vectored write at most (Linux takes 1024).
const MAX_SLICES: usize = 64;

/// One frame, ready to be written: the length-prefixed header, then the payloads as they are.
#[derive(Debug)]
pub struct Frame {
    header: Vec<u8>,
    payloads: Vec<Bytes>,
    /// Bytes of payload placed in the stream's region rather than written after the header.
    placed: u64,
}

impl Frame {
    /// A batch's frame: its payloads leave the header and are written from their own buffers,
    /// or, with a `region` the reader mapped, copied into it when it takes them (see
    /// `raw_region`).
    pub fn batch(
        mut batch: ElementBatch,
        region: Option<&mut RegionWriter>,
    ) -> Result<Frame, Status> {
        let payloads = std::mem::take(&mut batch.payloads);
        batch.payload_lengths = payloads.iter().map(|p| p.len() as u64).collect();
        if let Some(len) = batch
            .payload_lengths
            .iter()
            .find(|&&len| len > MAX_PART_BYTES)
        {
            return Err(Status::internal(format!(
                "an element part of {len} bytes exceeds the raw fetch stream's {MAX_PART_BYTES}"
            )));
        }
        let mut inline = Vec::with_capacity(payloads.len());
        let mut placed = 0;
        if let Some(region) = region {
            if let Some(at) = region.place(&batch.packed) {
                placed += batch.packed.len() as u64;
                batch.packed_offset = at;
                batch.packed_length = batch.packed.len() as u64;
                batch.packed = Bytes::new();
            }
            let offsets: Vec<u64> = payloads
                .into_iter()
                .map(|payload| match region.place(&payload) {
                    Some(at) => {
                        placed += payload.len() as u64;
                        at
                    }
                    None => {
                        inline.push(payload);
                        0
                    }
                })
                .collect();
            if offsets.iter().any(|&at| at != 0) {
                batch.payload_offsets = offsets;
            }
        } else {
            inline = payloads;
        }
        Ok(Frame {
            header: length_prefixed(&batch)?,
            payloads: inline,
            placed,
        })
    }

    /// Bytes of payload this frame placed in the stream's region.
    pub fn placed_bytes(&self) -> u64 {
        self.placed
    }

    /// The frame that offers a stream's reader `region` (see `raw_region`).
    pub fn offer(region: &RegionWriter) -> Frame {
        let header = ElementBatch {
            region: Some(region.offer()),
            ..Default::default()
        };
        Frame {
            header: length_prefixed(&header).expect("an offer fits a frame header"),
            payloads: Vec::new(),
            placed: 0,
        }
    }

    /// The frame that ends a stream with `status`.
    pub fn status(status: &Status) -> Frame {
        // Code 0 (Ok) would read as a batch: an "Ok" error is sent as Unknown.
        let code = match status.code() {
            Code::Ok => Code::Unknown,
            code => code,
        };
        let header = ElementBatch {
            status_code: code as i32,
            status_message: status.message().to_string(),
            ..Default::default()
        };
        Frame {
            header: length_prefixed(&header).expect("a status message fits a frame header"),
            payloads: Vec::new(),
            placed: 0,
        }
    }

    /// Writes the frame with vectored writes straight from the payloads' buffers, however many
    /// writes that takes, and flushes it.
    pub async fn write_to<W: AsyncWrite + Unpin>(&self, writer: &mut W) -> io::Result<()> {
        let parts: Vec<&[u8]> = std::iter::once(&self.header[..])
            .chain(self.payloads.iter().map(|p| &p[..]))
            .filter(|p| !p.is_empty())
            .collect();
        // Written so far: all of `parts[..next]` and `offset` bytes of `parts[next]`.
        let (mut next, mut offset) = (0, 0);
        while next < parts.len() {
            let slices: Vec<IoSlice<'_>> = std::iter::once(IoSlice::new(&parts[next][offset..]))
                .chain(
                    parts[next + 1..]
                        .iter()
                        .take(MAX_SLICES - 1)
                        .map(|p| IoSlice::new(p)),
                )
                .collect();
            let mut written = writer.write_vectored(&slices).await?;
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            while written > 0 {
                let left = parts[next].len() - offset;
                if written >= left {
                    written -= left;
                    next += 1;
                    offset = 0;
                } else {
                    offset += written;
                    written = 0;
                }
            }
        }
        // A TLS stream may hold the frame's last record until flushed.
        writer.flush().await
    }
}

/// `message` behind its u32 LE length.
fn length_prefixed(message: &impl Message) -> Result<Vec<u8>, Status> {
    let len = message.encoded_len();
    let prefix = u32::try_from(len)
        .map_err(|_| Status::internal(format!("a frame header of {len} bytes")))?;
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&prefix.to_le_bytes());
    message
        .encode(&mut out)
        .expect("a Vec grows to fit the message");
    Ok(out)
}

/// What a client sends first: the magic, its token (empty for none), and its first request.
pub fn hello_bytes(token: Option<&[u8]>, first: &FetchRequest) -> Vec<u8> {
    let token = token.unwrap_or_default();
    let mut hello = MAGIC.to_vec();
    let len = u32::try_from(token.len()).expect("a token is a few bytes");
    hello.extend_from_slice(&len.to_le_bytes());
    hello.extend_from_slice(token);
    hello.extend_from_slice(&request_bytes(first));
    hello
}

/// The handshake's token, read by the worker right after the magic: `None` for length 0. A
/// token longer than [`MAX_TOKEN_BYTES`] is refused before any of it is read.
pub async fn read_token<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Option<Vec<u8>>, Status> {
    let mut prefix = [0u8; 4];
    reader
        .read_exact(&mut prefix)
        .await
        .map_err(|e| read_error(e, "the token's length"))?;
    let len = u32::from_le_bytes(prefix) as usize;
    if len == 0 {
        return Ok(None);
    }
    if len > MAX_TOKEN_BYTES {
        return Err(Status::unauthenticated(format!(
            "a raw fetch token of {len} bytes (at most {MAX_TOKEN_BYTES})"
        )));
    }
    let mut token = vec![0u8; len];
    reader
        .read_exact(&mut token)
        .await
        .map_err(|e| read_error(e, "the token"))?;
    Ok(Some(token))
}

fn read_error(e: io::Error, what: &str) -> Status {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        Status::unavailable(format!(
            "raw fetch stream: the peer closed the connection in {what}"
        ))
    } else {
        io_status(e)
    }
}

/// A request as the client writes it.
pub fn request_bytes(request: &FetchRequest) -> Vec<u8> {
    length_prefixed(request).expect("a fetch request fits a frame")
}

/// The requests the worker reads off a connection (after the magic), as a stream that is
/// cancel-safe to poll (the read in progress lives in the stream) and ends after an error.
pub fn requests<R>(reader: R) -> BoxStream<'static, Result<FetchRequest, Status>>
where
    R: AsyncRead + Unpin + Send + 'static,
{
    stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        match read_request(&mut reader).await {
            Ok(Some(request)) => Some((Ok(request), Some(reader))),
            Ok(None) => None,
            Err(status) => Some((Err(status), None)),
        }
    })
    .fuse()
    .boxed()
}

/// The next request; `None` when the client closed its side between requests.
async fn read_request<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<Option<FetchRequest>, Status> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < prefix.len() {
        let n = reader.read(&mut prefix[got..]).await.map_err(io_status)?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(closed_mid_message())
            };
        }
        got += n;
    }
    let len = u32::from_le_bytes(prefix) as usize;
    if len > MAX_REQUEST_BYTES {
        return Err(Status::invalid_argument(format!(
            "a fetch request of {len} bytes (at most {MAX_REQUEST_BYTES})"
        )));
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).await.map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            closed_mid_message()
        } else {
            io_status(e)
        }
    })?;
    FetchRequest::decode(&body[..])
        .map(Some)
        .map_err(|e| Status::invalid_argument(format!("malformed fetch request: {e}")))
}

/// Reads frames off the worker's side of a connection.
pub struct FrameReader<R> {
    reader: R,
    /// Bytes read and not yet used: the next header, and often the first bytes of a payload.
    staging: BytesMut,
    /// Payloads a frame may carry at most: the credits the reader grants at most.
    max_parts: usize,
    /// Where a reader that asked for a region says it mapped one; dropped after the first
    /// frame, offer or not, so that it never keeps the connection's request side open.
    requests: Option<mpsc::Sender<FetchRequest>>,
    /// The region the worker offered, once mapped.
    region: Option<RegionReader>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(reader: R, max_parts: usize) -> FrameReader<R> {
        FrameReader {
            reader,
            staging: BytesMut::new(),
            max_parts,
            requests: None,
            region: None,
        }
    }

    /// A reader that asked for a region in its first request: it maps the one the worker
    /// offers, if it can, and says so through `requests`.
    pub fn mapping_regions(mut self, requests: mpsc::Sender<FetchRequest>) -> FrameReader<R> {
        self.requests = Some(requests);
        self
    }

    /// The next batch with its payloads back in place; `None` when the worker closed the
    /// connection between frames; the status of a status frame, or of a broken or malformed
    /// stream (`Unavailable` for I/O, `Internal` for bytes that are not this protocol).
    pub async fn next(&mut self) -> Result<Option<ElementBatch>, Status> {
        loop {
            let Some(mut batch) = self.next_header().await? else {
                return Ok(None);
            };
            let requests = self.requests.take();
            if let Some(offer) = batch.region.take() {
                self.map_region(&offer, requests).await;
                continue;
            }
            if batch.packed_offset != 0 {
                if !batch.packed.is_empty() {
                    return Err(Status::internal(
                        "a raw fetch frame places its elements in a region and carries them too",
                    ));
                }
                batch.packed = self.placed(batch.packed_offset, batch.packed_length)?;
                (batch.packed_offset, batch.packed_length) = (0, 0);
            }
            let lengths = std::mem::take(&mut batch.payload_lengths);
            let offsets = std::mem::take(&mut batch.payload_offsets);
            if lengths.len() > self.max_parts {
                return Err(Status::internal(format!(
                    "a raw fetch frame with {} payloads, more than the {} credits this stream grants",
                    lengths.len(),
                    self.max_parts
                )));
            }
            if !offsets.is_empty() && offsets.len() != lengths.len() {
                return Err(Status::internal(format!(
                    "a raw fetch frame places {} of its {} payloads",
                    offsets.len(),
                    lengths.len()
                )));
            }
            let mut payloads = Vec::with_capacity(lengths.len());
            for (i, len) in lengths.into_iter().enumerate() {
                if len > MAX_PART_BYTES {
                    return Err(Status::internal(format!(
                        "a raw fetch payload of {len} bytes (at most {MAX_PART_BYTES})"
                    )));
                }
                let payload = match offsets.get(i).copied().unwrap_or(0) {
                    0 => self.read_payload(len as usize).await?,
                    at => self.placed(at, len)?,
                };
                payloads.push(payload);
            }
            batch.payloads = payloads;
            return Ok(Some(batch));
        }
    }

    /// The bytes a frame placed at `offset` of the stream's region.
    fn placed(&self, offset: u64, len: u64) -> Result<Bytes, Status> {
        match &self.region {
            Some(region) => region.payload(offset, len),
            None => Err(Status::internal(
                "a raw fetch frame places bytes in a region this stream has not mapped",
            )),
        }
    }

    /// The next frame's header, decoded: `None` when the worker closed the connection between
    /// frames; the status of a status frame as an error.
    async fn next_header(&mut self) -> Result<Option<ElementBatch>, Status> {
        while self.staging.len() < 4 {
            self.staging.reserve(READ_AHEAD);
            let n = (&mut self.reader)
                .take(READ_AHEAD as u64)
                .read_buf(&mut self.staging)
                .await
                .map_err(io_status)?;
            if n == 0 {
                return if self.staging.is_empty() {
                    Ok(None)
                } else {
                    Err(closed_mid_message())
                };
            }
        }
        let header_len = self.staging.get_u32_le() as usize;
        fill(&mut self.reader, &mut self.staging, header_len).await?;
        let header = self.staging.split_to(header_len).freeze();
        // Decoding from `Bytes` slices the elements out of the header without copying them.
        let batch = ElementBatch::decode(header)
            .map_err(|e| Status::internal(format!("malformed raw fetch frame header: {e}")))?;
        if batch.status_code != 0 {
            return Err(Status::new(
                Code::from(batch.status_code),
                batch.status_message,
            ));
        }
        if !batch.payloads.is_empty() {
            return Err(Status::internal(
                "a raw fetch frame header carries payloads inline",
            ));
        }
        Ok(Some(batch))
    }

    /// Maps the offered region and tells the worker, when this reader asked for one (`requests`)
    /// and can; otherwise the stream goes on over the socket alone.
    async fn map_region(
        &mut self,
        offer: &RegionOffer,
        requests: Option<mpsc::Sender<FetchRequest>>,
    ) {
        let Some(requests) = requests else {
            return; // not asked for, or not first: ignored
        };
        match RegionReader::open(offer) {
            Ok(region) => {
                let mapped = FetchRequest {
                    region_mapped: true,
                    ..Default::default()
                };
                if requests.send(mapped).await.is_ok() {
                    self.region = Some(region);
                }
            }
            Err(e) => {
                debug!(error = %e, "could not map the worker's region; reading over the socket")
            }
        }
    }

    /// A payload in a buffer of its own, read into from the socket directly: only the bytes
    /// that came along with the header are copied.
    async fn read_payload(&mut self, len: usize) -> Result<Bytes, Status> {
        if self.staging.len() >= len {
            return Ok(self.staging.split_to(len).freeze());
        }
        let mut payload = BytesMut::with_capacity(len.min(PREALLOC_BYTES));
        payload.extend_from_slice(&self.staging);
        self.staging.clear();
        fill(&mut self.reader, &mut payload, len).await?;
        Ok(payload.freeze())
    }

    /// The batches to come, as a stream that is cancel-safe to poll (the read in progress lives
    /// in the stream) and ends after the first error.
    pub fn into_batches(self) -> Batches
    where
        R: Send + 'static,
    {
        let batches = stream::unfold(Some(self), |reader| async move {
            let mut reader = reader?;
            match reader.next().await {
                Ok(Some(batch)) => Some((Ok(batch), Some(reader))),
                Ok(None) => None,
                Err(status) => Some((Err(status), None)),
            }
        });
        Batches {
            inner: batches.fuse().boxed(),
        }
    }
}

/// A raw fetch stream's batches, read as a gRPC `Streaming<ElementBatch>` is.
pub struct Batches {
    inner: BoxStream<'static, Result<ElementBatch, Status>>,
}

impl Batches {
    /// The next batch; `None` when the worker closed the stream. Cancel-safe.
    pub async fn message(&mut self) -> Result<Option<ElementBatch>, Status> {
        self.inner.next().await.transpose()
    }
}

/// Reads into `buf` until it holds `len` bytes, never past them. The buffer's capacity grows to
/// `len` at once up to `PREALLOC_BYTES`, and past that as its bytes arrive.
async fn fill<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut BytesMut,
    len: usize,
) -> Result<(), Status> {
    while buf.len() < len {
        if buf.capacity() == buf.len() {
            let missing = len - buf.len();
            buf.reserve(missing.min(PREALLOC_BYTES.max(buf.len())));
        }
        let n = (&mut *reader)
            .take((len - buf.len()) as u64)
            .read_buf(buf)
            .await
            .map_err(io_status)?;
        if n == 0 {
            return Err(closed_mid_message());
        }
    }
    Ok(())
}

fn io_status(e: io::Error) -> Status {
    Status::unavailable(format!("raw fetch stream: {e}"))
}

fn closed_mid_message() -> Status {
    Status::unavailable("raw fetch stream: the peer closed the connection mid-message")
}

#[cfg(test)]
#[path = "raw_frame_tests.rs"]
mod tests;

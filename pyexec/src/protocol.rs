//! The framed binary protocol between a worker and its executor processes, over the executor's
//! stdin (requests) and stdout (replies). Pure: frames to and from bytes, no I/O policy.
//!
//! ```text
//! frame:   length u32 LE (of kind + body), kind u8, body
//! requests (worker -> executor):
//!   LOAD   0x01  function id u64 LE, function kind u8 (PyFunctionKind), cloudpickle bytes
//!   CALL   0x02  function id u64 LE, the element (sluice_element::codec, uncompressed)
//!   UNLOAD 0x03  function id u64 LE                                       (no reply)
//!   BATCH  0x04  function id u64 LE, count u32 LE, then per element: length u32 LE, element
//!   BATCH_SHARED 0x05  function id u64 LE, slot u8, length u32 LE: a BATCH body (after its
//!                 function id) of that length lies in the shared region's request slot
//! replies (executor -> worker), one per LOAD or CALL, in request order:
//!   HELLO   0x80  JSON {"python": "3.11", "cloudpickle": "3.0.0", "pid": 123} (first, unasked)
//!   OUTPUTS 0x81  count u32 LE, then per output: length u32 LE, element encoding
//!   KEEP    0x82  u8: 1 a filter keeps its input, 0 it drops it
//!   ERROR   0x83  JSON {"type_module", "type_name", "message", "traceback"}
//!   LOADED  0x84  empty
//!   RESULTS 0x85  count u32 LE, nanoseconds the batch took u64 LE, then per element in order:
//!                 kind u8 (OUTPUTS, KEEP or ERROR), length u32 LE, that reply's body
//!   RESULTS_SHARED 0x86  slot u8, length u32 LE: a RESULTS body of that length lies in the
//!                 shared region's reply slot (the slot of the BATCH_SHARED it answers)
//! ```
//!
//! An executor started with a shared region (`shared_region`) says so in its HELLO
//! (`"shared": true`); the worker then sends a batch that fits a request slot as a
//! BATCH_SHARED, and the executor answers one whose results fit a reply slot with a
//! RESULTS_SHARED, any other with a RESULTS.
//!
//! A BATCH is answered by one RESULTS with a result per element (an element whose call raised
//! has its ERROR there and the elements after it are still called), or by one ERROR when the
//! batch itself could not be read. The nanoseconds are the executor's own measure of the whole
//! batch (decoding, calls, encoding), which sizes the next batches (`batch_size`).
//!
//! Invariants: an executor handles one request at a time and answers in order, so a reply is
//! matched to its request by position; elements travel in the codec's format (no pickle for
//! data); a frame longer than `MAX_FRAME` is refused rather than allocated.

use std::io::{self, Read, Write};

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use sluice_element::{codec, DatasetError, Element};

pub const LOAD: u8 = 0x01;
pub const CALL: u8 = 0x02;
pub const UNLOAD: u8 = 0x03;
pub const BATCH: u8 = 0x04;
pub const BATCH_SHARED: u8 = 0x05;
pub const HELLO: u8 = 0x80;
pub const OUTPUTS: u8 = 0x81;
pub const KEEP: u8 = 0x82;
pub const ERROR: u8 = 0x83;
pub const LOADED: u8 = 0x84;
pub const RESULTS: u8 = 0x85;
pub const RESULTS_SHARED: u8 = 0x86;

/// The largest frame written or read (1 GiB): a larger element is refused with an error, and a
/// corrupt length never becomes a huge allocation.
pub const MAX_FRAME: usize = 1 << 30;

/// A frame's kind and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub body: Bytes,
}

/// What an executor says first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub python: String,
    pub cloudpickle: String,
    pub pid: u32,
    /// Whether it mapped the shared region it was started with (absent: no).
    #[serde(default)]
    pub shared: bool,
}

/// An exception as an executor reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RemoteException {
    pub type_module: String,
    pub type_name: String,
    pub message: String,
    pub traceback: String,
}

/// Writes one frame whose body is the concatenation of `parts` (so a large tensor is written
/// from where it lies, without a copy into the frame).
pub fn write_frame(out: &mut impl Write, kind: u8, parts: &[&[u8]]) -> io::Result<()> {
    let len = 1 + parts.iter().map(|p| p.len()).sum::<usize>();
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a frame of {len} bytes is longer than the protocol's {MAX_FRAME}"),
        ));
    }
    let len = len as u32;
    let mut head = [0u8; 5];
    head[..4].copy_from_slice(&len.to_le_bytes());
    head[4] = kind;
    out.write_all(&head)?;
    for part in parts {
        out.write_all(part)?;
    }
    out.flush()
}

/// Reads one frame; `Ok(None)` at a clean end of stream (before a frame's first byte).
pub fn read_frame(input: &mut impl Read) -> io::Result<Option<Frame>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match input.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of length {len} (at least 1, at most {MAX_FRAME})"),
        ));
    }
    let mut buf = BytesMut::zeroed(len);
    input.read_exact(&mut buf)?;
    let body = buf.freeze();
    Ok(Some(Frame {
        kind: body[0],
        body: body.slice(1..),
    }))
}

/// The head of a LOAD or CALL body: the function id, then (LOAD) its kind.
pub fn function_head(id: u64) -> [u8; 8] {
    id.to_le_bytes()
}

/// Where in the shared region a BATCH_SHARED's inputs or a RESULTS_SHARED's results lie: the
/// slot and the length, as the frame carries them (after a BATCH_SHARED's function id).
pub fn shared_ref(slot: usize, len: usize) -> [u8; 5] {
    let mut out = [0u8; 5];
    out[0] = slot as u8;
    out[1..].copy_from_slice(&(len as u32).to_le_bytes());
    out
}

/// The slot and length of a `shared_ref`; `None` when `body` is not one.
pub fn parse_shared_ref(body: &[u8]) -> Option<(usize, usize)> {
    (body.len() == 5).then(|| (body[0] as usize, u32_le(&body[1..]) as usize))
}

/// Copies `parts` one after another into `out`: their total length, or `None` (and `out` partly
/// written) when they do not fit.
pub fn copy_parts<'a>(out: &mut [u8], parts: impl IntoIterator<Item = &'a [u8]>) -> Option<usize> {
    let mut at = 0usize;
    for part in parts {
        let end = at.checked_add(part.len()).filter(|&end| end <= out.len())?;
        out[at..end].copy_from_slice(part);
        at = end;
    }
    Some(at)
}

/// A tensor's data of at least this many bytes is written into a frame or a slot from where it
/// lies, rather than first copied into the encoding's other bytes.
pub const PART_MIN_BYTES: usize = 4 << 10;

/// Encodes a call's outputs as an OUTPUTS body.
pub fn encode_outputs(outputs: &[Element]) -> Result<Vec<u8>, DatasetError> {
    Ok(encode_outputs_parts(outputs)?.concat())
}

/// An OUTPUTS body as the parts that concatenate to it: each tensor's data of at least
/// `PART_MIN_BYTES` is a part of its own, shared with the tensor, so the body is copied once,
/// where it is written. Refused when an output's encoding is longer than a length field holds.
pub fn encode_outputs_parts(outputs: &[Element]) -> Result<Vec<Bytes>, DatasetError> {
    encode_counted(outputs, "a Python function's output")
}

/// The count of `elements`, then each one's length and encoding, as parts (see
/// `encode_outputs_parts`). `what` names an element in the error for one too long.
fn encode_counted(elements: &[Element], what: &str) -> Result<Vec<Bytes>, DatasetError> {
    let mut parts = Vec::with_capacity(1 + 2 * elements.len());
    let mut head = BytesMut::with_capacity(64);
    head.extend_from_slice(&(elements.len() as u32).to_le_bytes());
    let mut own = BytesMut::new();
    let mut own_parts = Vec::new();
    for element in elements {
        codec::encode_element_split(element, PART_MIN_BYTES, &mut own, &mut own_parts);
        let len = own.len() + own_parts.iter().map(Bytes::len).sum::<usize>();
        let len = u32::try_from(len).map_err(|_| {
            DatasetError::Codec(format!(
                "{what} of {len} bytes is too large for a Python executor's frame"
            ))
        })?;
        head.extend_from_slice(&len.to_le_bytes());
        let mut own_parts_iter = own_parts.drain(..);
        if let Some(first) = own_parts_iter.next() {
            // What precedes the first large data: small, joined to the head.
            head.extend_from_slice(&first);
            parts.push(head.split().freeze());
            parts.extend(own_parts_iter);
        }
        head.extend_from_slice(&own);
        own.clear();
    }
    if !head.is_empty() {
        parts.push(head.freeze());
    }
    Ok(parts)
}

/// Decodes an OUTPUTS body; tensors share `body` (no copy).
pub fn decode_outputs(body: &Bytes) -> Result<Vec<Element>, DatasetError> {
    let bad = |what: &str| DatasetError::Codec(format!("executor outputs: {what}"));
    let mut pos = 0usize;
    let mut take = |n: usize| -> Result<Bytes, DatasetError> {
        let end = pos
            .checked_add(n)
            .filter(|&end| end <= body.len())
            .ok_or_else(|| bad("truncated"))?;
        let part = body.slice(pos..end);
        pos = end;
        Ok(part)
    };
    let count = u32_le(&take(4)?);
    // Every output takes at least its 4-byte length: a count past that is garbage.
    if count as usize > body.len() / 4 {
        return Err(bad("more outputs than bytes"));
    }
    let mut outputs = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let len = u32_le(&take(4)?) as usize;
        outputs.push(codec::decode_element_bytes(take(len)?)?);
    }
    if pos != body.len() {
        return Err(bad("trailing bytes"));
    }
    Ok(outputs)
}

/// A BATCH body after its function id, as the pieces to write (`write_frame`'s parts): the
/// count, then each element's length and encoding, with tensors' data shared with the elements
/// as in `encode_outputs_parts`. Refused when an element's encoding is longer than a length
/// field holds.
pub fn encode_batch(inputs: &[Element]) -> Result<Vec<Bytes>, DatasetError> {
    encode_counted(inputs, "an element")
}

/// The elements' encodings in a BATCH body after its function id (or an OUTPUTS body): each
/// is a slice of `body`, checked against its end.
pub fn split_elements(body: &[u8]) -> Result<Vec<&[u8]>, DatasetError> {
    let bad = |what: &str| DatasetError::Codec(format!("executor elements: {what}"));
    let (count, mut rest) = split_u32(body).ok_or_else(|| bad("truncated"))?;
    // Every element takes at least its 4-byte length: a count past that is garbage.
    if count as usize > rest.len() / 4 {
        return Err(bad("more elements than bytes"));
    }
    let mut elements = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let (len, after) = split_u32(rest).ok_or_else(|| bad("truncated"))?;
        let len = len as usize;
        if len > after.len() {
            return Err(bad("truncated"));
        }
        elements.push(&after[..len]);
        rest = &after[len..];
    }
    if !rest.is_empty() {
        return Err(bad("trailing bytes"));
    }
    Ok(elements)
}

/// A RESULTS body: how long the batch took in the executor, and each element's reply (its kind
/// and body, a slice of the frame).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchResults {
    pub nanos: u64,
    pub results: Vec<(u8, Bytes)>,
}

/// Encodes a RESULTS body (the executor's side, for tests; `sluice._executor` writes the same).
pub fn encode_results(nanos: u64, results: &[(u8, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(results.len() as u32).to_le_bytes());
    out.extend_from_slice(&nanos.to_le_bytes());
    for (kind, body) in results {
        out.push(*kind);
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(body);
    }
    out
}

/// Writes a RESULTS body into `out` (the executor's side, into its reply slot): its length, or
/// `None` when it does not fit. Each result is its kind and the parts of its body.
pub fn write_results(out: &mut [u8], nanos: u64, results: &[(u8, Vec<Bytes>)]) -> Option<usize> {
    let mut head = [0u8; 12];
    head[..4].copy_from_slice(&u32::try_from(results.len()).ok()?.to_le_bytes());
    head[4..].copy_from_slice(&nanos.to_le_bytes());
    let mut at = copy_parts(out, [&head[..]])?;
    for (kind, parts) in results {
        at += write_results_entry(out.get_mut(at..)?, *kind, parts)?;
    }
    Some(at)
}

/// Writes one result of a RESULTS body (its kind, length and the parts of its body) at the
/// start of `out`: its length, or `None` when it does not fit.
pub fn write_results_entry(out: &mut [u8], kind: u8, parts: &[Bytes]) -> Option<usize> {
    let len = parts.iter().map(Bytes::len).sum::<usize>();
    let mut head = [0u8; 5];
    head[0] = kind;
    head[1..].copy_from_slice(&u32::try_from(len).ok()?.to_le_bytes());
    copy_parts(
        out,
        std::iter::once(&head[..]).chain(parts.iter().map(Bytes::as_ref)),
    )
}

/// Decodes a RESULTS body; each reply's body shares `body`.
pub fn decode_results(body: &Bytes) -> Result<BatchResults, DatasetError> {
    let bad = |what: &str| DatasetError::Codec(format!("executor results: {what}"));
    if body.len() < 12 {
        return Err(bad("truncated"));
    }
    let count = u32_le(&body[..4]) as usize;
    let nanos = u64::from_le_bytes(body[4..12].try_into().expect("8 bytes"));
    // Every result takes at least its kind and 4-byte length.
    if count > (body.len() - 12) / 5 {
        return Err(bad("more results than bytes"));
    }
    let mut results = Vec::with_capacity(count);
    let mut pos = 12usize;
    for _ in 0..count {
        if body.len() - pos < 5 {
            return Err(bad("truncated"));
        }
        let kind = body[pos];
        let len = u32_le(&body[pos + 1..pos + 5]) as usize;
        pos += 5;
        if len > body.len() - pos {
            return Err(bad("truncated"));
        }
        results.push((kind, body.slice(pos..pos + len)));
        pos += len;
    }
    if pos != body.len() {
        return Err(bad("trailing bytes"));
    }
    Ok(BatchResults { nanos, results })
}

fn split_u32(b: &[u8]) -> Option<(u32, &[u8])> {
    (b.len() >= 4).then(|| (u32_le(b), &b[4..]))
}

fn u32_le(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;

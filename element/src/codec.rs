//! The element wire codec: how a worker sends one element to a client.
//!
//! ```text
//! byte 0: bits 0..=6 format version (1), bit 7 set if the rest is snappy (raw) compressed
//! body:   element = tag u8 (0 tensor, 1 tuple, 2 dict) then
//!         tensor: dtype u8 (pb::DType number), rank varint, dims varint*, then
//!                 numeric: raw little-endian data (length implied by dims), or
//!                 string: per element varint length + bytes
//!         tuple:  count varint, elements
//!         dict:   count varint, (key length varint, key UTF-8, element)* in sorted key order
//! ```
//!
//! A tiny int64 scalar encodes to 12 bytes in one allocation; a large numeric tensor costs one
//! copy to encode. `decode_element_bytes` slices tensors out of the buffer without copying when
//! it is not compressed; `decode_element` copies only the tensor payloads. Decoding is
//! defensive: every length is checked against what is left, nesting is bounded, and allocations
//! never exceed what the input can fill, so garbage gives `DatasetError::Codec`, never a panic or
//! a huge allocation.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use bytes::{BufMut, Bytes, BytesMut};

use crate::dtype::DType;
use crate::element::Element;
use crate::error::DatasetError;
use crate::pb;
use crate::tensor::{checked_num_elements, Tensor};

const VERSION: u8 = 1;
const COMPRESSED: u8 = 0x80;
const TAG_TENSOR: u8 = 0;
const TAG_TUPLE: u8 = 1;
const TAG_DICT: u8 = 2;
const MAX_DEPTH: usize = 64;
const MAX_RANK: u64 = 64;
/// Items a tuple makes room for before they are decoded.
const PREALLOC_ITEMS: usize = 16;
/// Tensors with at least this many bytes of data are encoded as two parts (see
/// `encode_element_append`): their data then goes from the tensor's buffer to the socket
/// without a copy. At 16 KiB (an image of 64×64 RGB `uint8` is 12 KiB, its `float32` version
/// 48 KiB) a copy costs far more than the part's own reference count; with 64 KiB, a worker
/// copied each 48 KiB image three times more on its way to the reader.
pub(crate) const PART_MIN: usize = 16 << 10;
/// Bodies smaller than this are never worth compressing.
const MIN_COMPRESS_LEN: usize = 64;

/// Per-dataset compression of elements on the wire, chosen at registration (tf.data's
/// `compression` argument). The one definition: the client, the worker and the dispatcher's
/// replicated state use this type. The serde variant order (`None`, `Auto`) is part of the
/// dispatcher's on-disk format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Compression {
    None,
    /// Snappy, skipped per element when it does not shrink the element by at least 10%.
    #[default]
    Auto,
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Compression::None => "none",
            Compression::Auto => "auto",
        })
    }
}

impl FromStr for Compression {
    type Err = DatasetError;

    /// `auto` or `none`, case-insensitive.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Ok(Compression::None),
            "auto" => Ok(Compression::Auto),
            _ => Err(DatasetError::invalid(format!(
                "Invalid `compression` argument: {s}. Must be one of ['auto', 'none']."
            ))),
        }
    }
}

impl Compression {
    pub fn to_proto(self) -> sluice_proto::dispatcher::Compression {
        match self {
            Compression::None => sluice_proto::dispatcher::Compression::None,
            Compression::Auto => sluice_proto::dispatcher::Compression::Auto,
        }
    }

    /// A message's `compression` field. Unspecified means the default, `auto`, as in tf.data's
    /// `register_dataset`; a number that is no compression is an error.
    pub fn from_proto(value: i32) -> Result<Compression, DatasetError> {
        match sluice_proto::dispatcher::Compression::try_from(value) {
            Ok(sluice_proto::dispatcher::Compression::Unspecified)
            | Ok(sluice_proto::dispatcher::Compression::Auto) => Ok(Compression::Auto),
            Ok(sluice_proto::dispatcher::Compression::None) => Ok(Compression::None),
            Err(_) => Err(DatasetError::invalid(format!(
                "compression {value} is not a valid compression"
            ))),
        }
    }
}

impl From<Compression> for sluice_proto::dispatcher::Compression {
    fn from(c: Compression) -> Self {
        c.to_proto()
    }
}

/// Whether `encoding` (an element's, as [`encode_element_append`] starts it) was compressed.
pub fn is_compressed(encoding: &[u8]) -> bool {
    encoding
        .first()
        .is_some_and(|header| header & COMPRESSED != 0)
}

/// `Auto` compression for a stream of elements that stops trying when it does not pay: snappy
/// over an element it cannot shrink by 10% (a `float32` image, already compressed bytes) is
/// wasted, and an element sent uncompressed can travel as parts (its data from its own
/// buffer, no copy). After `MISSES_BEFORE_SKIPPING` elements in a row that did not compress,
/// the next `FIRST_SKIP` go without trying, then one is tried again; each further miss doubles
/// the run skipped, up to `MAX_SKIP`; one element that compresses starts over. So data that
/// compresses is always compressed, and data that does not costs one try in 64 to 4,096
/// elements. Pure: what was seen in, whether to try out.
#[derive(Debug, Default, Clone)]
pub struct AutoCompression {
    /// Tried elements in a row that did not compress.
    misses: u32,
    /// Elements still to go without trying.
    skip: u32,
}

impl AutoCompression {
    pub const MISSES_BEFORE_SKIPPING: u32 = 4;
    pub const FIRST_SKIP: u32 = 64;
    pub const MAX_SKIP: u32 = 4096;

    /// The compression to encode the next element with, `requested` being the dataset's.
    pub fn next(&mut self, requested: Compression) -> Compression {
        if requested == Compression::None {
            return Compression::None;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return Compression::None;
        }
        Compression::Auto
    }

    /// What encoding an element with `next`'s `Auto` gave: `compressed` or not.
    pub fn tried(&mut self, compressed: bool) {
        if compressed {
            self.misses = 0;
            return;
        }
        self.misses = self.misses.saturating_add(1);
        if let Some(beyond) = self.misses.checked_sub(Self::MISSES_BEFORE_SKIPPING) {
            self.skip = Self::FIRST_SKIP
                .saturating_mul(1 << beyond.min(16))
                .min(Self::MAX_SKIP);
        }
    }
}

/// Encodes one element (see the module docs for the format) in one buffer.
pub fn encode_element(el: &Element, compression: Compression) -> Bytes {
    let mut out = BytesMut::with_capacity(1 + encoded_len_hint(el));
    match encode_element_append(el, compression, &mut out) {
        None => out.freeze(),
        Some(payload) => {
            out.extend_from_slice(&payload);
            out.freeze()
        }
    }
}

/// Appends one element's encoding to `out`, so many elements can sit back to back in one buffer
/// (see `Packed`). A numeric tensor of at least `PART_MIN` bytes sent uncompressed is appended as
/// its encoding up to the data, and the data comes back, shared with the tensor: the element's
/// encoding is the two concatenated, and no copy of the data is made. Otherwise `None`.
pub fn encode_element_append(
    el: &Element,
    compression: Compression,
    out: &mut BytesMut,
) -> Option<Bytes> {
    if let (Compression::None, Element::Tensor(t)) = (compression, el) {
        if let Some(raw) = t.raw_data().filter(|raw| raw.len() >= PART_MIN) {
            out.reserve(3 + 10 * (t.rank() + 1));
            out.put_u8(VERSION);
            encode_tensor_header(t, out);
            return Some(raw.clone());
        }
    }
    if let Some(scalar) = encode_scalar(el) {
        // A fixed-size copy and a truncation: cheaper than a copy of a variable length.
        out.extend_from_slice(&scalar.bytes);
        out.truncate(out.len() - (scalar.bytes.len() - scalar.len));
        return None;
    }
    let start = out.len();
    out.reserve(1 + encoded_len_hint(el));
    out.put_u8(VERSION);
    encode_into(el, out);
    let body_len = out.len() - start - 1;
    if compression == Compression::Auto && body_len > MIN_COMPRESS_LEN {
        let mut compressed = vec![0u8; snap::raw::max_compress_len(body_len)];
        if let Ok(n) = snap::raw::Encoder::new().compress(&out[start + 1..], &mut compressed) {
            if n * 10 <= body_len * 9 {
                out.truncate(start);
                out.put_u8(VERSION | COMPRESSED);
                out.put_slice(&compressed[..n]);
            }
        }
    }
    None
}

/// Decodes an element sent as two parts by [`encode_element_append`] (an empty `payload`: the
/// element is whole in `head`). The payload becomes the tensor's data without a copy.
pub(crate) fn decode_element_parts(head: Bytes, payload: Bytes) -> Result<Element, DatasetError> {
    if payload.is_empty() {
        return decode_element_bytes(head);
    }
    if head.first() != Some(&VERSION) || head.get(1) != Some(&TAG_TENSOR) {
        return Err(codec_error(
            "a payload part belongs to an uncompressed tensor header",
        ));
    }
    Reader {
        buf: &head,
        owner: Some(&head),
        pos: 1,
        payload: Some(payload),
    }
    .finish()
}

/// Decodes an element from a borrowed buffer; tensor payloads are copied out of it.
pub fn decode_element(buf: &[u8]) -> Result<Element, DatasetError> {
    decode(buf, None)
}

/// Decodes an element; tensor payloads share `buf` (no copy) when it is not compressed.
pub fn decode_element_bytes(buf: Bytes) -> Result<Element, DatasetError> {
    decode(&buf, Some(&buf))
}

/// `owner`, when given, is `buf` itself as `Bytes`, so payloads can be sliced from it.
fn decode(buf: &[u8], owner: Option<&Bytes>) -> Result<Element, DatasetError> {
    let Some(&header) = buf.first() else {
        return Err(codec_error("empty buffer"));
    };
    let version = header & !COMPRESSED;
    if version != VERSION {
        return Err(codec_error(format!("unsupported format version {version}")));
    }
    if header & COMPRESSED == 0 {
        if let Some(scalar) = decode_scalar(buf) {
            return Ok(scalar);
        }
        return Reader {
            buf,
            owner,
            pos: 1,
            payload: None,
        }
        .finish();
    }
    let compressed = &buf[1..];
    let len = snap::raw::decompress_len(compressed)
        .map_err(|e| codec_error(format!("bad snappy header: {e}")))?;
    // Snappy expands at most ~21x; a larger claim is garbage and must not be allocated.
    if len > compressed.len().saturating_mul(32) {
        return Err(codec_error(format!(
            "implausible decompressed length {len}"
        )));
    }
    let body = Bytes::from(
        snap::raw::Decoder::new()
            .decompress_vec(compressed)
            .map_err(|e| codec_error(format!("bad snappy data: {e}")))?,
    );
    Reader {
        buf: &body,
        owner: Some(&body),
        pos: 0,
        payload: None,
    }
    .finish()
}

/// A numeric scalar's whole encoding (see `encode_scalar`).
struct ScalarEncoding {
    bytes: [u8; 12],
    len: usize,
}

/// The fast path for the commonest tiny element, a numeric scalar: its encoding built with
/// fixed-size copies (the general path costs a few calls per element). `None` for anything
/// else.
fn encode_scalar(el: &Element) -> Option<ScalarEncoding> {
    let Element::Tensor(t) = el else {
        return None;
    };
    let raw = t.raw_data().filter(|_| t.rank() == 0)?;
    let mut bytes = [
        VERSION,
        TAG_TENSOR,
        pb::DType::from(t.dtype()) as i32 as u8,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    ];
    match raw.len() {
        8 => bytes[4..12].copy_from_slice(raw),
        4 => bytes[4..8].copy_from_slice(raw),
        2 => bytes[4..6].copy_from_slice(raw),
        1 => bytes[4] = raw[0],
        _ => return None,
    }
    Some(ScalarEncoding {
        bytes,
        len: 4 + raw.len(),
    })
}

/// The fast path for the commonest tiny element, a numeric scalar (`[version, tensor tag, dtype,
/// rank 0, data]`), whose data is copied into its own allocation; `None` for anything else.
#[inline]
pub(crate) fn decode_scalar(buf: &[u8]) -> Option<Element> {
    let [VERSION, TAG_TENSOR, code, 0, data @ ..] = buf else {
        return None;
    };
    let dtype = DType::from_code(*code)?;
    (dtype.size() == Some(data.len()))
        .then(|| Tensor::scalar_raw(dtype, Bytes::copy_from_slice(data)).into())
}

fn codec_error(message: impl Into<String>) -> DatasetError {
    DatasetError::Codec(message.into())
}

fn encoded_len_hint(el: &Element) -> usize {
    match el {
        Element::Tensor(t) => {
            3 + t.rank() * 2 + t.byte_size() + t.strings().map_or(0, |s| s.len() * 2)
        }
        Element::Tuple(items) => 2 + items.iter().map(encoded_len_hint).sum::<usize>(),
        Element::Dict(fields) => {
            2 + fields
                .iter()
                .map(|(k, v)| 2 + k.len() + encoded_len_hint(v))
                .sum::<usize>()
        }
    }
}

fn put_varint(out: &mut impl BufMut, mut v: u64) {
    while v >= 0x80 {
        out.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

fn encode_into(el: &Element, out: &mut BytesMut) {
    encode_with(el, out, &mut |out, raw| out.put_slice(raw));
}

/// Appends `el`'s uncompressed encoding to `out` as `encode_element_append` does, except that
/// the data of every tensor (at any depth of tuples and dicts) of at least `part_min` bytes is
/// not copied: `parts` receives what `out` held before it (split off `out`) and then the data
/// itself, shared with the tensor. The encoding is `parts` concatenated, then what `out` holds.
pub fn encode_element_split(
    el: &Element,
    part_min: usize,
    out: &mut BytesMut,
    parts: &mut Vec<Bytes>,
) {
    if let Some(scalar) = encode_scalar(el) {
        out.extend_from_slice(&scalar.bytes[..scalar.len]);
        return;
    }
    out.put_u8(VERSION);
    encode_with(el, out, &mut |out, raw| {
        if raw.len() >= part_min {
            parts.push(out.split().freeze());
            parts.push(raw.clone());
        } else {
            out.put_slice(raw);
        }
    });
}

/// The encoding of `el` into `out`, with each tensor's raw data handed to `data`.
fn encode_with(el: &Element, out: &mut BytesMut, data: &mut dyn FnMut(&mut BytesMut, &Bytes)) {
    match el {
        Element::Tensor(t) => {
            encode_tensor_header(t, out);
            match (t.raw_data(), t.strings()) {
                (Some(raw), _) => data(out, raw),
                (None, Some(strings)) => {
                    for s in strings {
                        put_varint(out, s.len() as u64);
                        out.put_slice(s);
                    }
                }
                (None, None) => unreachable!("a tensor holds raw data or strings"),
            }
        }
        Element::Tuple(items) => {
            out.put_u8(TAG_TUPLE);
            put_varint(out, items.len() as u64);
            for i in items {
                encode_with(i, out, data);
            }
        }
        Element::Dict(fields) => {
            out.put_u8(TAG_DICT);
            put_varint(out, fields.len() as u64);
            for (k, v) in fields {
                put_varint(out, k.len() as u64);
                out.put_slice(k.as_bytes());
                encode_with(v, out, data);
            }
        }
    }
}

/// A tensor's tag, dtype and shape: its encoding up to its data.
fn encode_tensor_header(t: &Tensor, out: &mut impl BufMut) {
    out.put_u8(TAG_TENSOR);
    out.put_u8(pb::DType::from(t.dtype()) as i32 as u8);
    put_varint(out, t.rank() as u64);
    for &d in t.shape() {
        put_varint(out, d as u64);
    }
}

/// A cursor over an encoded body.
struct Reader<'a> {
    buf: &'a [u8],
    /// `buf` as `Bytes` when the caller owns it: payloads are then slices, not copies.
    owner: Option<&'a Bytes>,
    pos: usize,
    /// The data of the (only) tensor, when it travelled as a separate part.
    payload: Option<Bytes>,
}

impl Reader<'_> {
    /// Decodes the one element the body holds; nothing may follow it.
    fn finish(mut self) -> Result<Element, DatasetError> {
        let el = self.element(0)?;
        if self.pos != self.buf.len() {
            return Err(codec_error(format!("{} trailing bytes", self.remaining())));
        }
        if self.payload.is_some() {
            return Err(codec_error("a payload part that no tensor used"));
        }
        Ok(el)
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn u8(&mut self) -> Result<u8, DatasetError> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or_else(|| codec_error("unexpected end of data"))?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, DatasetError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(codec_error("varint too long"))
    }

    fn len(&mut self, what: &str) -> Result<usize, DatasetError> {
        let v = self.varint()?;
        usize::try_from(v)
            .ok()
            .filter(|&n| n <= self.remaining())
            .ok_or_else(|| {
                codec_error(format!(
                    "{what} {v} exceeds the {} bytes left",
                    self.remaining()
                ))
            })
    }

    fn take(&mut self, n: usize) -> Result<Bytes, DatasetError> {
        if n > self.remaining() {
            return Err(codec_error(format!(
                "need {n} bytes, {} left",
                self.remaining()
            )));
        }
        let range = self.pos..self.pos + n;
        let b = match self.owner {
            Some(owner) => owner.slice(range),
            None => Bytes::copy_from_slice(&self.buf[range]),
        };
        self.pos += n;
        Ok(b)
    }

    fn element(&mut self, depth: usize) -> Result<Element, DatasetError> {
        if depth > MAX_DEPTH {
            return Err(codec_error("element nested too deeply"));
        }
        match self.u8()? {
            TAG_TENSOR => self.tensor().map(Element::Tensor),
            TAG_TUPLE => {
                // Every item takes at least one byte, so `n` is at most the bytes left; yet each
                // open tuple could claim all of them, so room is made as items arrive.
                let n = self.len("tuple length")?;
                let mut items = Vec::with_capacity(n.min(PREALLOC_ITEMS));
                for _ in 0..n {
                    items.push(self.element(depth + 1)?);
                }
                Ok(Element::Tuple(items))
            }
            TAG_DICT => {
                let n = self.len("dict length")?;
                let mut fields = BTreeMap::new();
                for _ in 0..n {
                    let k = self.len("key length")?;
                    let key = std::str::from_utf8(&self.buf[self.pos..self.pos + k])
                        .map(str::to_string)
                        .map_err(|_| codec_error("dict key is not UTF-8"))?;
                    self.pos += k;
                    let value = self.element(depth + 1)?;
                    if fields.insert(key, value).is_some() {
                        return Err(codec_error("duplicate dict key"));
                    }
                }
                Ok(Element::Dict(fields))
            }
            tag => Err(codec_error(format!("unknown element tag {tag}"))),
        }
    }

    fn tensor(&mut self) -> Result<Tensor, DatasetError> {
        let code = self.u8()?;
        // The table lookup; the conversion only to say what is wrong.
        let dtype = DType::from_code(code).map_or_else(
            || DType::try_from(i32::from(code)).map_err(|e| codec_error(e.to_string())),
            Ok,
        )?;
        let rank = self.varint()?;
        if rank > MAX_RANK {
            return Err(codec_error(format!("rank {rank} is too large")));
        }
        let shape = (0..rank)
            .map(|_| {
                let d = self.varint()?;
                usize::try_from(d).map_err(|_| codec_error(format!("dimension {d} is too large")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let n = checked_num_elements(&shape).map_err(|e| codec_error(e.to_string()))?;
        match dtype.size() {
            Some(size) => {
                let len = n
                    .checked_mul(size)
                    .ok_or_else(|| codec_error("tensor too large"))?;
                let data = match self.payload.take() {
                    // The header ends here, and the data is the separate part.
                    Some(payload) if self.remaining() == 0 && payload.len() == len => payload,
                    Some(payload) => {
                        return Err(codec_error(format!(
                            "a payload part of {} bytes for a tensor of {len} bytes",
                            payload.len()
                        )))
                    }
                    None => self.take(len)?,
                };
                Tensor::from_raw(dtype, shape, data).map_err(|e| codec_error(e.to_string()))
            }
            None => {
                // Every string takes at least its length byte.
                if n > self.remaining() {
                    return Err(codec_error(format!(
                        "{n} strings cannot fit in {} bytes",
                        self.remaining()
                    )));
                }
                let mut strings = Vec::with_capacity(n);
                for _ in 0..n {
                    let k = self.len("string length")?;
                    strings.push(self.take(k)?);
                }
                Tensor::from_strings(shape, strings).map_err(|e| codec_error(e.to_string()))
            }
        }
    }
}

#[cfg(test)]
#[path = "codec_tests.rs"]
pub(crate) mod tests;

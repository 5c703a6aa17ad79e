//! `Packed`: encoded elements back to back in one buffer. A worker's task buffer hands elements
//! over this way, and a fetch stream sends them this way (worker.proto `ElementBatch.packed`).
//!
//! Why: an int64 scalar encodes to 12 bytes, and when every element was its own `Bytes` the
//! per-element reference counting dominated a tiny element's cost. The counts of one shared
//! buffer were bumped by the thread that decoded and dropped by the thread that consumed, so
//! the counter's cache line moved between cores for every element. In a `Packed` run nothing
//! exists per element but its length until the reader decodes it. A small element decodes into
//! its own allocation (no shared count), and a large one shares the buffer (a count per element
//! costs little next to its size).
//!
//! Element `i` is `lengths[i]` bytes of `packed`, after the elements before it, followed by
//! `payloads[i]` when `payloads` is not empty (a large tensor's data, see
//! [`encode_element_append`]).

use bytes::{Bytes, BytesMut};

use crate::codec::{
    decode_element, decode_element_bytes, decode_element_parts, decode_scalar,
    encode_element_append, Compression,
};
use crate::element::Element;
use crate::error::DatasetError;

/// Elements encoded in fewer bytes than this are decoded into their own allocations; larger
/// ones share the packed buffer.
const SHARE_FROM: usize = 1024;

/// A run of encoded elements (see the module docs). Invariants: the lengths add up to the
/// buffer's length, and `payloads` is empty or has one entry per element.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Packed {
    packed: Bytes,
    lengths: Vec<u64>,
    payloads: Vec<Bytes>,
}

impl Packed {
    /// Checks the invariants, so a garbage message is an error and never a panic.
    pub fn from_parts(
        packed: Bytes,
        lengths: Vec<u64>,
        payloads: Vec<Bytes>,
    ) -> Result<Packed, DatasetError> {
        let total = lengths
            .iter()
            .try_fold(0u64, |sum, &len| sum.checked_add(len));
        if total != Some(packed.len() as u64) {
            return Err(DatasetError::Codec(format!(
                "element lengths do not add up to the {} packed bytes",
                packed.len()
            )));
        }
        if !payloads.is_empty() && payloads.len() != lengths.len() {
            return Err(DatasetError::Codec(format!(
                "{} elements and {} payloads",
                lengths.len(),
                payloads.len()
            )));
        }
        Ok(Packed {
            packed,
            lengths,
            payloads,
        })
    }

    pub fn into_parts(self) -> (Bytes, Vec<u64>, Vec<Bytes>) {
        (self.packed, self.lengths, self.payloads)
    }

    /// Like [`Packed::from_parts`], with the lengths in their compact wire form: when
    /// `each_length` is not 0 and `lengths` is empty, every element is `each_length` bytes.
    pub fn from_wire(
        packed: Bytes,
        lengths: Vec<u64>,
        each_length: u64,
        payloads: Vec<Bytes>,
    ) -> Result<Packed, DatasetError> {
        if each_length == 0 || !lengths.is_empty() {
            return Packed::from_parts(packed, lengths, payloads);
        }
        // At most one element per byte, so a hostile count cannot make a huge allocation.
        let count = packed.len() as u64 / each_length;
        Packed::from_parts(packed, vec![each_length; count as usize], payloads)
    }

    /// The parts in their compact wire form (see [`Packed::from_wire`]): `(packed, lengths,
    /// each_length, payloads)`.
    pub fn into_wire(self) -> (Bytes, Vec<u64>, u64, Vec<Bytes>) {
        match self.lengths.split_first() {
            Some((&first, rest)) if first > 0 && rest.iter().all(|&len| len == first) => {
                (self.packed, Vec::new(), first, self.payloads)
            }
            _ => (self.packed, self.lengths, 0, self.payloads),
        }
    }

    /// The elements of `runs`, in order, in one buffer (one copy of each).
    pub fn concat(runs: Vec<Packed>) -> Packed {
        if runs.len() <= 1 {
            return runs.into_iter().next().unwrap_or_default();
        }
        let bytes = runs.iter().map(|r| r.packed.len()).sum();
        let count = runs.iter().map(Packed::len).sum();
        let any_payloads = runs.iter().any(|r| !r.payloads.is_empty());
        let mut packed = BytesMut::with_capacity(bytes);
        let mut lengths = Vec::with_capacity(count);
        let mut payloads = Vec::with_capacity(if any_payloads { count } else { 0 });
        for run in runs {
            packed.extend_from_slice(&run.packed);
            if any_payloads {
                let n = run.len();
                if run.payloads.is_empty() {
                    payloads.resize(payloads.len() + n, Bytes::new());
                } else {
                    payloads.extend(run.payloads);
                }
            }
            lengths.extend(run.lengths);
        }
        Packed {
            packed: packed.freeze(),
            lengths,
            payloads,
        }
    }

    /// Elements.
    #[inline]
    pub fn len(&self) -> usize {
        self.lengths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lengths.is_empty()
    }

    /// Encoded bytes of every element, payloads included.
    pub fn byte_len(&self) -> usize {
        self.packed.len() + self.payloads.iter().map(Bytes::len).sum::<usize>()
    }

    /// Splits off the first `n` elements (all of them when there are fewer).
    pub fn split_to(&mut self, n: usize) -> Packed {
        if n >= self.len() {
            return std::mem::take(self);
        }
        let bytes: u64 = self.lengths[..n].iter().sum();
        let rest = self.lengths.split_off(n);
        let lengths = std::mem::replace(&mut self.lengths, rest);
        let payloads = if self.payloads.is_empty() {
            Vec::new()
        } else {
            let rest = self.payloads.split_off(n);
            std::mem::replace(&mut self.payloads, rest)
        };
        Packed {
            packed: self.packed.split_to(bytes as usize),
            lengths,
            payloads,
        }
    }

    /// Each element's encoding as (head, payload) slices of the buffers; the payload is empty
    /// unless a large tensor's data travels apart.
    pub fn encoded(&self) -> impl Iterator<Item = (Bytes, Bytes)> + '_ {
        let mut offset = 0usize;
        self.lengths.iter().enumerate().map(move |(i, &len)| {
            let head = self.packed.slice(offset..offset + len as usize);
            offset += len as usize;
            (head, self.payloads.get(i).cloned().unwrap_or_default())
        })
    }

    /// Decodes the elements one at a time, as they are taken.
    pub fn into_decoder(self) -> PackedDecoder {
        PackedDecoder {
            packed: self,
            next: 0,
            offset: 0,
            error: None,
        }
    }
}

/// Decodes a `Packed` run front to back.
#[derive(Debug, Default)]
pub struct PackedDecoder {
    packed: Packed,
    next: usize,
    offset: usize,
    /// Why the last element `next_element` skipped did not decode.
    error: Option<DatasetError>,
}

impl PackedDecoder {
    /// Elements not decoded yet.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.packed.len() - self.next
    }

    /// The next element; `None` at the end, or when the next element does not decode, which
    /// [`PackedDecoder::take_error`] then returns (the run goes on after it, as `next` does).
    ///
    /// For a reading loop: inlined, a numeric scalar is decoded right here, and the element is
    /// not wrapped in a `Result` on its way out. Each wrapper layer moved the element once more,
    /// and those moves were a third of a tiny element's cost on the reading thread.
    #[inline]
    pub fn next_element(&mut self) -> Option<Element> {
        let len = *self.packed.lengths.get(self.next)? as usize;
        let range = self.offset..self.offset + len;
        self.next += 1;
        self.offset += len;
        if self.packed.payloads.is_empty() {
            if let Some(scalar) = self
                .packed
                .packed
                .get(range.clone())
                .and_then(decode_scalar)
            {
                return Some(scalar);
            }
        }
        self.decode(range)
    }

    /// Why the element `next_element` last skipped did not decode.
    pub fn take_error(&mut self) -> Option<DatasetError> {
        self.error.take()
    }

    /// The element at `range` of the packed buffer (the `next`-th), in general.
    #[inline(never)]
    fn decode(&mut self, range: std::ops::Range<usize>) -> Option<Element> {
        let Packed {
            packed, payloads, ..
        } = &mut self.packed;
        // Taken, not cloned: each element is decoded once, and a tensor holding the only
        // reference to its data may hand it on without a copy (to numpy, writable).
        let payload = payloads
            .get_mut(self.next - 1)
            .map(std::mem::take)
            .filter(|p| !p.is_empty());
        let decoded = match payload {
            Some(payload) => decode_element_parts(packed.slice(range), payload),
            None if range.len() < SHARE_FROM => decode_element(&packed[range]),
            None => decode_element_bytes(packed.slice(range)),
        };
        decoded.map_err(|e| self.error = Some(e)).ok()
    }
}

impl Iterator for PackedDecoder {
    type Item = Result<Element, DatasetError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match self.next_element() {
            Some(element) => Some(Ok(element)),
            None => self.take_error().map(Err),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining(), Some(self.remaining()))
    }
}

impl ExactSizeIterator for PackedDecoder {}

/// Builds a `Packed` run one element at a time.
#[derive(Debug, Default)]
pub struct PackedBuilder {
    packed: BytesMut,
    lengths: Vec<u64>,
    payloads: Vec<Bytes>,
}

impl PackedBuilder {
    /// Appends an element given as its encoding (`head`, then `payload`, which is empty unless a
    /// large tensor's data travels apart). Returns the element's encoded size.
    pub fn push_encoded(&mut self, head: &[u8], payload: Bytes) -> usize {
        self.reserve(head.len());
        self.packed.extend_from_slice(head);
        self.add(head.len(), payload)
    }

    /// Encodes and appends an element. Returns its encoded size.
    pub fn push(&mut self, element: &Element, compression: Compression) -> usize {
        let start = self.packed.len();
        self.reserve(0);
        let payload = encode_element_append(element, compression, &mut self.packed);
        self.add(self.packed.len() - start, payload.unwrap_or_default())
    }

    /// Room for at least `n` more bytes, in steps of at least 64 KiB, so a run of tiny elements
    /// grows its buffer rarely.
    fn reserve(&mut self, n: usize) {
        if self.packed.capacity() - self.packed.len() < n.max(1024) {
            self.packed.reserve(n.max(64 << 10));
        }
    }

    fn add(&mut self, len: usize, payload: Bytes) -> usize {
        let size = len + payload.len();
        if !payload.is_empty() || !self.payloads.is_empty() {
            // Whole elements before the first one with a payload get empty ones.
            self.payloads.resize(self.lengths.len(), Bytes::new());
            self.payloads.push(payload);
        }
        self.lengths.push(len as u64);
        size
    }

    pub fn len(&self) -> usize {
        self.lengths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lengths.is_empty()
    }

    /// Encoded bytes so far, payloads included.
    pub fn byte_len(&self) -> usize {
        self.packed.len() + self.payloads.iter().map(Bytes::len).sum::<usize>()
    }

    /// The elements so far as a `Packed` run; the builder starts over (keeping its spare room).
    pub fn finish(&mut self) -> Packed {
        Packed {
            packed: self.packed.split().freeze(),
            lengths: std::mem::take(&mut self.lengths),
            payloads: std::mem::take(&mut self.payloads),
        }
    }
}

#[cfg(test)]
#[path = "packed_tests.rs"]
mod tests;

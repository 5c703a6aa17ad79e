//! Tensors of a definition whose data is kept outside it, as content-addressed blobs.
//!
//! A definition is replicated through the dispatchers' Raft log, so its size is bounded; the
//! constants a pipeline starts from (`from_tensor_slices` of an in-memory array, `from_tensors`,
//! a padding or default value) need not be. A client moves the data of every numeric tensor
//! larger than a threshold out of the definition it registers ([`extract`]): the tensor keeps its
//! dtype and shape, its `data` becomes empty, and `blob_digest` (the SHA-256 of the data) and
//! `blob_len` name the bytes, which the client uploads on their own. A worker puts the bytes back
//! before it builds the pipeline ([`fill`]), each checked against its digest where it came from
//! (fetched, or read from the worker's cache).
//!
//! [`visit`] and [`visit_mut`] reach every `TensorProto` a definition holds, in the definitions
//! nested in it too (zip, sample and choose inputs, `concatenate`, `interleave` and
//! `group_by_window` templates), so the three agree on which tensors a definition has.

use crate::pb;
use crate::DatasetError;
use bytes::Bytes;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// The length of a blob's digest (SHA-256).
pub const DIGEST_LEN: usize = 32;

/// A blob's digest.
pub type BlobDigest = [u8; DIGEST_LEN];

/// The digest of `data`.
pub fn digest(data: &[u8]) -> BlobDigest {
    #[cfg(test)]
    tests::HASHED.with(|n| n.set(n.get() + 1));
    Sha256::digest(data).into()
}

/// Buffers that remember their digest once it is computed, by the address of their data: a
/// definition registered again (each `distribute` or `register_dataset` of the same dataset,
/// often one per epoch in a training loop) names the same buffers, and [`extract`] then does
/// not hash them again. An entry is only a weak reference, removed when its buffer is freed,
/// so no buffer is kept alive by it and no other data can be taken for it at the same address.
static REMEMBERING: Mutex<BTreeMap<usize, Weak<Remembering>>> = Mutex::new(BTreeMap::new());

struct Remembering {
    data: Vec<u8>,
    digest: OnceLock<BlobDigest>,
}

impl Drop for Remembering {
    fn drop(&mut self) {
        if let Ok(mut buffers) = REMEMBERING.lock() {
            buffers.remove(&(self.data.as_ptr() as usize));
        }
    }
}

/// The owner of a remembering buffer's `Bytes`.
struct RememberingOwner(Arc<Remembering>);

impl AsRef<[u8]> for RememberingOwner {
    fn as_ref(&self) -> &[u8] {
        &self.0.data
    }
}

/// A copy of `data` in a buffer that remembers its digest once [`extract`] computes it (see
/// `REMEMBERING`): for the large arrays a user's definition starts from, copied in once and
/// perhaps registered many times.
pub fn remembering_digest(data: &[u8]) -> Bytes {
    let buffer = Arc::new(Remembering {
        data: data.to_vec(),
        digest: OnceLock::new(),
    });
    if let Ok(mut buffers) = REMEMBERING.lock() {
        buffers.insert(buffer.data.as_ptr() as usize, Arc::downgrade(&buffer));
    }
    Bytes::from_owner(RememberingOwner(buffer))
}

/// The digest of `data`, computed once per remembering buffer (see [`remembering_digest`]).
fn digest_of(data: &Bytes) -> BlobDigest {
    let remembered = REMEMBERING
        .lock()
        .ok()
        .and_then(|buffers| buffers.get(&(data.as_ptr() as usize))?.upgrade());
    match remembered {
        // The whole live buffer: no other bytes can be at its address while it lives.
        Some(buffer) if buffer.data.len() == data.len() => {
            *buffer.digest.get_or_init(|| digest(&buffer.data))
        }
        _ => digest(data),
    }
}

/// `bytes` in lowercase hex (how a digest is named in errors and file names).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The digest `bytes` holds, or an error naming what is wrong with it.
pub fn digest_from(bytes: &[u8]) -> Result<BlobDigest, DatasetError> {
    BlobDigest::try_from(bytes).map_err(|_| {
        DatasetError::invalid(format!(
            "a blob digest is {DIGEST_LEN} bytes (SHA-256), got {}",
            bytes.len()
        ))
    })
}

/// Calls `f` on every tensor of `def`, nested definitions included.
pub fn visit(def: &pb::DatasetDef, f: &mut dyn FnMut(&pb::TensorProto)) {
    // A clone-free read-only walk: the same traversal as `visit_mut`, over shared references.
    use pb::op::Kind as OpKind;
    use pb::source::Kind as SourceKind;
    fn structure(s: &pb::SlicesStructure, f: &mut dyn FnMut(&pb::TensorProto)) {
        use pb::slices_structure::Kind;
        match &s.kind {
            Some(Kind::Tensor(t)) => f(t),
            Some(Kind::Tuple(list)) => list.items.iter().for_each(|i| structure(i, f)),
            Some(Kind::Dict(dict)) => dict
                .fields
                .iter()
                .filter_map(|n| n.value.as_ref())
                .for_each(|v| structure(v, f)),
            None => {}
        }
    }
    match def.source.as_ref().and_then(|s| s.kind.as_ref()) {
        Some(SourceKind::Slices(s)) => {
            if let Some(t) = &s.tensor {
                f(t);
            }
            if let Some(st) = &s.structure {
                structure(st, f);
            }
        }
        Some(SourceKind::Tensors(t)) => {
            if let Some(v) = &t.value {
                structure(v, f);
            }
        }
        Some(SourceKind::Zip(z)) => z.inputs.iter().for_each(|d| visit(d, f)),
        Some(SourceKind::Sample(s)) => s.inputs.iter().for_each(|d| visit(d, f)),
        Some(SourceKind::Choose(c)) => c.inputs.iter().chain(&c.choice).for_each(|d| visit(d, f)),
        _ => {}
    }
    for op in &def.ops {
        match &op.kind {
            Some(OpKind::PaddedBatch(p)) => p.padding_values.iter().for_each(&mut *f),
            Some(OpKind::ParseExample(p)) => p
                .features
                .iter()
                .filter_map(|s| s.default_value.as_ref())
                .for_each(&mut *f),
            Some(OpKind::Concatenate(c)) => {
                if let Some(d) = &c.other {
                    visit(d, f);
                }
            }
            Some(OpKind::Interleave(i)) => {
                if let Some(d) = &i.template {
                    visit(d, f);
                }
            }
            Some(OpKind::GroupByWindow(g)) => {
                if let Some(d) = &g.reduce {
                    visit(d, f);
                }
            }
            _ => {}
        }
    }
}

/// Calls `f` on every tensor of `def`, nested definitions included, with leave to change it.
pub fn visit_mut(def: &mut pb::DatasetDef, f: &mut dyn FnMut(&mut pb::TensorProto)) {
    use pb::op::Kind as OpKind;
    use pb::source::Kind as SourceKind;
    fn structure(s: &mut pb::SlicesStructure, f: &mut dyn FnMut(&mut pb::TensorProto)) {
        use pb::slices_structure::Kind;
        match &mut s.kind {
            Some(Kind::Tensor(t)) => f(t),
            Some(Kind::Tuple(list)) => list.items.iter_mut().for_each(|i| structure(i, f)),
            Some(Kind::Dict(dict)) => dict
                .fields
                .iter_mut()
                .filter_map(|n| n.value.as_mut())
                .for_each(|v| structure(v, f)),
            None => {}
        }
    }
    match def.source.as_mut().and_then(|s| s.kind.as_mut()) {
        Some(SourceKind::Slices(s)) => {
            if let Some(t) = &mut s.tensor {
                f(t);
            }
            if let Some(st) = &mut s.structure {
                structure(st, f);
            }
        }
        Some(SourceKind::Tensors(t)) => {
            if let Some(v) = &mut t.value {
                structure(v, f);
            }
        }
        Some(SourceKind::Zip(z)) => z.inputs.iter_mut().for_each(|d| visit_mut(d, f)),
        Some(SourceKind::Sample(s)) => s.inputs.iter_mut().for_each(|d| visit_mut(d, f)),
        Some(SourceKind::Choose(c)) => c
            .inputs
            .iter_mut()
            .chain(c.choice.iter_mut())
            .for_each(|d| visit_mut(d, f)),
        _ => {}
    }
    for op in &mut def.ops {
        match &mut op.kind {
            Some(OpKind::PaddedBatch(p)) => p.padding_values.iter_mut().for_each(&mut *f),
            Some(OpKind::ParseExample(p)) => p
                .features
                .iter_mut()
                .filter_map(|s| s.default_value.as_mut())
                .for_each(&mut *f),
            Some(OpKind::Concatenate(c)) => {
                if let Some(d) = &mut c.other {
                    visit_mut(d, f);
                }
            }
            Some(OpKind::Interleave(i)) => {
                if let Some(d) = &mut i.template {
                    visit_mut(d, f);
                }
            }
            Some(OpKind::GroupByWindow(g)) => {
                if let Some(d) = &mut g.reduce {
                    visit_mut(d, f);
                }
            }
            _ => {}
        }
    }
}

/// The blobs `def` names, digest to length (a digest named twice with two lengths is an
/// error, as is a digest that is not 32 bytes).
pub fn digests(def: &pb::DatasetDef) -> Result<BTreeMap<BlobDigest, u64>, DatasetError> {
    let mut found = BTreeMap::new();
    let mut error = None;
    visit(def, &mut |t| {
        if t.blob_digest.is_empty() || error.is_some() {
            return;
        }
        match digest_from(&t.blob_digest) {
            Ok(d) => {
                let len = *found.entry(d).or_insert(t.blob_len);
                if len != t.blob_len {
                    error = Some(DatasetError::invalid(format!(
                        "blob {} is named with two lengths, {len} and {} bytes",
                        hex(&d),
                        t.blob_len
                    )));
                }
            }
            Err(e) => error = Some(e),
        }
    });
    match error {
        Some(e) => Err(e),
        None => Ok(found),
    }
}

/// Moves the data of every numeric tensor of `def` longer than `threshold` bytes into a blob:
/// the tensor keeps its dtype and shape and names the blob instead. Returns the blobs, each
/// once (two equal tensors share one).
pub fn extract(def: &mut pb::DatasetDef, threshold: usize) -> BTreeMap<BlobDigest, Bytes> {
    let mut blobs = BTreeMap::new();
    visit_mut(def, &mut |t| {
        if t.data.len() <= threshold || !t.blob_digest.is_empty() {
            return;
        }
        let data = std::mem::take(&mut t.data);
        let d = digest_of(&data);
        t.blob_digest = d.to_vec();
        t.blob_len = data.len() as u64;
        blobs.entry(d).or_insert(data);
    });
    blobs
}

/// Puts the data of every blob `def` names back into its tensors: `blob(digest, len)` gives the
/// bytes, which must be `len` long. They are not hashed here: `blob` gives bytes it has checked
/// against `digest` (a fetch checks what it received, the worker's cache what it reads, unless
/// it checked the same unchanged file before), so a blob read at each task start is not
/// hashed each time.
pub fn fill(
    def: &mut pb::DatasetDef,
    blob: &mut dyn FnMut(&BlobDigest, u64) -> Result<Bytes, DatasetError>,
) -> Result<(), DatasetError> {
    let mut error = None;
    visit_mut(def, &mut |t| {
        if t.blob_digest.is_empty() || error.is_some() {
            return;
        }
        let filled = digest_from(&t.blob_digest).and_then(|d| {
            let data = blob(&d, t.blob_len)?;
            if data.len() as u64 != t.blob_len {
                return Err(DatasetError::invalid(format!(
                    "blob {} does not hold the {} bytes its digest names",
                    hex(&d),
                    t.blob_len
                )));
            }
            Ok(data)
        });
        match filled {
            Ok(data) => {
                t.data = data;
                t.blob_digest.clear();
                t.blob_len = 0;
            }
            Err(e) => error = Some(e),
        }
    });
    match error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Tensor};
    use std::cell::Cell;

    thread_local! {
        /// Buffers this thread hashed.
        pub(super) static HASHED: Cell<usize> = const { Cell::new(0) };
    }

    fn hashed() -> usize {
        HASHED.with(Cell::get)
    }

    #[test]
    fn a_remembering_buffer_is_hashed_once_however_often_it_is_extracted() {
        let data: Vec<u8> = (0..100_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let tensor = Tensor::from_raw(DType::UInt32, vec![100_000], remembering_digest(&data))
            .expect("a tensor");
        let def = slices(vec![tensor.clone()]);
        let before = hashed();
        for _ in 0..3 {
            let blobs = extract(&mut def.clone(), 64);
            assert_eq!(blobs.keys().copied().collect::<Vec<_>>(), [digest(&data)]);
        }
        assert_eq!(
            hashed() - before,
            1 + 3,
            "once by extract, and once for each assert"
        );

        // A part of the buffer is other bytes: hashed each time, and right.
        let part = slices(vec![tensor.slice(0).expect("a row")]);
        let before = hashed();
        for _ in 0..2 {
            let blobs = extract(&mut part.clone(), 0);
            assert_eq!(
                blobs.keys().copied().collect::<Vec<_>>(),
                [digest(&data[..4])]
            );
        }
        assert_eq!(hashed() - before, 2 * 2);
    }

    #[test]
    fn a_freed_buffer_is_forgotten_and_its_address_taken_by_other_bytes_is_hashed() {
        let at = |b: &Bytes| b.as_ptr() as usize;
        let first = remembering_digest(&[1; 4096]);
        let address = at(&first);
        let digest_first = digest_of(&first);
        assert_eq!(digest_first, digest(&[1; 4096]));
        assert!(REMEMBERING.lock().unwrap().contains_key(&address));
        drop(first);
        assert!(!REMEMBERING.lock().unwrap().contains_key(&address));
        // Whatever address the next buffer gets (often the same), its digest is its own.
        let second = remembering_digest(&[2; 4096]);
        assert_eq!(digest_of(&second), digest(&[2; 4096]));
        assert_ne!(digest_of(&second), digest_first);
    }

    fn slices(tensors: Vec<Tensor>) -> pb::DatasetDef {
        let items = tensors
            .into_iter()
            .map(|t| pb::SlicesStructure {
                kind: Some(pb::slices_structure::Kind::Tensor(t.to_proto())),
            })
            .collect();
        pb::DatasetDef {
            source: Some(pb::Source {
                kind: Some(pb::source::Kind::Slices(pb::SlicesSource {
                    tensor: None,
                    structure: Some(pb::SlicesStructure {
                        kind: Some(pb::slices_structure::Kind::Tuple(pb::SlicesList { items })),
                    }),
                })),
            }),
            ..Default::default()
        }
    }

    fn floats(n: usize, v: f32) -> Tensor {
        Tensor::from_raw(
            DType::Float32,
            vec![n],
            Bytes::from(
                std::iter::repeat_n(v.to_le_bytes(), n)
                    .flatten()
                    .collect::<Vec<u8>>(),
            ),
        )
        .unwrap()
    }

    #[test]
    fn extract_moves_large_tensors_and_fill_restores_them() {
        let original = slices(vec![floats(1000, 1.0), floats(2, 2.0), floats(1000, 1.0)]);
        let mut def = original.clone();
        let blobs = extract(&mut def, 64);
        // Two equal large tensors share one blob; the small one stays inline.
        assert_eq!(blobs.len(), 1);
        let named = digests(&def).unwrap();
        assert_eq!(named.len(), 1);
        let (d, len) = named.iter().next().unwrap();
        assert_eq!(*len, 4000);
        assert_eq!(blobs[d].len(), 4000);
        assert_ne!(def, original);
        let mut refilled = def.clone();
        fill(&mut refilled, &mut |d, _| Ok(blobs[d].clone())).unwrap();
        assert_eq!(refilled, original);
    }

    #[test]
    fn fill_refuses_bytes_of_another_length() {
        let mut def = slices(vec![floats(100, 3.0)]);
        extract(&mut def, 16);
        for len in [3, 399, 401] {
            let wrong = Bytes::from(vec![0u8; len]);
            let err = fill(&mut def.clone(), &mut |_, _| Ok(wrong.clone())).unwrap_err();
            assert!(err.to_string().contains("does not hold"), "{len}: {err}");
        }
    }

    #[test]
    fn an_unfilled_blob_tensor_does_not_decode() {
        let mut def = slices(vec![floats(100, 3.0)]);
        extract(&mut def, 16);
        let mut found = None;
        visit(&def, &mut |t| found = Some(t.clone()));
        let err = Tensor::from_proto(&found.unwrap()).unwrap_err();
        assert!(err.to_string().contains("not fetched"), "{err}");
    }

    #[test]
    fn a_malformed_digest_is_refused() {
        let mut def = slices(vec![floats(100, 3.0)]);
        visit_mut(&mut def, &mut |t| {
            t.blob_digest = vec![1, 2, 3];
            t.blob_len = 400;
            t.data.clear();
        });
        assert!(digests(&def).is_err());
    }
}

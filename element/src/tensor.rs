//! `Tensor`: a dense n-dimensional array, the leaf of every element.
//!
//! Numeric data is kept as little-endian bytes in a `bytes::Bytes`, so slicing a source tensor
//! (from_slices) and decoding an element off the wire share the buffer instead of copying it.
//! Strings are one `Bytes` per element, row-major. Invariant (checked by every constructor):
//! the data length matches the shape exactly.

use bytes::Bytes;

use crate::dtype::DType;
use crate::error::DatasetError;
use crate::pb;

/// The payload of a tensor; which variant is fixed by the dtype.
#[derive(Debug, Clone, PartialEq)]
enum Data {
    /// `num_elements * dtype.size()` little-endian bytes.
    Raw(Bytes),
    /// `num_elements` byte strings.
    Strings(Vec<Bytes>),
}

/// A dense tensor with a dtype and a fully known shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    data: Data,
}

/// A Rust scalar type that a numeric or bool tensor can hold. Sealed: the set matches `DType`.
pub trait TensorValue: Copy + sealed::Sealed + Send + Sync + 'static {
    const DTYPE: DType;
    /// Reads one value from exactly `size` little-endian bytes.
    fn read_le(b: &[u8]) -> Self;
    fn write_le(self, out: &mut Vec<u8>);
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! tensor_value {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl TensorValue for $t {
            const DTYPE: DType = DType::$d;
            fn read_le(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_le_bytes(a)
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}

tensor_value!(i8 => Int8, i16 => Int16, i32 => Int32, i64 => Int64, u8 => UInt8, u16 => UInt16,
    u32 => UInt32, u64 => UInt64, f32 => Float32, f64 => Float64);

impl sealed::Sealed for bool {}
impl TensorValue for bool {
    const DTYPE: DType = DType::Bool;
    fn read_le(b: &[u8]) -> Self {
        b[0] != 0
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
}

/// Product of the dims, or an error on overflow.
pub(crate) fn checked_num_elements(shape: &[usize]) -> Result<usize, DatasetError> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| DatasetError::invalid(format!("shape {shape:?} has too many elements")))
}

/// The scalar constructors are `#[inline]`: sources call them once per element from other
/// crates, and out of line the tensor comes back through the stack in stores that the caller's
/// wider loads must wait for (measured: the local executor's `range` at half its rate).
impl Tensor {
    #[inline]
    pub fn scalar_i64(v: i64) -> Tensor {
        Tensor::scalar(v)
    }

    #[inline]
    pub fn scalar_f64(v: f64) -> Tensor {
        Tensor::scalar(v)
    }

    #[inline]
    pub fn scalar_bool(v: bool) -> Tensor {
        Tensor::scalar(v)
    }

    pub fn scalar_string(b: impl Into<Bytes>) -> Tensor {
        Tensor {
            dtype: DType::String,
            shape: Vec::new(),
            data: Data::Strings(vec![b.into()]),
        }
    }

    /// A rank-0 tensor of any numeric or bool type.
    #[inline]
    pub fn scalar<T: TensorValue>(v: T) -> Tensor {
        let mut out = Vec::with_capacity(8);
        v.write_le(&mut out);
        Tensor {
            dtype: T::DTYPE,
            shape: Vec::new(),
            data: Data::Raw(Bytes::from(out)),
        }
    }

    /// A rank-0 numeric tensor over `data`, which the caller checked is `dtype.size()` bytes.
    pub(crate) fn scalar_raw(dtype: DType, data: Bytes) -> Tensor {
        debug_assert_eq!(dtype.size(), Some(data.len()));
        Tensor {
            dtype,
            shape: Vec::new(),
            data: Data::Raw(data),
        }
    }

    /// A tensor of `shape` from row-major values; the count must match the shape.
    pub fn from_values<T: TensorValue>(
        shape: Vec<usize>,
        values: &[T],
    ) -> Result<Tensor, DatasetError> {
        let n = checked_num_elements(&shape)?;
        if n != values.len() {
            return Err(DatasetError::invalid(format!(
                "shape {shape:?} needs {n} values, got {}",
                values.len()
            )));
        }
        let mut out = Vec::with_capacity(values.len() * T::DTYPE.size().unwrap_or(1));
        for v in values {
            v.write_le(&mut out);
        }
        Ok(Tensor {
            dtype: T::DTYPE,
            shape,
            data: Data::Raw(Bytes::from(out)),
        })
    }

    pub fn from_i64s(shape: Vec<usize>, v: &[i64]) -> Result<Tensor, DatasetError> {
        Tensor::from_values(shape, v)
    }

    pub fn from_f32s(shape: Vec<usize>, v: &[f32]) -> Result<Tensor, DatasetError> {
        Tensor::from_values(shape, v)
    }

    pub fn from_f64s(shape: Vec<usize>, v: &[f64]) -> Result<Tensor, DatasetError> {
        Tensor::from_values(shape, v)
    }

    /// A string tensor of `shape` from row-major byte strings.
    pub fn from_strings(shape: Vec<usize>, v: Vec<Bytes>) -> Result<Tensor, DatasetError> {
        let n = checked_num_elements(&shape)?;
        if n != v.len() {
            return Err(DatasetError::invalid(format!(
                "shape {shape:?} needs {n} strings, got {}",
                v.len()
            )));
        }
        Ok(Tensor {
            dtype: DType::String,
            shape,
            data: Data::Strings(v),
        })
    }

    /// A numeric or bool tensor over little-endian `data`, shared without copying. The length
    /// must be exactly `num_elements * dtype.size()`.
    pub fn from_raw(dtype: DType, shape: Vec<usize>, data: Bytes) -> Result<Tensor, DatasetError> {
        let Some(size) = dtype.size() else {
            return Err(DatasetError::invalid(
                "a string tensor has no raw byte form",
            ));
        };
        let n = checked_num_elements(&shape)?;
        if n.checked_mul(size) != Some(data.len()) {
            return Err(DatasetError::invalid(format!(
                "{dtype} tensor of shape {shape:?} needs {} bytes, got {}",
                n.saturating_mul(size),
                data.len()
            )));
        }
        Ok(Tensor {
            dtype,
            shape,
            data: Data::Raw(data),
        })
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The same values (shared, not copied) in another shape with as many elements.
    pub fn reshaped(&self, shape: &[usize]) -> Result<Tensor, DatasetError> {
        let n = checked_num_elements(shape)?;
        if n != self.num_elements() {
            return Err(DatasetError::invalid(format!(
                "cannot reshape {} values of shape {:?} to shape {shape:?} ({n} values)",
                self.num_elements(),
                self.shape
            )));
        }
        Ok(Tensor {
            dtype: self.dtype,
            shape: shape.to_vec(),
            data: self.data.clone(),
        })
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Product of the dims (1 for a scalar). Cannot overflow: it was checked at construction.
    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The little-endian bytes of a numeric or bool tensor; `None` for strings.
    pub fn raw_data(&self) -> Option<&Bytes> {
        match &self.data {
            Data::Raw(b) => Some(b),
            Data::Strings(_) => None,
        }
    }

    /// The byte strings of a string tensor; `None` otherwise.
    pub fn strings(&self) -> Option<&[Bytes]> {
        match &self.data {
            Data::Raw(_) => None,
            Data::Strings(s) => Some(s),
        }
    }

    /// The values as `T` if the dtype is exactly `T`'s.
    pub fn to_values<T: TensorValue>(&self) -> Option<Vec<T>> {
        if self.dtype != T::DTYPE {
            return None;
        }
        let raw = self.raw_data()?;
        let size = T::DTYPE.size()?;
        Some(raw.chunks_exact(size).map(T::read_le).collect())
    }

    /// Every element of an integer or bool tensor widened to `i64`; `None` for other dtypes or
    /// a `uint64` value above `i64::MAX`.
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        match self.dtype {
            DType::Bool => Some(
                self.to_values::<bool>()?
                    .into_iter()
                    .map(i64::from)
                    .collect(),
            ),
            DType::Int8 => Some(self.to_values::<i8>()?.into_iter().map(i64::from).collect()),
            DType::Int16 => Some(
                self.to_values::<i16>()?
                    .into_iter()
                    .map(i64::from)
                    .collect(),
            ),
            DType::Int32 => Some(
                self.to_values::<i32>()?
                    .into_iter()
                    .map(i64::from)
                    .collect(),
            ),
            DType::Int64 => self.to_values::<i64>(),
            DType::UInt8 => Some(self.to_values::<u8>()?.into_iter().map(i64::from).collect()),
            DType::UInt16 => Some(
                self.to_values::<u16>()?
                    .into_iter()
                    .map(i64::from)
                    .collect(),
            ),
            DType::UInt32 => Some(
                self.to_values::<u32>()?
                    .into_iter()
                    .map(i64::from)
                    .collect(),
            ),
            DType::UInt64 => self
                .to_values::<u64>()?
                .into_iter()
                .map(|v| i64::try_from(v).ok())
                .collect(),
            DType::Float32 | DType::Float64 | DType::String => None,
        }
    }

    /// Every element of a numeric or bool tensor as `f64` (64-bit integers may round).
    pub fn to_f64s(&self) -> Option<Vec<f64>> {
        match self.dtype {
            DType::Float32 => Some(
                self.to_values::<f32>()?
                    .into_iter()
                    .map(f64::from)
                    .collect(),
            ),
            DType::Float64 => self.to_values::<f64>(),
            DType::UInt64 => Some(
                self.to_values::<u64>()?
                    .into_iter()
                    .map(|v| v as f64)
                    .collect(),
            ),
            DType::String => None,
            _ => Some(self.to_i64s()?.into_iter().map(|v| v as f64).collect()),
        }
    }

    /// The value of an integer scalar of any width, widened.
    pub fn as_i64_scalar(&self) -> Option<i64> {
        if !self.shape.is_empty() || !self.dtype.is_integer() {
            return None;
        }
        self.to_i64s()?.first().copied()
    }

    /// Payload size in bytes (string lengths summed); what memory bounds are computed from.
    pub fn byte_size(&self) -> usize {
        match &self.data {
            Data::Raw(b) => b.len(),
            Data::Strings(s) => s.iter().map(Bytes::len).sum(),
        }
    }

    /// Row `index` along the first dimension, sharing the buffer.
    pub fn slice(&self, index: usize) -> Result<Tensor, DatasetError> {
        let Some((&dim0, rest)) = self.shape.split_first() else {
            return Err(DatasetError::invalid("cannot slice a scalar tensor"));
        };
        if index >= dim0 {
            return Err(DatasetError::invalid(format!(
                "index {index} out of range for dimension of size {dim0}"
            )));
        }
        let row: usize = rest.iter().product();
        let data = match &self.data {
            Data::Raw(b) => {
                let size = self.dtype.size().unwrap_or(1);
                Data::Raw(b.slice(index * row * size..(index + 1) * row * size))
            }
            Data::Strings(s) => Data::Strings(s[index * row..(index + 1) * row].to_vec()),
        };
        Ok(Tensor {
            dtype: self.dtype,
            shape: rest.to_vec(),
            data,
        })
    }

    /// Rows `start..end` along the first dimension, keeping it (`end - start` rows, possibly
    /// none), sharing the buffer. What splitting a batch between replicas is made of.
    pub fn rows(&self, start: usize, end: usize) -> Result<Tensor, DatasetError> {
        let Some((&dim0, rest)) = self.shape.split_first() else {
            return Err(DatasetError::invalid("cannot take rows of a scalar tensor"));
        };
        if start > end || end > dim0 {
            return Err(DatasetError::invalid(format!(
                "rows {start}..{end} out of range for dimension of size {dim0}"
            )));
        }
        let row: usize = rest.iter().product();
        let data = match &self.data {
            Data::Raw(b) => {
                let size = self.dtype.size().unwrap_or(1);
                Data::Raw(b.slice(start * row * size..end * row * size))
            }
            Data::Strings(s) => Data::Strings(s[start * row..end * row].to_vec()),
        };
        let mut shape = self.shape.clone();
        shape[0] = end - start;
        Ok(Tensor {
            dtype: self.dtype,
            shape,
            data,
        })
    }

    /// Stacks same-dtype, same-shape tensors along a new first dimension.
    ///
    /// One pass over the parts: each is checked and copied in the same loop (batching tiny
    /// elements is bound by this loop, so it avoids a second pass and slice comparisons).
    pub fn stack(parts: &[Tensor]) -> Result<Tensor, DatasetError> {
        let Some(first) = parts.first() else {
            return Err(DatasetError::invalid("cannot stack zero tensors"));
        };
        let same = |t: &Tensor| -> Result<(), DatasetError> {
            if t.dtype != first.dtype {
                return Err(DatasetError::invalid(format!(
                    "cannot batch elements with different dtypes: {} and {}",
                    first.dtype, t.dtype
                )));
            }
            // Scalars (rank 0) are the common case of tiny elements: no slice comparison.
            if t.shape.len() != first.shape.len() || (!t.shape.is_empty() && t.shape != first.shape)
            {
                return Err(DatasetError::invalid(format!(
                    "cannot batch elements with different shapes: {:?} and {:?}",
                    first.shape, t.shape
                )));
            }
            Ok(())
        };
        let mut shape = Vec::with_capacity(first.shape.len() + 1);
        shape.push(parts.len());
        shape.extend_from_slice(&first.shape);
        let data = match &first.data {
            Data::Raw(raw) => {
                let row = raw.len();
                let mut out = Vec::with_capacity(row * parts.len());
                for t in parts {
                    same(t)?;
                    match &t.data {
                        Data::Raw(b) => out.extend_from_slice(b),
                        Data::Strings(_) => unreachable!("same dtype, so raw data"),
                    }
                }
                Data::Raw(Bytes::from(out))
            }
            Data::Strings(_) => {
                let mut out = Vec::with_capacity(first.num_elements() * parts.len());
                for t in parts {
                    same(t)?;
                    out.extend(t.strings().unwrap_or(&[]).iter().cloned());
                }
                Data::Strings(out)
            }
        };
        Ok(Tensor {
            dtype: first.dtype,
            shape,
            data,
        })
    }

    pub fn to_proto(&self) -> pb::TensorProto {
        let (data, strings) = match &self.data {
            Data::Raw(b) => (b.clone(), Vec::new()),
            Data::Strings(s) => (Bytes::new(), s.iter().map(|b| b.to_vec()).collect()),
        };
        pb::TensorProto {
            dtype: pb::DType::from(self.dtype) as i32,
            shape: self.shape.iter().map(|&d| d as u64).collect(),
            data,
            strings,
            ..Default::default()
        }
    }

    /// Checks the dtype and that the payload length matches the shape.
    pub fn from_proto(p: &pb::TensorProto) -> Result<Tensor, DatasetError> {
        let dtype = DType::try_from(p.dtype)?;
        if !p.blob_digest.is_empty() && p.data.is_empty() {
            return Err(DatasetError::invalid(format!(
                "the tensor's {} bytes are in blob {}, which was not fetched into the definition",
                p.blob_len,
                crate::blob_tensors::hex(&p.blob_digest)
            )));
        }
        let shape = p
            .shape
            .iter()
            .map(|&d| {
                usize::try_from(d)
                    .map_err(|_| DatasetError::invalid(format!("dimension {d} is too large")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if dtype == DType::String {
            if !p.data.is_empty() {
                return Err(DatasetError::invalid(
                    "string tensor must not carry raw data",
                ));
            }
            Tensor::from_strings(
                shape,
                p.strings
                    .iter()
                    .map(|s| Bytes::copy_from_slice(s))
                    .collect(),
            )
        } else {
            if !p.strings.is_empty() {
                return Err(DatasetError::invalid(format!(
                    "{dtype} tensor must not carry strings"
                )));
            }
            // The definition's bytes, shared (a large constant is not copied per use).
            Tensor::from_raw(dtype, shape, p.data.clone())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_check_the_shape() {
        let t = Tensor::from_i64s(vec![2, 3], &[1, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(t.num_elements(), 6);
        assert_eq!(t.byte_size(), 48);
        assert!(Tensor::from_i64s(vec![2, 2], &[1, 2, 3]).is_err());
        assert!(Tensor::from_raw(DType::Float32, vec![3], Bytes::from_static(&[0; 11])).is_err());
        assert_eq!(Tensor::scalar_i64(7).num_elements(), 1);
    }

    #[test]
    fn slices_and_stacks() {
        let t = Tensor::from_i64s(vec![2, 3], &[1, 2, 3, 4, 5, 6]).unwrap();
        let row = t.slice(1).unwrap();
        assert_eq!(row.shape(), &[3]);
        assert_eq!(row.to_values::<i64>().unwrap(), vec![4, 5, 6]);
        assert!(t.slice(2).is_err());
        let stacked = Tensor::stack(&[t.slice(0).unwrap(), row]).unwrap();
        assert_eq!(stacked, t);
        let err = Tensor::stack(&[Tensor::scalar_i64(1), t.clone()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot batch elements with different shapes: [] and [2, 3]"
        );
    }

    #[test]
    fn rows_keep_the_first_dimension() {
        let t = Tensor::from_i64s(vec![3, 2], &[1, 2, 3, 4, 5, 6]).unwrap();
        let r = t.rows(1, 3).unwrap();
        assert_eq!(r.shape(), &[2, 2]);
        assert_eq!(r.to_values::<i64>().unwrap(), vec![3, 4, 5, 6]);
        let empty = t.rows(3, 3).unwrap();
        assert_eq!(empty.shape(), &[0, 2]);
        assert_eq!(empty.byte_size(), 0);
        assert_eq!(t.rows(0, 3).unwrap(), t);
        assert!(t.rows(2, 4).is_err());
        assert!(t.rows(2, 1).is_err());
        assert!(Tensor::scalar_i64(1).rows(0, 0).is_err());
        let s = Tensor::from_strings(vec![3], vec!["a".into(), "b".into(), "c".into()]).unwrap();
        assert_eq!(
            s.rows(2, 3).unwrap().strings().unwrap(),
            &[Bytes::from("c")]
        );
    }

    #[test]
    fn widening_and_scalars() {
        assert_eq!(Tensor::scalar(7u8).as_i64_scalar(), Some(7));
        assert_eq!(Tensor::scalar(-3i16).as_i64_scalar(), Some(-3));
        assert_eq!(Tensor::scalar(u64::MAX).as_i64_scalar(), None);
        assert_eq!(Tensor::scalar_f64(1.0).as_i64_scalar(), None);
        assert_eq!(
            Tensor::from_i64s(vec![1], &[1]).unwrap().as_i64_scalar(),
            None
        );
    }

    #[test]
    fn proto_round_trip_and_validation() {
        for t in [
            Tensor::from_f32s(vec![2], &[1.5, -2.0]).unwrap(),
            Tensor::from_strings(vec![2], vec![Bytes::from("a"), Bytes::from("")]).unwrap(),
            Tensor::scalar(true),
        ] {
            assert_eq!(Tensor::from_proto(&t.to_proto()).unwrap(), t);
        }
        let mut p = Tensor::from_i64s(vec![3], &[1, 2, 3]).unwrap().to_proto();
        p.data.truncate(p.data.len() - 1);
        assert!(Tensor::from_proto(&p).is_err());
        p.dtype = 0;
        assert!(Tensor::from_proto(&p).is_err());
        let p = pb::TensorProto {
            dtype: pb::DType::String as i32,
            shape: vec![2],
            strings: vec![b"x".to_vec()],
            ..Default::default()
        };
        assert!(Tensor::from_proto(&p).is_err());
    }
}

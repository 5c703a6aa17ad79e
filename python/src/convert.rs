//! Conversions between Sluice's values and Python's: elements to numpy (scalars as numpy
//! scalars, tensors as arrays, strings as `bytes`, tuples and dicts kept), numpy data to
//! tensors, and element specs to `sluice.data.TensorSpec` structures.
//!
//! A numeric tensor of at least `ZERO_COPY_MIN_BYTES` becomes an array over the received buffer,
//! kept alive by a `TensorBuffer`; the array is writable when the buffer was the tensor's alone,
//! read-only when other values still share it. So does one of at least `OWN_BUFFER_MIN_BYTES`
//! whose buffer is its own (writable). Other tensors are copied: holding a small view would keep
//! a whole received chunk alive.

use bytes::{Bytes, BytesMut};
use numpy::ndarray::{ArrayD, IxDyn};
use numpy::npyffi::{self, PY_ARRAY_API};
use numpy::{
    Element as NumpyElement, IntoPyArray, PyArray, PyArrayDescrMethods, PyArrayMethods,
    PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use sluice_element::{blob_tensors, DType, Element, ElementSpec, Tensor, TensorValue};

use crate::errors::{dataset_error, invalid_argument};

/// Tensors at least this large (in bytes) are handed to numpy without a copy.
pub const ZERO_COPY_MIN_BYTES: usize = 64 * 1024;

/// Tensors at least this large whose data is a buffer of their own (a payload received apart
/// from its batch) are handed to numpy without a copy, and writable: nothing else is kept alive
/// by the array. Smaller ones, and those sharing a buffer under `ZERO_COPY_MIN_BYTES`, are copied.
const OWN_BUFFER_MIN_BYTES: usize = 16 * 1024;

/// Owns the bytes a zero-copy array points into.
#[pyclass(frozen, module = "sluice._native")]
pub struct TensorBuffer {
    data: Buffer,
}

enum Buffer {
    /// Shared with other values: the array over it is read-only.
    Shared(Bytes),
    /// The tensor's alone: the array over it may be written.
    Unique(BytesMut),
}

#[pymethods]
impl TensorBuffer {
    fn __len__(&self) -> usize {
        match &self.data {
            Buffer::Shared(b) => b.len(),
            Buffer::Unique(b) => b.len(),
        }
    }

    fn __repr__(&self) -> String {
        format!("TensorBuffer({} bytes)", self.__len__())
    }
}

pub fn element_to_py(py: Python<'_>, element: Element) -> PyResult<Bound<'_, PyAny>> {
    match element {
        Element::Tensor(t) => tensor_to_py(py, t),
        Element::Tuple(items) => {
            let items = items
                .into_iter()
                .map(|e| element_to_py(py, e))
                .collect::<PyResult<Vec<_>>>()?;
            Ok(PyTuple::new(py, items)?.into_any())
        }
        Element::Dict(fields) => {
            let dict = PyDict::new(py);
            for (name, e) in fields {
                dict.set_item(name, element_to_py(py, e)?)?;
            }
            Ok(dict.into_any())
        }
    }
}

fn tensor_to_py(py: Python<'_>, t: Tensor) -> PyResult<Bound<'_, PyAny>> {
    match t.dtype() {
        DType::String => strings_to_py(py, &t),
        DType::Bool => numeric::<bool>(py, t),
        DType::Int8 => numeric::<i8>(py, t),
        DType::Int16 => numeric::<i16>(py, t),
        DType::Int32 => numeric::<i32>(py, t),
        DType::Int64 => numeric::<i64>(py, t),
        DType::UInt8 => numeric::<u8>(py, t),
        DType::UInt16 => numeric::<u16>(py, t),
        DType::UInt32 => numeric::<u32>(py, t),
        DType::UInt64 => numeric::<u64>(py, t),
        DType::Float32 => numeric::<f32>(py, t),
        DType::Float64 => numeric::<f64>(py, t),
    }
}

/// `bytes` for a scalar, a numpy object array of `bytes` otherwise (as tf's
/// `as_numpy_iterator` gives).
fn strings_to_py<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    let strings = t.strings().unwrap_or_default();
    if t.rank() == 0 {
        let first = strings.first().map(|b| b.as_ref()).unwrap_or_default();
        return Ok(PyBytes::new(py, first).into_any());
    }
    let list = PyList::new(py, strings.iter().map(|s| PyBytes::new(py, s)))?;
    let numpy = py.import("numpy")?;
    let object = numpy.getattr("object_")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", object)?;
    let flat = numpy.call_method("array", (list,), Some(&kwargs))?;
    flat.call_method1("reshape", (PyTuple::new(py, t.shape())?,))
}

fn numeric<T: NumpyElement + TensorValue>(py: Python<'_>, t: Tensor) -> PyResult<Bound<'_, PyAny>> {
    let shape = t.shape().to_vec();
    if t.rank() == 0 {
        let mut value = t
            .to_values::<T>()
            .and_then(|v| v.first().copied())
            .ok_or_else(|| invalid_argument(format!("empty {} scalar", T::DTYPE)))?;
        let descr = T::get_dtype(py);
        // SAFETY: `value` is a valid T for the descr's dtype; PyArray_Scalar copies it and does
        // not keep the pointer.
        let scalar = unsafe {
            PY_ARRAY_API.PyArray_Scalar(
                py,
                (&mut value as *mut T).cast(),
                descr.as_dtype_ptr(),
                std::ptr::null_mut(),
            )
        };
        // SAFETY: PyArray_Scalar returns a new reference or null with an exception set.
        return unsafe { Bound::from_owned_ptr_or_err(py, scalar) };
    }
    let raw = t.raw_data().cloned().unwrap_or_default();
    let native = cfg!(target_endian = "little") && T::DTYPE != DType::Bool;
    if native && raw.len() >= OWN_BUFFER_MIN_BYTES {
        drop(t);
        return match raw.try_into_mut() {
            Ok(unique) => array_over::<T>(py, Buffer::Unique(unique), shape),
            Err(shared) if shared.len() >= ZERO_COPY_MIN_BYTES => {
                array_over::<T>(py, Buffer::Shared(shared), shape)
            }
            Err(shared) => array_copied::<T>(py, &shared, &shape),
        };
    }
    if native {
        return array_copied::<T>(py, &raw, &shape);
    }
    let values = t
        .to_values::<T>()
        .ok_or_else(|| invalid_argument(format!("tensor is not {}", T::DTYPE)))?;
    let array = ArrayD::from_shape_vec(IxDyn(&shape), values)
        .map_err(|e| invalid_argument(format!("tensor shape {shape:?}: {e}")))?;
    Ok(array.into_pyarray(py).into_any())
}

/// A new array of `shape` holding a copy of `raw`, the little-endian values of a tensor of that
/// shape: one `memcpy` into numpy's own allocation (a value-by-value conversion cost a 12 KiB
/// image 25 µs).
fn array_copied<'py, T: NumpyElement + TensorValue>(
    py: Python<'py>,
    raw: &[u8],
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: the array is uninitialized until the copy below fills every byte of it.
    let array = unsafe { PyArray::<T, IxDyn>::new(py, IxDyn(shape), false) };
    let len = array.len().saturating_mul(std::mem::size_of::<T>());
    if raw.len() != len {
        return Err(invalid_argument(format!(
            "a {} tensor of shape {shape:?} holds {len} bytes, got {}",
            T::DTYPE,
            raw.len()
        )));
    }
    // SAFETY: a new C-contiguous array of `len` bytes, owned by nothing else yet; `raw` is as
    // long and cannot overlap it.
    unsafe { std::ptr::copy_nonoverlapping(raw.as_ptr(), array.data().cast::<u8>(), len) };
    Ok(array.into_any())
}

/// An array of `shape` over `raw` without a copy. `raw` holds exactly `shape`'s product of
/// little-endian T values (a tensor's invariant). numpy accepts any alignment (it marks an
/// unaligned array as such), so the received buffer is used wherever its data starts.
fn array_over<T: NumpyElement>(
    py: Python<'_>,
    buffer: Buffer,
    shape: Vec<usize>,
) -> PyResult<Bound<'_, PyAny>> {
    let flags = match &buffer {
        Buffer::Unique(_) => npyffi::NPY_ARRAY_WRITEABLE,
        Buffer::Shared(_) => 0,
    };
    let owner = Bound::new(py, TensorBuffer { data: buffer })?;
    let data = match &owner.get().data {
        Buffer::Shared(b) => b.as_ptr(),
        Buffer::Unique(b) => b.as_ptr(),
    };
    let mut dims: Vec<npyffi::npy_intp> = shape.iter().map(|&d| d as npyffi::npy_intp).collect();
    // SAFETY: `data` covers the array's bytes (C order, so strides may be null) and stays valid
    // while `owner`, the array's base, lives; the descr reference is stolen by the call.
    let array = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, npyffi::NpyTypes::PyArray_Type),
            T::get_dtype(py).into_dtype_ptr(),
            dims.len() as std::os::raw::c_int,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            data.cast_mut().cast(),
            flags,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: a new reference, or null with an exception set.
    let array = unsafe { Bound::from_owned_ptr_or_err(py, array)? };
    // SAFETY: `array` is a new ndarray without a base; the call steals the owner's reference.
    let set = unsafe {
        PY_ARRAY_API.PyArray_SetBaseObject(
            py,
            array.as_ptr().cast::<npyffi::PyArrayObject>(),
            owner.into_ptr(),
        )
    };
    if set != 0 {
        return Err(PyErr::fetch(py));
    }
    Ok(array)
}

/// A tensor from numpy's parts: `dtype` a Sluice dtype name, `data` the C-order little-endian
/// bytes of a numeric array, or a list of `bytes` for strings.
pub fn tensor_from_parts(
    dtype: &str,
    shape: Vec<usize>,
    data: &Bound<'_, PyAny>,
) -> PyResult<Tensor> {
    tensor_from_parts_with(dtype, shape, data, |array| {
        let bytes = array_bytes(array)?;
        if bytes.len() > sluice_client::BLOB_THRESHOLD {
            // A constant registered as a blob: hashed once, however often it is registered.
            return Ok(blob_tensors::remembering_digest(bytes));
        }
        Ok(Bytes::copy_from_slice(bytes))
    })
}

/// `tensor_from_parts` whose tensor borrows an array's data rather than copying it, for an
/// encoding that is written and dropped while the GIL is held (the executor's results): the
/// tensor keeps the array alive, and nothing may write the array before the tensor is gone.
pub fn tensor_from_parts_borrowed(
    dtype: &str,
    shape: Vec<usize>,
    data: &Bound<'_, PyAny>,
) -> PyResult<Tensor> {
    tensor_from_parts_with(dtype, shape, data, |array| {
        let len = array_bytes(array)?.len();
        if len < BORROW_MIN_BYTES {
            // A small copy costs less than keeping the array.
            return Ok(Bytes::copy_from_slice(array_bytes(array)?));
        }
        Ok(Bytes::from_owner(BorrowedArray {
            ptr: array_bytes(array)?.as_ptr() as usize,
            len,
            _array: array.clone().unbind(),
        }))
    })
}

fn tensor_from_parts_with(
    dtype: &str,
    shape: Vec<usize>,
    data: &Bound<'_, PyAny>,
    array_data: impl Fn(&Bound<'_, PyUntypedArray>) -> PyResult<Bytes>,
) -> PyResult<Tensor> {
    let dtype: DType = dtype.parse().map_err(dataset_error)?;
    let tensor = if dtype == DType::String {
        let strings = data
            .extract::<Vec<Vec<u8>>>()?
            .into_iter()
            .map(Bytes::from)
            .collect();
        Tensor::from_strings(shape, strings)
    } else if let Ok(array) = data.cast::<PyUntypedArray>() {
        Tensor::from_raw(dtype, shape, array_data(array)?)
    } else {
        let bytes = data.cast::<PyBytes>()?.as_bytes();
        Tensor::from_raw(dtype, shape, Bytes::copy_from_slice(bytes))
    };
    tensor.map_err(dataset_error)
}

/// Arrays' data from this size on is borrowed by `tensor_from_parts_borrowed`.
const BORROW_MIN_BYTES: usize = 4 << 10;

/// A C-contiguous array's data as `Bytes` without a copy: the array is kept alive with it.
struct BorrowedArray {
    ptr: usize,
    len: usize,
    _array: Py<PyUntypedArray>,
}

impl AsRef<[u8]> for BorrowedArray {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len` bytes from `ptr` are the data of the array this value keeps alive; its
        // user (`tensor_from_parts_borrowed`'s) writes nothing to it while it exists.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

/// The bytes of a C-contiguous array (`output_parts` hands one over in place of its `tobytes()`,
/// saving a copy), borrowed for as long as the GIL is held.
fn array_bytes<'a>(array: &'a Bound<'_, PyUntypedArray>) -> PyResult<&'a [u8]> {
    if !array.is_c_contiguous() {
        return Err(invalid_argument(
            "a tensor's data array must be C-contiguous",
        ));
    }
    let len = array.len().saturating_mul(array.dtype().itemsize());
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: a C-contiguous array's data is `len` bytes from its data pointer; the array (and
    // so its buffer) outlives the borrow, and the GIL keeps other Python code from resizing it.
    Ok(
        unsafe {
            std::slice::from_raw_parts((*array.as_array_ptr()).fields.data.cast::<u8>(), len)
        },
    )
}

/// A structure of tuples and dicts (str keys) over `value`: a tuple stays a tuple, a dict a
/// dict, and anything else is a leaf, converted by `leaf`. `what` names the structure in the
/// error for a key that is not a string.
fn structure_from_py<T>(
    value: &Bound<'_, PyAny>,
    what: &str,
    tuple: fn(Vec<T>) -> T,
    dict: fn(std::collections::BTreeMap<String, T>) -> T,
    leaf: &dyn Fn(&Bound<'_, PyAny>) -> PyResult<T>,
) -> PyResult<T> {
    if let Ok(items) = value.cast::<PyTuple>() {
        let items = items
            .iter()
            .map(|item| structure_from_py(&item, what, tuple, dict, leaf))
            .collect::<PyResult<_>>()?;
        return Ok(tuple(items));
    }
    if let Ok(entries) = value.cast::<PyDict>() {
        let mut fields = std::collections::BTreeMap::new();
        for (k, v) in entries.iter() {
            let key: String = k
                .extract()
                .map_err(|_| invalid_argument(format!("{what} dict keys must be strings")))?;
            fields.insert(key, structure_from_py(&v, what, tuple, dict, leaf)?);
        }
        return Ok(dict(fields));
    }
    leaf(value)
}

/// The columns of `from_tensor_slices` of a structure: a tuple stays a tuple, a dict (str keys)
/// a dict, and a leaf is the list `[dtype, shape, data]` of `tensor_from_parts`.
pub fn columns_from_py(value: &Bound<'_, PyAny>) -> PyResult<Element> {
    structure_from_py(
        value,
        "from_tensor_slices",
        Element::Tuple,
        Element::Dict,
        &|leaf| columns_leaf(leaf, tensor_from_parts),
    )
}

/// `columns_from_py` whose tensors borrow their arrays' data (`tensor_from_parts_borrowed`).
pub fn columns_from_py_borrowed(value: &Bound<'_, PyAny>) -> PyResult<Element> {
    structure_from_py(
        value,
        "from_tensor_slices",
        Element::Tuple,
        Element::Dict,
        &|leaf| columns_leaf(leaf, tensor_from_parts_borrowed),
    )
}

fn columns_leaf(
    value: &Bound<'_, PyAny>,
    tensor: fn(&str, Vec<usize>, &Bound<'_, PyAny>) -> PyResult<Tensor>,
) -> PyResult<Element> {
    let leaf = value.cast::<PyList>()?;
    if leaf.len() != 3 {
        return Err(invalid_argument(
            "a from_tensor_slices leaf is [dtype, shape, data]",
        ));
    }
    let dtype: String = leaf.get_item(0)?.extract()?;
    let shape: Vec<usize> = leaf.get_item(1)?.extract()?;
    Ok(Element::Tensor(tensor(&dtype, shape, &leaf.get_item(2)?)?))
}

/// An element spec from `sluice.data.TensorSpec` leaves (anything with a `shape` of ints and
/// `None`s and a `dtype` whose `str` is a Sluice dtype name) in tuples and dicts.
pub fn spec_from_py(value: &Bound<'_, PyAny>) -> PyResult<ElementSpec> {
    structure_from_py(
        value,
        "element spec",
        ElementSpec::Tuple,
        ElementSpec::Dict,
        &spec_leaf,
    )
}

fn spec_leaf(value: &Bound<'_, PyAny>) -> PyResult<ElementSpec> {
    let not_a_spec = || {
        invalid_argument(format!(
            "an element spec is TensorSpecs in tuples and dicts, got {}",
            value
                .repr()
                .map(|r| r.to_string())
                .unwrap_or_else(|_| "?".into())
        ))
    };
    let shape: Vec<Option<usize>> = value
        .getattr("shape")
        .and_then(|s| s.extract())
        .map_err(|_| not_a_spec())?;
    let dtype: String = value
        .getattr("dtype")
        .and_then(|d| d.str())
        .map(|d| d.to_string())
        .map_err(|_| not_a_spec())?;
    let dtype: DType = dtype.parse().map_err(dataset_error)?;
    Ok(ElementSpec::Tensor { dtype, shape })
}

/// An element spec as `sluice.data.TensorSpec` leaves in tuples and dicts.
pub fn spec_to_py<'py>(py: Python<'py>, spec: &ElementSpec) -> PyResult<Bound<'py, PyAny>> {
    match spec {
        ElementSpec::Tensor { dtype, shape } => {
            let class = py.import("sluice.data")?.getattr("TensorSpec")?;
            let shape = PyTuple::new(py, shape)?;
            class.call1((shape, dtype.name()))
        }
        ElementSpec::Tuple(items) => {
            let items = items
                .iter()
                .map(|s| spec_to_py(py, s))
                .collect::<PyResult<Vec<_>>>()?;
            Ok(PyTuple::new(py, items)?.into_any())
        }
        ElementSpec::Dict(fields) => {
            let dict = PyDict::new(py);
            for (name, s) in fields {
                dict.set_item(name, spec_to_py(py, s)?)?;
            }
            Ok(dict.into_any())
        }
        // The Python layer reads `None` as "known from the first element".
        ElementSpec::Unknown => Ok(py.None().into_bound(py)),
    }
}

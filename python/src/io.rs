//! `sluice._native`'s TFRecord and Example helpers: `TfRecordWriter`, a TFRecord file written
//! plain or compressed, and `serialize_example`, a `tf.train.Example` from tensors. They let
//! Python programs (and the tests) write the files `parse_example` reads without TensorFlow;
//! `encode_jpeg` lets the image benchmark write its JPEGs without Pillow. `list_objects` and
//! `write_object` list and write objects of an object store (`s3://bucket/key`, ...) with the
//! credentials of this process's environment: for `list_files` and for writing test data.

use std::collections::BTreeMap;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use sluice_element::pb;
use sluice_formats::{serialize_example as serialize, TfRecordFile};

use crate::convert::tensor_from_parts;
use crate::errors::{dataset_error, invalid_argument};
use crate::pipeline::lock;

/// `compression`: `None` or `""` for none, `"GZIP"`, `"ZLIB"`.
pub fn compression_from_py(compression: Option<&str>) -> PyResult<pb::RecordCompression> {
    match compression.unwrap_or("") {
        "" => Ok(pb::RecordCompression::None),
        "GZIP" => Ok(pb::RecordCompression::Gzip),
        "ZLIB" => Ok(pb::RecordCompression::Zlib),
        other => Err(invalid_argument(format!(
            "unknown compression type '{other}'; expected None, '', 'GZIP' or 'ZLIB'"
        ))),
    }
}

#[pyclass(frozen, module = "sluice._native")]
pub struct TfRecordWriter {
    path: String,
    /// `None` once closed. A std mutex: held only for one record's write, never across a wait.
    file: Mutex<Option<TfRecordFile>>,
}

#[pymethods]
impl TfRecordWriter {
    #[new]
    #[pyo3(signature = (path, compression=None))]
    fn new(path: String, compression: Option<&str>) -> PyResult<Self> {
        let compression = compression_from_py(compression)?;
        let file = TfRecordFile::create(&path, compression)
            .map_err(|e| invalid_argument(format!("cannot create '{path}': {e}")))?;
        Ok(TfRecordWriter {
            path,
            file: Mutex::new(Some(file)),
        })
    }

    fn write(&self, py: Python<'_>, record: &[u8]) -> PyResult<()> {
        let mut file = lock(py, &self.file)?;
        let Some(f) = file.as_mut() else {
            return Err(invalid_argument(format!(
                "the TFRecord writer of '{}' is closed",
                self.path
            )));
        };
        f.write_record(record)
            .map_err(|e| invalid_argument(format!("cannot write '{}': {e}", self.path)))
    }

    /// Ends the file; closing again does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let file = lock(py, &self.file)?.take();
        match file {
            Some(f) => f
                .finish()
                .map_err(|e| invalid_argument(format!("cannot write '{}': {e}", self.path))),
            None => Ok(()),
        }
    }
}

/// `features`: name to `(dtype, shape, data)` as `tensor_from_parts` takes them.
#[pyfunction]
pub fn serialize_example<'py>(
    py: Python<'py>,
    features: BTreeMap<String, (String, Vec<usize>, Bound<'py, PyAny>)>,
) -> PyResult<Bound<'py, PyBytes>> {
    let tensors = features
        .into_iter()
        .map(|(name, (dtype, shape, data))| Ok((name, tensor_from_parts(&dtype, shape, &data)?)))
        .collect::<PyResult<BTreeMap<_, _>>>()?;
    let bytes = serialize(&tensors).map_err(dataset_error)?;
    Ok(PyBytes::new(py, &bytes))
}

/// An RGB JPEG of `pixels` (`height` x `width` x 3 uint8 values, row-major) at `quality`
/// (1-100).
#[pyfunction]
pub fn encode_jpeg<'py>(
    py: Python<'py>,
    pixels: &[u8],
    height: u32,
    width: u32,
    quality: u8,
) -> PyResult<Bound<'py, PyBytes>> {
    let out = sluice_formats::image_ops::encode_jpeg(pixels, height, width, quality)
        .map_err(|e| invalid_argument(e.to_string()))?;
    Ok(PyBytes::new(py, &out))
}

/// The objects an object-store URL pattern matches, sorted, as `list_files` lists files.
#[pyfunction]
pub fn list_objects(py: Python<'_>, pattern: String) -> PyResult<Vec<String>> {
    py.detach(|| sluice_formats::list_objects(&pattern))
        .map_err(dataset_error)
}

/// Writes `data` as the object `url`, replacing it.
#[pyfunction]
pub fn write_object(py: Python<'_>, url: String, data: Vec<u8>) -> PyResult<()> {
    py.detach(|| sluice_formats::write_object(&url, data))
        .map_err(dataset_error)
}

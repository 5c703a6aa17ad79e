//! Sluice's data model: tensors and elements, their static types (element specs), the element
//! wire codec and packed runs of encoded elements, and `DatasetError`, the one error type of the
//! dataset crates (`sluice-pipeline`, `sluice-formats`, `sluice-executor` build on this one).
//! No file I/O, no networking and no async.
//!
//! Layout:
//! - `error`: `DatasetError`, the one error type, with `is_retryable`.
//! - `dtype`: `DType` and its proto conversions.
//! - `tensor`: `Tensor`, dense data as little-endian `Bytes` or byte strings.
//! - `element`: `Element` (tensor, tuple, dict) and its JSON form; `ElementIter`, a stream of them.
//! - `spec`: `ElementSpec`, the static type of elements, and its proto form.
//! - `codec`: `encode_element` / `decode_element`, the wire form of one element, and
//!   `Compression`.
//! - `packed`: `Packed`, a run of encoded elements sent as one, with its builder and decoder.
//! - `record_origin`: `RecordOrigin`, the file and record of an element, for errors that name it.
//! - `origin_cell`: `OriginCell`, where a files source records the origin of its last element.
//! - `python_exception`: `PythonException`, what a user's Python function raised.
//! - `python_fn`: the `PythonRunner` and `PythonFunction` traits that run users' Python ops, and
//!   `CallResult`, the outputs of one call.
//! - `cancellation`: `Cancellation`, the flag that stops a pipeline inside its ops.

pub use sluice_proto::dataset as pb;

pub mod blob_tensors;
mod cancellation;
pub mod codec;
mod dtype;
mod element;
mod error;
mod origin_cell;
mod packed;
mod python_exception;
mod python_fn;
mod record_origin;
mod spec;
mod tensor;

#[cfg(test)]
mod fuzz_tests;

pub use cancellation::Cancellation;
pub use codec::{
    decode_element, decode_element_bytes, encode_element, encode_element_append, is_compressed,
    AutoCompression, Compression,
};
pub use dtype::DType;
pub use element::{Element, ElementIter};
pub use error::DatasetError;
pub use origin_cell::OriginCell;
pub use packed::{Packed, PackedBuilder, PackedDecoder};
pub use python_exception::PythonException;
pub use python_fn::{CallResult, PythonFunction, PythonRunner};
pub use record_origin::{RecordOrigin, RecordPosition};
pub use spec::ElementSpec;
pub use tensor::{Tensor, TensorValue};

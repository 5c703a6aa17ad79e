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
//! - `record_origin`: `RecordOrigin`, the file and record of an element, for errors that name it,
//!   and the `OriginCell` a files source writes it to.
//! - `python_fn`: the `PythonRunner` and `PythonFunction` traits that run users' Python ops,
//!   `CallResult`, the outputs of one call, and `PythonException`, what such a function raised.
//! - `cancellation`: `Cancellation`, the flag that stops a pipeline inside its ops.

pub use sluice_proto::dataset as pb;

mod cancellation;
pub mod codec;
mod dtype;
mod element;
mod error;
mod packed;
mod python_fn;
pub mod record_origin;
mod spec;
mod tensor;

#[cfg(test)]
mod fuzz_tests;

pub use cancellation::Cancellation;
pub use codec::{
    decode_element, decode_element_bytes, decode_element_parts, encode_element,
    encode_element_append, Compression,
};
pub use dtype::DType;
pub use element::{Element, ElementIter};
pub use error::DatasetError;
pub use packed::{Packed, PackedBuilder, PackedDecoder};
pub use python_fn::{CallResult, PythonException, PythonFunction, PythonRunner};
pub use record_origin::{OriginCell, RecordOrigin, RecordPosition};
pub use spec::ElementSpec;
pub use tensor::{Tensor, TensorValue};

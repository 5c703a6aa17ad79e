//! Sluice's file formats and file access: which files a server may read (`DataRoots`,
//! `FileAccess`), glob expansion of a files source and reading one file's elements (text lines,
//! TFRecords plain, GZIP or ZLIB), the TFRecord format, `tf.train.Example` parsing, and image
//! decoding and resizing. Each op's rules (bounds, specs) are `sluice-pipeline`'s; this crate
//! does the I/O and the decoding under them.
//!
//! Layout:
//! - `data_roots`: `DataRoots`, the directories a server may read files from, and the check.
//! - `file_access`: `FileAccess`, unrestricted (the user's own process) or a server's roots.
//! - `files`: glob expansion (`expand_files`) and reading lines or records of one file, with
//!   the bounds on matches and line length.
//! - `tfrecord`: the TFRecord format, reader and writer.
//! - `tfrecord_file`: `TfRecordFile`, a TFRecord file written plain, GZIP or ZLIB.
//! - `example_parser`: `ExampleParser`, the `parse_example` op on serialized tf.train.Example,
//!   and `serialize_example`.
//! - `image_ops`: the native `decode_image` (JPEG, PNG) and `resize` ops.

mod data_roots;
mod example_parser;
mod file_access;
mod files;
pub mod image_ops;
pub mod tfrecord;
mod tfrecord_file;

#[cfg(test)]
mod fuzz_tests;

pub use data_roots::DataRoots;
pub use example_parser::{serialize_example, ExampleParser};
pub use file_access::FileAccess;
pub use files::{expand_files, file_elements, MAX_LINE_BYTES};
pub use tfrecord_file::TfRecordFile;

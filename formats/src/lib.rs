//! Sluice's file formats and file access: which files a server may read (`DataRoots`,
//! `FileAccess`), glob expansion of a files source and reading one file's elements (text lines,
//! TFRecords plain, GZIP or ZLIB), the TFRecord format, `tf.train.Example` parsing, and image
//! decoding and resizing. Each op's rules (bounds, specs) are `sluice-pipeline`'s; this crate
//! does the I/O and the decoding under them.
//!
//! Layout:
//! - `data_roots`: `DataRoots`, the directories a server may read files from, and the check.
//! - `file_access`: `FileAccess`, unrestricted (the user's own process) or a server's roots.
//! - `expand`: glob expansion of a files source (`expand_files`), with the bound on matches,
//!   local paths and object-store URL patterns.
//! - `object_url`: `ObjectUrl`, an object-store URL (`s3://bucket/key`, ...) and its prefix test.
//! - `objstore_config`: `ObjectStoreSettings`, per-store settings (endpoint, region,
//!   credentials, ...) from a worker's or dispatcher's `--object-store-config` file.
//! - `objstore`: listing and streaming objects through the `object_store` client (feature
//!   `object-store`, part of `read`).
//! - `files`: reading lines or records of one file, with the bound on line length.
//! - `tfrecord`: the TFRecord format, reader and writer.
//! - `tfrecord_file`: `TfRecordFile`, a TFRecord file written plain, GZIP or ZLIB.
//! - `example_parser`: `ExampleParser`, the `parse_example` op on serialized tf.train.Example,
//!   and `serialize_example`.
//! - `image_ops`: the native `decode_image` (JPEG, PNG) and `resize` ops.
//!
//! Everything but data roots and expansion (what a dispatcher needs) is behind the default
//! feature `read`, which brings flate2, image and crc32c.

mod data_roots;
#[cfg(feature = "read")]
mod example_parser;
mod expand;
mod file_access;
#[cfg(feature = "read")]
mod files;
#[cfg(feature = "read")]
pub mod image_ops;
mod object_url;
#[cfg(feature = "object-store")]
mod objstore;
mod objstore_config;
#[cfg(feature = "read")]
pub mod tfrecord;
#[cfg(feature = "read")]
mod tfrecord_file;

#[cfg(all(test, feature = "read"))]
mod fuzz_tests;
#[cfg(test)]
mod rooted;

pub use data_roots::DataRoots;
#[cfg(feature = "read")]
pub use example_parser::{serialize_example, ExampleParser};
pub use expand::{expand_files, list_objects};
pub use file_access::FileAccess;
#[cfg(feature = "read")]
pub use files::{file_elements, file_elements_started, MAX_LINE_BYTES};
pub use object_url::{is_object_url, ObjectUrl, Scheme};
#[cfg(feature = "object-store")]
pub use objstore::write_object;
pub use objstore_config::{
    load_object_store_settings, set_object_store_settings, ObjectStoreSettings, SETTINGS_ENV,
};
#[cfg(feature = "read")]
pub use tfrecord_file::TfRecordFile;

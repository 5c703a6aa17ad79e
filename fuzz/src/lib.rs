//! The harness every fuzz target of Sluice's decoders shares: the decoders are fed their corpus
//! (real encodings, and every input that once broke them), then a bounded run of structured
//! mutations of it and of arbitrary bytes, on stable Rust, as ordinary tests.
//!
//! A target is a test named `fuzz_<target>` beside the decoder it drives; its corpus is the
//! directory `fuzz/corpus/<target>/`. The run is bounded by `SLUICE_FUZZ_CASES` (256 cases by
//! default, so the test suite stays fast) and seeded by `SLUICE_FUZZ_SEED` (random by default,
//! printed, so any run can be repeated). A failing input is shrunk, written to a temporary file
//! and reported; it belongs in the corpus, with a regression test, once the decoder is fixed.
//!
//! Layout:
//! - `fuzz_target`: `FuzzTarget`, one target's corpus, dictionary and bounded run.
//! - `corpus`: `Corpus`, the files of a target's corpus directory.
//! - `mutation`: `Mutation`, the structured edits of an input, and the input strategy.
//! - `alloc_meter`: `AllocMeter`, a global allocator that measures a closure's peak heap use, so
//!   a target can check that no length field makes a decoder allocate beyond its input, and
//!   `within`, that check.

mod alloc_meter;
mod corpus;
mod fuzz_target;
mod mutation;

pub use alloc_meter::{within, AllocMeter};
pub use corpus::Corpus;
pub use fuzz_target::{cases, seed, FuzzTarget};
pub use mutation::{inputs, LengthForm, Mutation};
pub use proptest;

//! `Corpus`: the inputs kept for one fuzz target in `fuzz/corpus/<target>/`, one file each.
//!
//! Seed files (`seed-*`) are real encodings written by the target's own generator (rewritten
//! with `SLUICE_FUZZ_WRITE_SEEDS=1`); `crash-*` files are inputs that once broke the decoder,
//! each kept with a regression test. Files are read in name order, so runs are repeatable.

use std::fs;
use std::path::PathBuf;

/// A target's corpus files, read into memory.
pub struct Corpus {
    dir: PathBuf,
    entries: Vec<(String, Vec<u8>)>,
}

impl Corpus {
    /// The directory of `target`'s corpus inside this repository.
    pub fn dir(target: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(target)
    }

    /// Reads every file of `target`'s corpus directory (none when it does not exist).
    pub fn load(target: &str) -> Corpus {
        let dir = Corpus::dir(target);
        let mut entries: Vec<(String, Vec<u8>)> = match fs::read_dir(&dir) {
            Ok(files) => files
                .filter_map(Result::ok)
                .filter(|f| f.file_type().is_ok_and(|t| t.is_file()))
                .map(|f| {
                    let bytes = fs::read(f.path())
                        .unwrap_or_else(|e| panic!("read corpus file {}: {e}", f.path().display()));
                    (f.file_name().to_string_lossy().into_owned(), bytes)
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        entries.sort();
        Corpus { dir, entries }
    }

    /// Writes `seeds` as `seed-00`, `seed-01`, ..., replacing the seed files there were.
    pub fn write_seeds(target: &str, seeds: &[Vec<u8>]) {
        let dir = Corpus::dir(target);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        if let Ok(files) = fs::read_dir(&dir) {
            for f in files.filter_map(Result::ok) {
                if f.file_name().to_string_lossy().starts_with("seed-") {
                    let _ = fs::remove_file(f.path());
                }
            }
        }
        for (i, seed) in seeds.iter().enumerate() {
            let path = dir.join(format!("seed-{i:02}"));
            fs::write(&path, seed).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.dir
    }

    /// `(file name, bytes)` in name order.
    pub fn entries(&self) -> &[(String, Vec<u8>)] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

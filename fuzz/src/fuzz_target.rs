//! `FuzzTarget`: one decoder's fuzz run. First every corpus file (and every seed the target
//! generates) goes through the target's check; then a bounded random run of mutated corpus
//! entries and arbitrary bytes (see `mutation`). The check returns `Err` for a broken property;
//! a panic counts as a failure too. A failing input is shrunk, saved to a temporary file, and
//! the test fails naming the file, the seed that found it and the start of its bytes.
//!
//! Stack overflows and aborts cannot be caught: they end the test binary, which `nextest`
//! reports with the seed printed at the start of the run.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;

use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

use crate::corpus::Corpus;
use crate::mutation::inputs;

/// Random cases per target: `SLUICE_FUZZ_CASES`, 256 by default.
pub fn cases() -> u32 {
    std::env::var("SLUICE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// The run's seed: `SLUICE_FUZZ_SEED`, or drawn from the clock.
pub fn seed() -> u64 {
    std::env::var("SLUICE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            now.as_nanos() as u64
        })
}

/// One decoder's fuzz run (see the module docs).
pub struct FuzzTarget {
    name: &'static str,
    seeds: Vec<Vec<u8>>,
    dictionary: Vec<Vec<u8>>,
    seed: u64,
}

impl FuzzTarget {
    /// The target whose corpus is `fuzz/corpus/<name>/`.
    pub fn new(name: &'static str) -> FuzzTarget {
        let seed = seed();
        eprintln!(
            "fuzz {name}: {} cases, seed {seed} (SLUICE_FUZZ_SEED={seed} repeats this run)",
            cases()
        );
        FuzzTarget {
            name,
            seeds: Vec::new(),
            dictionary: Vec::new(),
            seed,
        }
    }

    /// Valid inputs made by the target's generator: checked and mutated with the corpus, and
    /// written to it as `seed-*` files when `SLUICE_FUZZ_WRITE_SEEDS` is set.
    pub fn seeds(mut self, seeds: Vec<Vec<u8>>) -> FuzzTarget {
        self.seeds = seeds;
        self
    }

    /// Tokens of the format (magic, tags, keywords) that mutations insert.
    pub fn dictionary<T: AsRef<[u8]>>(mut self, tokens: &[T]) -> FuzzTarget {
        self.dictionary = tokens.iter().map(|t| t.as_ref().to_vec()).collect();
        self
    }

    /// The proptest configuration of this run, for a target's own generated properties
    /// (round trips): the same case count and seed, and no failure files of proptest's own.
    pub fn config(&self) -> Config {
        Config {
            cases: cases(),
            rng_seed: RngSeed::Fixed(self.seed),
            failure_persistence: None,
            max_shrink_iters: 2048,
            ..Config::default()
        }
    }

    /// Checks the corpus and the seeds, then runs the random cases; fails the test at the
    /// first input `check` refuses or panics on.
    pub fn run(self, check: impl Fn(&[u8]) -> Result<(), String>) {
        if std::env::var_os("SLUICE_FUZZ_WRITE_SEEDS").is_some() {
            Corpus::write_seeds(self.name, &self.seeds);
        }
        let corpus = Corpus::load(self.name);
        assert!(
            !corpus.is_empty(),
            "fuzz {}: no corpus in {} (SLUICE_FUZZ_WRITE_SEEDS=1 writes the seeds)",
            self.name,
            corpus.path().display()
        );
        let replay = corpus
            .entries()
            .iter()
            .map(|(name, bytes)| (format!("corpus file {name}"), bytes))
            .chain(
                self.seeds
                    .iter()
                    .enumerate()
                    .map(|(i, bytes)| (format!("generated seed {i}"), bytes)),
            );
        for (what, bytes) in replay {
            match panic::catch_unwind(AssertUnwindSafe(|| check(bytes))) {
                Ok(Ok(())) => {}
                Ok(Err(why)) => panic!("fuzz {}: {what}: {why}", self.name),
                Err(_) => panic!("fuzz {}: {what}: the decoder panicked", self.name),
            }
        }
        let mut pool: Vec<Vec<u8>> = corpus.entries().iter().map(|(_, b)| b.clone()).collect();
        pool.extend(self.seeds.iter().cloned());
        let mut runner = TestRunner::new(self.config());
        let result = runner.run(&inputs(pool, self.dictionary.clone()), |input| {
            check(&input).map_err(TestCaseError::fail)
        });
        match result {
            Ok(()) => {}
            Err(TestError::Abort(why)) => panic!("fuzz {}: aborted: {why}", self.name),
            Err(TestError::Fail(why, input)) => {
                let saved = self.save(&input);
                let head: String = input.iter().take(96).map(|b| format!("{b:02x}")).collect();
                panic!(
                    "fuzz {}: {why}\n  seed {}; the input ({} bytes) is saved in {}\n  \
                     starts {head}\n  once fixed, add it to {} with a regression test",
                    self.name,
                    self.seed,
                    input.len(),
                    saved.display(),
                    Corpus::dir(self.name).display(),
                );
            }
        }
    }

    /// Writes a failing input to the temporary directory (never into the repository: a test
    /// run must not change it), named by its hash.
    fn save(&self, input: &[u8]) -> PathBuf {
        let mut h = DefaultHasher::new();
        input.hash(&mut h);
        let dir = std::env::temp_dir().join("sluice-fuzz").join(self.name);
        let path = dir.join(format!("crash-{:016x}", h.finish()));
        if std::fs::create_dir_all(&dir).is_ok() {
            let _ = std::fs::write(&path, input);
        }
        path
    }
}

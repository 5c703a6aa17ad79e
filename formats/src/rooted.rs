//! `Rooted`, the tests' data root: a temp dir with `data/a.txt`, `data/b.txt` and
//! `outside/secret.txt`, whose `data/` is the one root.

use crate::{DataRoots, FileAccess};

pub(crate) struct Rooted {
    _dir: tempfile::TempDir,
    pub(crate) base: std::path::PathBuf,
    pub(crate) access: FileAccess,
}

impl Rooted {
    pub(crate) fn new() -> Rooted {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(base.join("data")).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        for file in ["data/a.txt", "data/b.txt", "outside/secret.txt"] {
            std::fs::write(base.join(file), "x\n").unwrap();
        }
        let roots = DataRoots::new([base.join("data")]).unwrap();
        Rooted {
            _dir: dir,
            base,
            access: FileAccess::Roots(roots),
        }
    }

    pub(crate) fn path(&self, rel: &str) -> String {
        self.base.join(rel).to_string_lossy().into_owned()
    }
}

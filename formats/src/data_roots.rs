//! `DataRoots`: the directories a server may read `files()` from, and the one check every path
//! passes before a server lists or opens it.
//!
//! A client chooses the paths of a files source (a pattern, or an explicit list in a raw
//! request), so a server that opened them as given would read any file its process can:
//! `/etc/passwd`, `/proc/self/environ`, keys, or `/dev/zero` until it runs out of memory. The
//! check therefore works on the *canonical* path (every symlink and `..` resolved), compares it
//! with each root component by component (`/data2/x` is not below `/data`), and accepts only a
//! regular file. The canonical path is what the caller stores and opens, so a symlink swapped
//! after the check cannot redirect an already stored path.
//!
//! A path that cannot be resolved is reported as missing only when it lies below a root by its
//! text; otherwise it is refused as outside the roots, in the same words as a file outside the
//! roots that exists, and never naming where a path resolves to, so a client cannot probe which
//! files exist elsewhere on the server (or learn its PID from `/proc/self`). For the same reason a glob pattern is checked before it is
//! expanded: one whose literal directory can reach no root is refused without listing anything,
//! and a match outside every root is reported as the pattern's, not by the matched name.
//!
//! A root may also be an object-store URL prefix (`s3://bucket/data`): a URL is allowed when it
//! lies at or below one, compared component by component by its text (see `ObjectUrl`; a store
//! resolves no links, and a URL with `.` or `..` components is refused). Whether the object
//! exists is the store's to say when it is listed or opened.
//!
//! No roots means no file: the safe default. The user's own process (local execution) does not
//! use this type at all; see `FileAccess`.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use sluice_element::DatasetError;

use crate::object_url::{is_object_url, ObjectUrl};

/// Why a server without roots refuses a file, and how to allow files.
const NO_ROOTS: &str = "this server has no data roots, so it reads no files; start it with \
                        --data-root DIR (data_roots=[...] in Python) to allow files below DIR, \
                        or --data-root s3://BUCKET/PREFIX for objects below that prefix";

/// Canonical directories below which files may be read, and object-store URL prefixes below
/// which objects may be read; empty refuses every file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DataRoots {
    /// Canonical, so a canonical path is below a root exactly when it `starts_with` it.
    roots: Arc<[PathBuf]>,
    /// Object-store prefixes, normalized (see `ObjectUrl`).
    urls: Arc<[ObjectUrl]>,
}

impl DataRoots {
    /// No roots: every file is refused.
    pub fn none() -> DataRoots {
        DataRoots::default()
    }

    /// Canonicalizes each root. A root that does not exist or is not a directory is an error
    /// naming it (a server refuses to start with it). A root that is an object-store URL
    /// (`s3://bucket/prefix`) is a prefix of allowed objects; a malformed one is an error naming
    /// it.
    pub fn new<I, P>(roots: I) -> Result<DataRoots, DatasetError>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<Path>,
    {
        let mut canonical = Vec::new();
        let mut urls = Vec::new();
        for root in roots {
            let root = root.as_ref();
            if let Some(url) = root.to_str().filter(|r| is_object_url(r)) {
                let url = ObjectUrl::parse(url).map_err(|e| {
                    DatasetError::InvalidArgument(format!("data root '{url}' cannot be used: {e}"))
                })?;
                if url.is_pattern() {
                    return Err(DatasetError::InvalidArgument(format!(
                        "data root '{url}' cannot be used: a root is a prefix, not a pattern"
                    )));
                }
                if !urls.contains(&url) {
                    urls.push(url);
                }
                continue;
            }
            let resolved = std::fs::canonicalize(root).map_err(|e| {
                DatasetError::InvalidArgument(format!(
                    "data root '{}' cannot be used: {}",
                    root.display(),
                    e.to_string().to_lowercase()
                ))
            })?;
            if !resolved.is_dir() {
                return Err(DatasetError::InvalidArgument(format!(
                    "data root '{}' is not a directory",
                    root.display()
                )));
            }
            if !canonical.contains(&resolved) {
                canonical.push(resolved);
            }
        }
        Ok(DataRoots {
            roots: canonical.into(),
            urls: urls.into(),
        })
    }

    /// The canonical local roots, in the order given.
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// The object-store roots, in the order given.
    pub fn url_roots(&self) -> &[ObjectUrl] {
        &self.urls
    }

    pub fn is_empty(&self) -> bool {
        self.roots.is_empty() && self.urls.is_empty()
    }

    /// The normalized form of the object URL `url` if it lies at or below a URL root; otherwise
    /// an error naming the URL and the roots. Whether it exists is not checked here.
    pub fn check_url(&self, url: &str) -> Result<ObjectUrl, DatasetError> {
        if self.is_empty() {
            return Err(self.refuse(url, NO_ROOTS));
        }
        let parsed = ObjectUrl::parse(url)?;
        if self.urls.iter().any(|root| parsed.is_below(root)) {
            Ok(parsed)
        } else {
            Err(self.refuse(url, &self.outside()))
        }
    }

    /// Refuses an object URL pattern that cannot match below any URL root, before anything is
    /// listed: its literal prefix (see `ObjectUrl::literal_prefix`) must lie below a root or
    /// contain one.
    pub fn check_url_pattern(&self, pattern: &str) -> Result<ObjectUrl, DatasetError> {
        if self.is_empty() {
            return Err(self.refuse(pattern, NO_ROOTS));
        }
        let parsed = ObjectUrl::parse(pattern)?;
        let literal = parsed.literal_prefix();
        if self
            .urls
            .iter()
            .any(|root| literal.is_below(root) || root.is_below(&literal))
        {
            Ok(parsed)
        } else {
            Err(self.refuse(pattern, &self.outside()))
        }
    }

    /// Checks an object `pattern` matched, as [`DataRoots::check_url`]; one outside every root
    /// is refused as the pattern's, so the error lists no object outside the roots.
    pub fn check_url_match(&self, pattern: &str, url: &str) -> Result<ObjectUrl, DatasetError> {
        self.check_url(url).map_err(|e| match e {
            DatasetError::FileRefused { .. } => {
                self.refuse(pattern, &format!("it matches objects {}", self.outside()))
            }
            other => other,
        })
    }

    /// The canonical form of `path` if it is a regular file below a root; otherwise an error
    /// naming the path and the roots.
    pub fn check(&self, path: &str) -> Result<PathBuf, DatasetError> {
        if self.is_empty() {
            return Err(self.refuse(path, NO_ROOTS));
        }
        let canonical = match std::fs::canonicalize(path) {
            Ok(canonical) => canonical,
            Err(e) if self.below_a_root(&resolved_prefix(Path::new(path))) => {
                return Err(DatasetError::io(path, &e));
            }
            Err(_) => return Err(self.refuse(path, &self.outside())),
        };
        if !self.below_a_root(&canonical) {
            // Not where it resolves to: that would tell a client what a link points at, and
            // `/proc/self/...` resolves to a path naming the server's PID.
            return Err(self.refuse(path, &self.outside()));
        }
        let metadata = std::fs::metadata(&canonical).map_err(|e| DatasetError::io(path, &e))?;
        if !metadata.is_file() {
            return Err(self.refuse(path, "it is not a regular file"));
        }
        Ok(canonical)
    }

    /// Where to write (or read back) `path`, a file that may not exist yet, such as a cache
    /// file: an existing path must pass [`DataRoots::check`]; a new one's directory, resolved,
    /// must lie below a root, and the file keeps its name there.
    pub fn check_writable(&self, path: &str) -> Result<PathBuf, DatasetError> {
        if self.is_empty() {
            return Err(self.refuse(path, NO_ROOTS));
        }
        let p = Path::new(path);
        if std::fs::symlink_metadata(p).is_ok() {
            return self.check(path);
        }
        let (Some(dir), Some(name)) = (p.parent(), p.file_name()) else {
            return Err(self.refuse(path, "it names no file"));
        };
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        match std::fs::canonicalize(dir) {
            Ok(canonical) if self.below_a_root(&canonical) => Ok(canonical.join(name)),
            _ => Err(self.refuse(path, &self.outside())),
        }
    }

    /// Refuses a glob pattern that cannot match below any root, before anything is listed: its
    /// literal directory (the components before the first with `*`, `?` or `[`), resolved,
    /// must lie below a root or contain one.
    pub fn check_pattern(&self, pattern: &str) -> Result<(), DatasetError> {
        if self.is_empty() {
            return Err(self.refuse(pattern, NO_ROOTS));
        }
        let literal: PathBuf = Path::new(pattern)
            .components()
            .take_while(|c| !c.as_os_str().to_string_lossy().contains(['*', '?', '[']))
            .collect();
        let literal = if literal.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            literal
        };
        let dir = std::fs::canonicalize(&literal).unwrap_or_else(|_| lexical_absolute(&literal));
        if self
            .roots
            .iter()
            .any(|root| dir.starts_with(root) || root.starts_with(&dir))
        {
            Ok(())
        } else {
            Err(self.refuse(pattern, &self.outside()))
        }
    }

    /// Checks a file that `pattern` matched, as [`DataRoots::check`]; a match that is outside
    /// every root by its own text is refused as the pattern's, so the error lists no file
    /// outside the roots.
    pub fn check_match(&self, pattern: &str, path: &str) -> Result<PathBuf, DatasetError> {
        match self.check(path) {
            Err(DatasetError::FileRefused { .. })
                if !self.below_a_root(&lexical_absolute(Path::new(path))) =>
            {
                Err(self.refuse(pattern, &format!("it matches files {}", self.outside())))
            }
            checked => checked,
        }
    }

    fn below_a_root(&self, path: &Path) -> bool {
        // `Path::starts_with` compares whole components: `/data2` does not start with `/data`.
        self.roots.iter().any(|root| path.starts_with(root))
    }

    fn outside(&self) -> String {
        format!("outside the data roots ({})", self)
    }

    fn refuse(&self, path: &str, reason: &str) -> DatasetError {
        DatasetError::FileRefused {
            path: path.to_string(),
            reason: reason.to_string(),
        }
    }
}

impl std::fmt::Display for DataRoots {
    /// The roots, comma-separated: the directories, then the URL prefixes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dirs = self.roots.iter().map(|r| r.display().to_string());
        let urls = self.urls.iter().map(|u| u.to_string());
        for (i, root) in dirs.chain(urls).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(&root)?;
        }
        Ok(())
    }
}

/// A path that does not resolve, made absolute with its longest prefix that does resolve
/// resolved as the system would (so a link in a root to a directory outside it, or `..` after
/// such a link, counts as outside), a dangling link followed to where it points, and the rest
/// folded by its text; only used to decide how to report it.
fn resolved_prefix(path: &Path) -> PathBuf {
    resolved_prefix_within(path, 40)
}

/// `resolved_prefix`, following at most `links` dangling links (the system's own bound is 40).
fn resolved_prefix_within(path: &Path, links: u32) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut prefix = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(target) = std::fs::read_link(prefix) {
            // A link whose target does not resolve: where it points decides.
            if links > 0 {
                let base = prefix.parent().unwrap_or(Path::new("/"));
                let mut pointed = base.join(target);
                pointed.extend(rest.iter().rev());
                return resolved_prefix_within(&pointed, links - 1);
            }
        }
        let (Some(parent), Some(last)) = (prefix.parent(), prefix.components().next_back()) else {
            return lexical_absolute(path);
        };
        rest.push(last);
        prefix = parent;
        if let Ok(mut resolved) = std::fs::canonicalize(prefix) {
            for component in rest.iter().rev() {
                match component {
                    Component::ParentDir => {
                        resolved.pop();
                    }
                    Component::CurDir => {}
                    other => resolved.push(other),
                }
            }
            return resolved;
        }
    }
}

/// `path` made absolute against the working directory with `.` and `..` folded by their text;
/// only used to decide how to report a path that does not resolve.
fn lexical_absolute(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for component in absolute.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
#[path = "data_roots_tests.rs"]
mod tests;

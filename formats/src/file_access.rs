//! `FileAccess`: which files an execution of a pipeline may list and open.
//!
//! The same executor runs in two kinds of process. In the user's own process (local iteration,
//! `sluice read` without a service, the client expanding its pattern before registering) the
//! files are the user's to choose: nothing is restricted. On a server (dispatcher, worker) the
//! paths come from whoever can reach it, so every path passes its `DataRoots` and the canonical
//! path is what is opened. The choice is explicit in `ExecOptions`, never inferred.

use std::path::PathBuf;

use sluice_element::DatasetError;

use crate::data_roots::DataRoots;
use crate::object_url::ObjectUrl;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum FileAccess {
    /// The user's own process: any file the process can read, as given.
    #[default]
    Unrestricted,
    /// A server: only regular files below these roots, by their canonical path.
    Roots(DataRoots),
}

impl FileAccess {
    /// The path to open for `path`: as given when unrestricted, else its checked canonical
    /// form.
    pub fn resolve(&self, path: &str) -> Result<PathBuf, DatasetError> {
        match self {
            FileAccess::Unrestricted => Ok(PathBuf::from(path)),
            FileAccess::Roots(roots) => roots.check(path),
        }
    }

    /// The path to write (or read back) a file of the pipeline's own, such as a cache file,
    /// that may not exist yet: as given when unrestricted, else checked by
    /// [`DataRoots::check_writable`].
    pub fn resolve_writable(&self, path: &str) -> Result<PathBuf, DatasetError> {
        match self {
            FileAccess::Unrestricted => Ok(PathBuf::from(path)),
            FileAccess::Roots(roots) => roots.check_writable(path),
        }
    }

    /// Refuses a glob pattern that can match nothing below the roots (see
    /// [`DataRoots::check_pattern`]); every pattern when unrestricted is fine.
    pub fn check_pattern(&self, pattern: &str) -> Result<(), DatasetError> {
        match self {
            FileAccess::Unrestricted => Ok(()),
            FileAccess::Roots(roots) => roots.check_pattern(pattern),
        }
    }

    /// The path to store for a file `pattern` matched: as given when unrestricted, else its
    /// checked canonical form (see [`DataRoots::check_match`]).
    pub fn resolve_match(&self, pattern: &str, path: &str) -> Result<PathBuf, DatasetError> {
        match self {
            FileAccess::Unrestricted => Ok(PathBuf::from(path)),
            FileAccess::Roots(roots) => roots.check_match(pattern, path),
        }
    }

    /// The object to open for the object-store URL `url`: parsed (a malformed URL is an error
    /// naming it) and, on a server, at or below a URL root (see [`DataRoots::check_url`]).
    pub fn resolve_url(&self, url: &str) -> Result<ObjectUrl, DatasetError> {
        match self {
            FileAccess::Unrestricted => ObjectUrl::parse(url),
            FileAccess::Roots(roots) => roots.check_url(url),
        }
    }

    /// Checks an object-store URL pattern before it is listed (see
    /// [`DataRoots::check_url_pattern`]); parsed only, when unrestricted.
    pub fn check_url_pattern(&self, pattern: &str) -> Result<ObjectUrl, DatasetError> {
        match self {
            FileAccess::Unrestricted => ObjectUrl::parse(pattern),
            FileAccess::Roots(roots) => roots.check_url_pattern(pattern),
        }
    }

    /// Checks an object that `pattern` matched (see [`DataRoots::check_url_match`]).
    pub fn resolve_url_match(&self, pattern: &str, url: &str) -> Result<ObjectUrl, DatasetError> {
        match self {
            FileAccess::Unrestricted => ObjectUrl::parse(url),
            FileAccess::Roots(roots) => roots.check_url_match(pattern, url),
        }
    }

    /// Whether paths are checked against data roots.
    pub fn is_restricted(&self) -> bool {
        match self {
            FileAccess::Unrestricted => false,
            FileAccess::Roots(_) => true,
        }
    }
}

//! Glob expansion of a files source (`expand_files`), done once where the definition is
//! registered and stored in the definition (`FilesSource.files`) so every worker and dispatcher
//! replica sees the same sorted list; split `i` of a files source is file `i`.
//!
//! On a server (`FileAccess::Roots`) every path, matched or listed, passes the data roots; the
//! stored list holds the canonical paths. A pattern matches at most `MAX_MATCHED_FILES` files.
//!
//! An object-store URL pattern (`s3://bucket/train-*.tfrecord`) is expanded by listing the
//! objects below its literal prefix (the key's components before the first with a glob
//! character) and matching each key with the same rules as a local path: `*`, `?` and `[...]`
//! match within one `/`-separated component, `**` (a whole component) any number of them. A
//! pattern without a glob character names one object, which must exist. The stored list holds
//! the normalized URLs. Listing needs the `object-store` feature; without it (a dispatcher) a URL
//! pattern is refused, and a listed URL is checked against the roots by its text.

use std::path::PathBuf;

use sluice_element::{pb, DatasetError};

use crate::file_access::FileAccess;
use crate::object_url::is_object_url;

/// The most files a pattern may match (or a files source may list): the list travels in the
/// replicated definition, and a pattern such as `/**/*` must not fill a server's memory.
pub(crate) const MAX_MATCHED_FILES: usize = 100_000;

/// Fills `files` of a files source from its glob `pattern`, sorted, as absolute paths (workers
/// may run in another directory). A no-op for other sources. An already filled list (a raw
/// request may send one) is kept as it is when unrestricted; with data roots, every matched or
/// listed file must pass them, and the stored list holds their canonical paths.
///
/// Every files source of the definition is expanded, those of nested datasets (zip inputs,
/// concatenate's other dataset, ...) included, each under the same rules.
pub fn expand_files(def: &mut pb::DatasetDef, access: &FileAccess) -> Result<(), DatasetError> {
    // Walked with a heap stack (this crate does without `sluice-pipeline` on a dispatcher, so
    // it lists the nested definitions itself).
    let mut stack = vec![def];
    while let Some(d) = stack.pop() {
        expand_one(d, access)?;
        if let Some(kind) = d.source.as_mut().and_then(|s| s.kind.as_mut()) {
            match kind {
                pb::source::Kind::Zip(z) => stack.extend(z.inputs.iter_mut()),
                pb::source::Kind::Sample(s) => stack.extend(s.inputs.iter_mut()),
                pb::source::Kind::Choose(c) => {
                    stack.extend(c.inputs.iter_mut().chain(c.choice.iter_mut()))
                }
                _ => {}
            }
        }
        for op in &mut d.ops {
            if let Some(pb::op::Kind::Concatenate(c)) = &mut op.kind {
                stack.extend(c.other.as_mut());
            }
        }
    }
    Ok(())
}

fn expand_one(def: &mut pb::DatasetDef, access: &FileAccess) -> Result<(), DatasetError> {
    let Some(pb::Source {
        kind: Some(pb::source::Kind::Files(fs)),
    }) = def.source.as_mut()
    else {
        return Ok(());
    };
    if !fs.files.is_empty() {
        if fs.files.len() > MAX_MATCHED_FILES {
            return Err(DatasetError::invalid(format!(
                "the files source lists {} files; the limit is {MAX_MATCHED_FILES}",
                fs.files.len()
            )));
        }
        if access.is_restricted() || fs.files.iter().any(|f| is_object_url(f)) {
            fs.files = fs
                .files
                .iter()
                .map(|f| {
                    if is_object_url(f) {
                        access.resolve_url(f).map(|u| u.to_string())
                    } else if access.is_restricted() {
                        access.resolve(f).map(path_string)
                    } else {
                        Ok(f.clone())
                    }
                })
                .collect::<Result<_, _>>()?;
        }
        return Ok(());
    }
    if is_object_url(&fs.pattern) {
        fs.files = expand_url(&fs.pattern, access)?;
        return Ok(());
    }
    // A malformed pattern is reported as such first; `glob` lists nothing until iterated.
    let entries = glob::glob(&fs.pattern).map_err(|e| {
        DatasetError::invalid(format!("invalid file pattern '{}': {}", fs.pattern, e.msg))
    })?;
    access.check_pattern(&fs.pattern)?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| DatasetError::io(&e.path().to_string_lossy(), e.error()))?;
        if path.is_dir() {
            continue;
        }
        if files.len() == MAX_MATCHED_FILES {
            return Err(DatasetError::invalid(format!(
                "file pattern '{}' matches more than {MAX_MATCHED_FILES} files, the limit",
                fs.pattern
            )));
        }
        let path = std::path::absolute(&path).unwrap_or(path);
        // Refused at the first match outside the roots.
        let path = access.resolve_match(&fs.pattern, &path.to_string_lossy())?;
        files.push(path_string(path));
    }
    if files.is_empty() {
        return Err(DatasetError::invalid(format!(
            "no files match pattern '{}'",
            fs.pattern
        )));
    }
    files.sort();
    fs.files = files;
    Ok(())
}

/// The objects an object-store URL `pattern` matches in the user's own process (unrestricted),
/// sorted, as normalized URLs, as a files source would list them (none is not an error here):
/// for `list_files`.
pub fn list_objects(pattern: &str) -> Result<Vec<String>, DatasetError> {
    matched_urls(pattern, &FileAccess::Unrestricted)
}

/// The objects an object-store URL pattern matches, sorted, as normalized URLs; at least one.
fn expand_url(pattern: &str, access: &FileAccess) -> Result<Vec<String>, DatasetError> {
    let files = matched_urls(pattern, access)?;
    if files.is_empty() {
        return Err(DatasetError::invalid(format!(
            "no files match pattern '{pattern}'"
        )));
    }
    Ok(files)
}

/// The objects an object-store URL pattern matches, sorted, as normalized URLs.
fn matched_urls(pattern: &str, access: &FileAccess) -> Result<Vec<String>, DatasetError> {
    let url = access.check_url_pattern(pattern)?;
    let matcher = glob::Pattern::new(&url.key).map_err(|e| {
        DatasetError::invalid(format!("invalid file pattern '{pattern}': {}", e.msg))
    })?;
    let mut files = list_url(pattern, &url, matcher)?
        .into_iter()
        .map(|key| {
            let matched = url.with_key(&key).to_string();
            access
                .resolve_url_match(pattern, &matched)
                .map(|u| u.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    files.sort();
    Ok(files)
}

/// The keys of `url`'s store that `matcher` matches: the one object a literal URL names (if it
/// exists), or those listed below the pattern's literal prefix.
#[cfg(feature = "object-store")]
fn list_url(
    pattern: &str,
    url: &crate::object_url::ObjectUrl,
    matcher: glob::Pattern,
) -> Result<Vec<String>, DatasetError> {
    if !url.is_pattern() {
        if url.key.is_empty() {
            return Err(DatasetError::invalid(format!(
                "file pattern '{pattern}' names a bucket, not an object (add a key pattern, \
                 such as /*)"
            )));
        }
        return Ok(if crate::objstore::exists(url)? {
            vec![url.key.clone()]
        } else {
            Vec::new()
        });
    }
    // As the glob crate matches paths component by component: a wildcard never crosses a `/`,
    // and a leading `.` needs no literal dot.
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: false,
    };
    crate::objstore::list(
        pattern,
        &url.literal_prefix(),
        move |key| matcher.matches_with(key, options),
        MAX_MATCHED_FILES,
    )
}

#[cfg(not(feature = "object-store"))]
fn list_url(
    pattern: &str,
    _url: &crate::object_url::ObjectUrl,
    _matcher: glob::Pattern,
) -> Result<Vec<String>, DatasetError> {
    Err(DatasetError::invalid(format!(
        "this process lists no object stores, so it cannot expand '{pattern}'; send the \
         expanded list of objects (the clients expand a pattern before registering it)"
    )))
}

fn path_string(path: PathBuf) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
#[path = "expand_tests.rs"]
mod tests;

//! Glob expansion of a files source (`expand_files`), done once where the definition is
//! registered and stored in the definition (`FilesSource.files`) so every worker and dispatcher
//! replica sees the same sorted list; split `i` of a files source is file `i`.
//!
//! On a server (`FileAccess::Roots`) every path, matched or listed, passes the data roots; the
//! stored list holds the canonical paths. A pattern matches at most `MAX_MATCHED_FILES` files.

use std::path::PathBuf;

use sluice_element::{pb, DatasetError};

use crate::file_access::FileAccess;

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
        if access.is_restricted() {
            fs.files = fs
                .files
                .iter()
                .map(|f| access.resolve(f).map(path_string))
                .collect::<Result<_, _>>()?;
        }
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

fn path_string(path: PathBuf) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
#[path = "expand_tests.rs"]
mod tests;

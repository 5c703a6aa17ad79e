//! `auto_shard`: tf.data's auto-shard rewrite, applied to a definition for shard `index` of
//! `num_shards` (in the service: worker `worker_index` of `num_workers` under a static sharding
//! policy).
//!
//! The policies follow tf.data's `AutoShardPolicy` (`grappler/optimizers/data/auto_shard.cc`):
//! - `File` keeps files `index, index + n, ...` of a files source. A source that is not files is
//!   `UnshardableSource` (tf.data's `NotFound`); fewer files than shards is tf.data's
//!   `InvalidArgument` "... not enough for the required n shards/workers.". Every op of Sluice is
//!   one tf.data walks through ("pass-through"), so only the source decides.
//! - `Data` adds `shard(n, index)` at the end of the pipeline, before trailing prefetches (as
//!   tf.data does), so every shard runs the whole pipeline and keeps elements `k ≡ index (mod n)`.
//! - `Auto` is `File`, falling back to `Data` only when the source is unshardable by file; like
//!   tf.data, too few files is an error, not a fallback.
//! - `Hint` replaces every `shard(SHARD_HINT, SHARD_HINT)` placeholder, nested datasets'
//!   included, by `shard(n, index)`; a
//!   pipeline without placeholders is unchanged.
//! - `Off` returns the definition unchanged.
//!
//! A placeholder left in place by another policy is refused when the pipeline is executed
//! (`DatasetError::UnresolvedShardHint`), as tf.data refuses it at iterator creation.
//!
//! The rewrite is a pure function of the definition. Picking files needs the file list, so a
//! files source must be expanded first (definitions registered with the service are; a caller
//! with a local definition expands it with `sluice-formats`' `expand_files`); FILE sharding of an
//! unexpanded one is an error.

use sluice_element::pb::op::Kind as OpKind;
use sluice_element::pb::source::Kind as SourceKind;
use sluice_element::{pb, DatasetError};

use crate::nested::{is_leaf_source, source_kind, walk, walk_all_mut, walk_mut};
use crate::render::render_def;
use crate::source_rules::not_expanded;

/// How `auto_shard` splits a pipeline among shards; tf.data's `AutoShardPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoShardPolicy {
    Off,
    Auto,
    File,
    Data,
    Hint,
}

/// Returns the definition that shard `index` of `num_shards` runs.
pub fn auto_shard(
    def: &pb::DatasetDef,
    policy: AutoShardPolicy,
    num_shards: u64,
    index: u64,
) -> Result<pb::DatasetDef, DatasetError> {
    // tf.data's `AutoShard::Init` checks, with its texts.
    if num_shards == 0 {
        return Err(DatasetError::invalid(
            "num_workers should be >= 1, currently 0",
        ));
    }
    if index >= num_shards {
        return Err(DatasetError::invalid(format!(
            "index should be >= 0 and < {num_shards}, currently {index}"
        )));
    }
    if policy != AutoShardPolicy::Off {
        if let Some(err) = crate::python_op::unsplittable_generator(def) {
            return Err(err);
        }
    }
    match policy {
        AutoShardPolicy::Off => Ok(def.clone()),
        // tf.data skips the FILE rewrite for a single shard: every file is shard 0's anyway,
        // and an unshardable source is then no error.
        AutoShardPolicy::File if num_shards == 1 => Ok(def.clone()),
        AutoShardPolicy::File => shard_by_file(def, num_shards, index),
        AutoShardPolicy::Data => Ok(shard_by_data(def, num_shards, index)),
        AutoShardPolicy::Hint => Ok(shard_by_hint(def, num_shards, index)),
        AutoShardPolicy::Auto => match shard_by_file(def, num_shards, index) {
            Err(DatasetError::UnshardableSource(_)) => Ok(shard_by_data(def, num_shards, index)),
            other => other,
        },
    }
}

fn shard_by_file(
    def: &pb::DatasetDef,
    num_shards: u64,
    index: u64,
) -> Result<pb::DatasetDef, DatasetError> {
    let mut unshardable = None;
    walk(def, |d, _| match source_kind(d) {
        Some(kind) if is_leaf_source(kind) && !matches!(kind, SourceKind::Files(_)) => {
            unshardable.get_or_insert(d);
        }
        _ => {}
    });
    if let Some(d) = unshardable {
        let source = pb::DatasetDef {
            source: d.source.clone(),
            ops: Vec::new(),
            options: None,
        };
        return Err(DatasetError::UnshardableSource(render_def(&source)));
    }
    let mut out = def.clone();
    let mut failed = None;
    walk_mut(&mut out, &mut |d| {
        let Some(SourceKind::Files(fs)) = d.source.as_mut().and_then(|s| s.kind.as_mut()) else {
            return;
        };
        if failed.is_some() {
            return;
        }
        if fs.files.is_empty() {
            failed = Some(not_expanded(fs));
            return;
        }
        let num_files = fs.files.len() as u64;
        if num_files < num_shards {
            failed = Some(DatasetError::invalid(not_enough_files(
                num_files, num_shards,
            )));
            return;
        }
        fs.files = std::mem::take(&mut fs.files)
            .into_iter()
            .skip(index as usize)
            .step_by(num_shards as usize)
            .collect();
    });
    match failed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// tf.data's text (from `ShardDatasetOp`), with the advice that concerns tf.distribute replaced
/// by the one that applies here.
fn not_enough_files(num_files: u64, num_shards: u64) -> String {
    format!(
        "Could not apply FILE based sharding: the dataset only has {num_files} file(s), which is \
         not enough for the required {num_shards} shards/workers. Consider setting the sharding \
         policy to either DATA or OFF, or split your input files into a larger number of small \
         files such that number of files is greater than number of shards/workers."
    )
}

fn shard_by_data(def: &pb::DatasetDef, num_shards: u64, index: u64) -> pb::DatasetDef {
    let mut out = def.clone();
    let trailing_prefetches = out
        .ops
        .iter()
        .rev()
        .take_while(|o| matches!(o.kind, Some(OpKind::Prefetch(_))))
        .count();
    let at = out.ops.len() - trailing_prefetches;
    out.ops.insert(at, shard_op(num_shards, index));
    out
}

/// Every placeholder replaced, those in templates (interleave, group_by_window) included:
/// the chains are walked with a stack, not recursion.
fn shard_by_hint(def: &pb::DatasetDef, num_shards: u64, index: u64) -> pb::DatasetDef {
    let mut out = def.clone();
    walk_all_mut(&mut out, &mut |d| {
        for op in &mut d.ops {
            if matches!(&op.kind, Some(OpKind::Shard(s)) if s.hint) {
                *op = shard_op(num_shards, index);
            }
        }
    });
    out
}

fn shard_op(num_shards: u64, index: u64) -> pb::Op {
    pb::Op {
        kind: Some(OpKind::Shard(pb::ShardOp {
            num_shards,
            index,
            hint: false,
        })),
    }
}

#[cfg(test)]
#[path = "autoshard_tests.rs"]
mod tests;

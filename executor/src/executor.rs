//! The local, synchronous executor: a definition (or an op chain) to an iterator of elements.
//!
//! A pipeline is built as a chain of *factories* (closures that create a fresh iterator), one per
//! op, because `repeat` must re-create its upstream for every pass; every other op wraps the
//! iterator its upstream factory creates. Creation counters live in the factories, which gives
//! each source creation its repetition number (distributed_epoch) and each shuffle pass its own
//! derived seed. Functions are resolved when the pipeline is built, so an unknown name fails
//! `iterate` itself, not the first element.
//!
//! A definition that holds others (zip, sample_from_datasets and choose_from_datasets sources,
//! concatenate ops) is built the same way, each nested definition to a factory of its own
//! (`build`), combined by the iterators of `ops::nested`. In distributed_epoch mode every leaf
//! source of the tree (range, slices, files, from_tensors) reads the splits of its own provider
//! (`split_providers`, numbered in the order `nested::walk` visits them), and a `repeat`
//! tells a pass its sources got no split in from an empty one by the splits of the sources
//! below it.
//!
//! Two things a pipeline's owner hands in through `ExecOptions` reach every op: the memory
//! budget (ops that hold elements reserve their bytes on it) and the cancellation flag (ops
//! that may pull many elements before yielding one check it inside their loops).
//!
//! `enumerate` in distributed_epoch mode: a worker sees only the splits it was handed, so a
//! counter of its own would restart at 0 on every worker. Instead the index is the element's
//! position in the source, which for range and slices sources is its split index. The ops up to
//! the last `enumerate` then run on *carriers* `(split index, element)`: maps apply to the
//! element, each `enumerate` reads the index. Only ops that keep one element per split in order
//! (map and the native per-element ops decode_image and resize, prefetch, enumerate) may come
//! before an `enumerate` there; anything else is refused
//! (`enumerate_prefix`), never answered with indices that would not recover the order.
//!
//! Errors of per-element ops (map, filter, decode_image, resize, parse_example) downstream of a
//! files source name the element's file and record when that is known exactly: only while
//! every op between the source and the failing one passes elements one by one in source order
//! (`keeps_origin`; see `OriginCell` in `sluice-element`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sluice_element::pb::op::Kind as OpKind;
use sluice_element::pb::source::Kind as SourceKind;
use sluice_element::{
    pb, Cancellation, DatasetError, Element, ElementIter, OriginCell, PythonRunner, Tensor,
};
use sluice_formats::{expand_files, image_ops, ExampleParser, FileAccess};
use sluice_pipeline::image_spec;
use sluice_pipeline::interleave::{self as interleave_rules, resolve_template};
use sluice_pipeline::nested::{is_leaf_source, source_children, source_kind};
use sluice_pipeline::source_rules::has_file_list;
use sluice_pipeline::{
    split_providers, validate, FunctionRegistry, MapFn, PipelineLimits, PredicateFn,
};

use crate::memory_budget::{MemoryShare, Reservation};
use crate::ops::batch::BatchIter;
use crate::ops::cache::{cache_factory, snapshot_as_cache};
use crate::ops::group_by_window::{GroupSpec, KeyFn, ReduceFn, WindowSizeFn};
use crate::ops::interleave::{InterleaveSpec, MakeInner};
use crate::ops::nested::{ConcatIter, MixIter, Picker, ZipIter, ZipShape};
use crate::ops::padded_batch::Padding;
use crate::ops::prefetch::prefetch;
use crate::ops::repeat::RepeatIter;
use crate::ops::shuffle::{pass_seed, ShuffleIter};
use crate::ops::unbatch::UnbatchIter;
use crate::ops::Factory;
use crate::python_fn::{self, PythonStage};
use crate::sources::{Source, SplitCount, SplitIter};
use crate::splits::SplitSupplier;
use crate::stack_guard::{guard_after, guard_factory, guard_iter};

/// How to execute: which registry resolves function names, where splits come from, and which
/// files may be read.
#[derive(Clone)]
pub struct ExecOptions {
    pub registry: Arc<FunctionRegistry>,
    /// `Some` in distributed_epoch mode: each source yields only the splits supplied for its
    /// split provider.
    pub splits: Option<Arc<dyn SplitSupplier>>,
    /// Unrestricted in the user's own process (the default); a server's data roots on a
    /// worker, checked before each file is opened.
    pub file_access: FileAccess,
    /// Runs the definition's Python ops; `None` refuses them (`DatasetError::PythonRuntime`).
    pub python: Option<Arc<dyn PythonRunner>>,
    /// The bytes the pipeline's buffers (batch, shuffle, prefetch) may hold, shared with the
    /// owner's other pipelines; `None` (local execution): unlimited.
    pub memory: Option<Arc<MemoryShare>>,
    /// Stops the pipeline inside its ops when set (a worker's deleted task); the default is
    /// never set.
    pub cancel: Cancellation,
    /// The most ops and the deepest structures a definition may have; a larger one is refused
    /// before anything is built (`DatasetError::InvalidArgument`). A worker passes its own
    /// `--max-pipeline-ops` and `--max-pipeline-depth`; the default is the servers' default.
    pub limits: PipelineLimits,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            registry: FunctionRegistry::global(),
            splits: None,
            file_access: FileAccess::Unrestricted,
            python: None,
            memory: None,
            cancel: Cancellation::default(),
            limits: PipelineLimits::default(),
        }
    }
}

impl std::fmt::Debug for ExecOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecOptions")
            .field("registry", &self.registry)
            .field("splits", &self.splits.as_ref().map(|_| "SplitSupplier"))
            .field("file_access", &self.file_access)
            .field("python", &self.python)
            .field("memory", &self.memory)
            .field("cancel", &self.cancel)
            .field("limits", &self.limits)
            .finish()
    }
}

/// Runs a whole definition. An unexpanded files source is expanded here (local execution), as
/// `opts.file_access` allows. An expanded one (registered with the service) is not checked as a
/// whole: each file is checked as it is opened, so a file refused or missing here fails only the
/// split that names it.
pub fn iterate(def: &pb::DatasetDef, opts: &ExecOptions) -> Result<ElementIter, DatasetError> {
    opts.limits.check(def)?;
    let mut def = def.clone();
    if !has_file_list(&def) {
        expand_files(&mut def, &opts.file_access)?;
    }
    validate(&def, &opts.registry)?;
    // In distributed_epoch mode: the split provider of each source of the tree.
    let providers = match &opts.splits {
        None => None,
        Some(_) => {
            if let Some(err) = sluice_pipeline::python_op::unsplittable_generator(&def) {
                return Err(err);
            }
            sluice_pipeline::check_distributed_epoch(&def)?;
            let providers = split_providers(&def)?;
            Some(Providers(
                providers
                    .into_iter()
                    .zip(0u32..)
                    .map(|(d, p)| (d as *const pb::DatasetDef, p))
                    .collect(),
            ))
        }
    };
    let built = build(&def, opts, providers.as_ref())?;
    (built.factory)()
}

/// In distributed_epoch mode: the definitions (of the tree being built, by address) whose
/// sources read splits, each to its provider index.
struct Providers(HashMap<*const pb::DatasetDef, u32>);

impl Providers {
    fn of(&self, def: &pb::DatasetDef) -> Option<u32> {
        self.0.get(&(def as *const pb::DatasetDef)).copied()
    }
}

/// A definition (or a nested one) ready to iterate: its factory, and in distributed_epoch mode
/// the split counts of the sources in it that have splits to hand out.
struct Built {
    factory: Factory,
    received: Vec<SplitCount>,
}

/// Builds `def`'s factory. `providers` (distributed_epoch mode only) names the sources that
/// read splits, and from which provider; without it every source is read whole.
fn build(
    def: &pb::DatasetDef,
    opts: &ExecOptions,
    providers: Option<&Providers>,
) -> Result<Built, DatasetError> {
    let provider = providers.and_then(|p| p.of(def));
    let mut carried = 0;
    // `Some` while the source's origin cell is exact for the next op.
    let mut origin = None;
    // In distributed_epoch mode, with splits to hand out: what `repeat` counts passes by.
    let mut received = Vec::new();
    let mut factory: Factory = match source_kind(def) {
        Some(kind) if !is_leaf_source(kind) => {
            let (factory, nested_received) = build_combined(def, kind, opts, providers)?;
            if !nested_received.is_empty() && def.ops.iter().any(is_enumerate) {
                return Err(DatasetError::invalid(
                    "enumerate in distributed_epoch mode needs a range or from_slices source \
                     directly before it, not a zip, sample_from_datasets or \
                     choose_from_datasets, whose inputs read splits of their own: its index is \
                     the element's split index, its position in the source",
                ));
            }
            received = nested_received;
            factory
        }
        _ => {
            let source = Arc::new(Source::from_def(def, &opts.file_access)?);
            origin = source.origin().cloned();
            match (&opts.splits, provider) {
                (Some(supplier), Some(provider)) => {
                    carried = enumerate_prefix(&def.ops, &source)?;
                    let count = SplitCount::default();
                    if source.num_splits() > 0 {
                        received.push(count.clone());
                    }
                    let supplier = supplier.clone();
                    let repetitions = AtomicU64::new(0);
                    let cancel = opts.cancel.clone();
                    Arc::new(move || {
                        let repetition = repetitions.fetch_add(1, Ordering::Relaxed);
                        Ok(Box::new(SplitIter::new(
                            source.clone(),
                            supplier.clone(),
                            provider,
                            repetition,
                            count.clone(),
                            carried > 0,
                            cancel.clone(),
                        )) as ElementIter)
                    })
                }
                _ => Arc::new(move || Ok(source.iter_all())),
            }
        }
    };
    for (i, op) in def.ops.iter().enumerate() {
        let naming = origin.clone();
        if !keeps_origin(op) {
            origin = None;
        }
        if i < carried {
            let stage = Stage::on_carriers(op, opts, i + 1 == carried)?.naming_origin(naming);
            let upstream = factory;
            factory = Arc::new(move || stage.apply(upstream()?));
            continue;
        }
        factory = match &op.kind {
            Some(OpKind::Repeat(r)) => {
                let (upstream, count, cancel) = (factory, r.count, opts.cancel.clone());
                let received = received.clone();
                Arc::new(move || {
                    Ok(Box::new(RepeatIter::new(
                        upstream.clone(),
                        count,
                        received.clone(),
                        cancel.clone(),
                    )) as ElementIter)
                })
            }
            Some(OpKind::Concatenate(c)) => {
                let other = c
                    .other
                    .as_ref()
                    .ok_or_else(|| DatasetError::invalid("concatenate has no dataset to append"))?;
                let other = build(other, opts, providers)?;
                received.extend(other.received);
                let (upstream, second) = (factory, other.factory);
                Arc::new(move || {
                    Ok(Box::new(ConcatIter::new(upstream()?, second.clone())) as ElementIter)
                })
            }
            Some(OpKind::Cache(c)) if c.snapshot => {
                let upstream = pb::DatasetDef {
                    source: def.source.clone(),
                    ops: def.ops[..i].to_vec(),
                    options: def.options,
                };
                cache_factory(factory, &snapshot_as_cache(c, &upstream), opts)?
            }
            Some(OpKind::Cache(c)) => cache_factory(factory, c, opts)?,
            _ => {
                let stage = Stage::new(op, opts)?.naming_origin(naming);
                let upstream = factory;
                Arc::new(move || stage.apply(upstream()?))
            }
        };
        if guard_after(i) {
            factory = guard_factory(factory);
        }
    }
    Ok(Built { factory, received })
}

fn is_enumerate(op: &pb::Op) -> bool {
    matches!(op.kind, Some(OpKind::Enumerate(_)))
}

/// The factory of a zip, sample or choose source over its nested definitions, and the split
/// counts of the sources in them that have splits to hand out.
fn build_combined(
    def: &pb::DatasetDef,
    kind: &SourceKind,
    opts: &ExecOptions,
    providers: Option<&Providers>,
) -> Result<(Factory, Vec<SplitCount>), DatasetError> {
    let mut received = Vec::new();
    let mut inputs = Vec::new();
    for input in source_children(def) {
        let built = build(input, opts, providers)?;
        received.extend(built.received);
        inputs.push(built.factory);
    }
    let open = |inputs: &[Factory]| -> Result<Vec<ElementIter>, DatasetError> {
        inputs.iter().map(|f| f()).collect()
    };
    let cancel = opts.cancel.clone();
    let factory: Factory = match kind {
        SourceKind::Zip(z) => {
            let shape = if z.keys.is_empty() {
                ZipShape::Tuple
            } else {
                ZipShape::Dict(z.keys.clone())
            };
            Arc::new(move || {
                Ok(Box::new(ZipIter::new(open(&inputs)?, shape.clone())) as ElementIter)
            })
        }
        SourceKind::Sample(s) => {
            // No seed: one random seed per pipeline, derived per pass as shuffle's is.
            let seed = s.seed.unwrap_or_else(rand::random);
            let (weights, stop) = (s.weights.clone(), s.stop_on_empty_dataset);
            let passes = AtomicU64::new(0);
            Arc::new(move || {
                let pass = passes.fetch_add(1, Ordering::Relaxed);
                let picker = MixIter::sampler(&weights, inputs.len(), pass_seed(seed, pass));
                Ok(
                    Box::new(MixIter::new(open(&inputs)?, picker, stop, cancel.clone()))
                        as ElementIter,
                )
            })
        }
        SourceKind::Choose(c) => {
            // `source_children` lists the choice dataset last.
            let choice = inputs.pop().ok_or_else(|| {
                DatasetError::invalid("choose_from_datasets has no choice dataset")
            })?;
            let stop = c.stop_on_empty_dataset;
            Arc::new(move || {
                let picker = Picker::Choose(choice()?);
                Ok(
                    Box::new(MixIter::new(open(&inputs)?, picker, stop, cancel.clone()))
                        as ElementIter,
                )
            })
        }
        _ => unreachable!("only zip, sample and choose sources hold datasets"),
    };
    Ok((factory, received))
}

/// Whether the source's origin cell still holds the origin of the element `op` passes on: `op`
/// yields each element (or none) as it pulls it, in order, on the pulling thread. A buffer
/// (shuffle, prefetch), a batch or a Python op (an executor pool reads ahead) breaks that.
fn keeps_origin(op: &pb::Op) -> bool {
    match &op.kind {
        Some(
            OpKind::Map(_)
            | OpKind::Filter(_)
            | OpKind::Repeat(_)
            | OpKind::Take(_)
            | OpKind::Skip(_)
            | OpKind::Shard(_)
            | OpKind::Enumerate(_)
            | OpKind::DecodeImage(_)
            | OpKind::Resize(_)
            | OpKind::ParseExample(_)
            | OpKind::IgnoreErrors(_)
            | OpKind::TakeWhile(_),
        ) => true,
        Some(OpKind::Prefetch(p)) => p.buffer_size == 0,
        Some(
            OpKind::Batch(_)
            | OpKind::Shuffle(_)
            | OpKind::PyFunction(_)
            | OpKind::PaddedBatch(_)
            | OpKind::Unbatch(_)
            | OpKind::Cache(_)
            | OpKind::Concatenate(_)
            | OpKind::Interleave(_)
            | OpKind::GroupByWindow(_),
        )
        | None => false,
    }
}

/// How many leading ops run on `(split index, element)` carriers in distributed_epoch mode:
/// up to and including the last `enumerate`, 0 without one. Errors if an `enumerate` could not
/// get the element's position in the source (see the module header).
fn enumerate_prefix(ops: &[pb::Op], source: &Source) -> Result<usize, DatasetError> {
    let Some(last) = ops
        .iter()
        .rposition(|op| matches!(op.kind, Some(OpKind::Enumerate(_))))
    else {
        return Ok(0);
    };
    let keeps_positions = ops[..last].iter().all(|op| {
        matches!(
            op.kind,
            Some(
                OpKind::Map(_)
                    | OpKind::DecodeImage(_)
                    | OpKind::Resize(_)
                    | OpKind::Prefetch(_)
                    | OpKind::Enumerate(_)
            )
        )
    });
    if !source.split_is_one_element() || !keeps_positions {
        return Err(DatasetError::invalid(
            "enumerate in distributed_epoch mode needs a range or from_slices source with only \
             map, decode_image, resize, prefetch or enumerate before it: its index is the element's \
             split index, its position in the source",
        ));
    }
    Ok(last + 1)
}

/// Applies ops to an existing stream (client-side ops after `distribute`). `repeat` is refused:
/// the input cannot be re-created.
pub fn apply_ops(
    input: ElementIter,
    ops: &[pb::Op],
    opts: &ExecOptions,
) -> Result<ElementIter, DatasetError> {
    opts.limits.check_ops(ops)?;
    let mut it = input;
    for (i, op) in ops.iter().enumerate() {
        if let Some(OpKind::Repeat(_)) = op.kind {
            return Err(DatasetError::invalid(
                "repeat cannot be applied to a distributed dataset on the client; put it in the dataset before distribute",
            ));
        }
        if let Some(OpKind::Cache(c)) = &op.kind {
            if c.snapshot {
                return Err(DatasetError::invalid(
                    "snapshot cannot be applied to a distributed dataset on the client; put it \
                     in the dataset before distribute",
                ));
            }
            // One pass of a stream that cannot be re-created: filled, never replayed (a file
            // cache is still written, for a later run).
            let taken = std::sync::Mutex::new(Some(it));
            let upstream: Factory = Arc::new(move || {
                taken
                    .lock()
                    .map_err(|_| DatasetError::invalid("cache input lock poisoned"))?
                    .take()
                    .ok_or_else(|| DatasetError::invalid("cache input already taken"))
            });
            it = cache_factory(upstream, c, opts)?()?;
            continue;
        }
        it = Stage::new(op, opts)?.apply(it)?;
        if guard_after(i) {
            it = guard_iter(it);
        }
    }
    Ok(it)
}

/// One non-repeat op, with its functions resolved, and what its iterators share: the memory
/// budget and the cancellation flag.
struct Stage {
    kind: StageKind,
    memory: Option<Arc<MemoryShare>>,
    cancel: Cancellation,
}

enum StageKind {
    Map(MapFn),
    Filter(PredicateFn),
    Batch {
        size: usize,
        drop_remainder: bool,
    },
    Shuffle {
        buffer: usize,
        seed: u64,
        passes: AtomicU64,
    },
    Take(usize),
    Skip(u64),
    Shard {
        num_shards: u64,
        index: u64,
    },
    Prefetch(usize),
    ParseExample(Arc<ExampleParser>),
    Python(PythonStage),
    PaddedBatch {
        size: usize,
        drop_remainder: bool,
        padding: Arc<Padding>,
    },
    Unbatch,
    IgnoreErrors {
        log_warning: bool,
    },
    /// `(start + i, element)` for the i-th element of each new iterator.
    Enumerate(i64),
    Interleave(InterleaveSpec),
    GroupByWindow(GroupSpec),
    /// The elements before the first one the predicate drops.
    TakeWhile(PredicateFn),
    /// A map on a carrier's element, keeping its split index.
    MapCarried(MapFn),
    /// `enumerate` on carriers: the index is `start + split index`. The last one of the prefix
    /// (`unwrap`) yields plain elements again.
    EnumerateCarried {
        start: i64,
        unwrap: bool,
    },
}

fn to_usize(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

impl Stage {
    fn new(op: &pb::Op, opts: &ExecOptions) -> Result<Stage, DatasetError> {
        Ok(Stage::of(StageKind::new(op, opts)?, opts))
    }

    fn on_carriers(op: &pb::Op, opts: &ExecOptions, last: bool) -> Result<Stage, DatasetError> {
        Ok(Stage::of(StageKind::on_carriers(op, opts, last)?, opts))
    }

    fn of(kind: StageKind, opts: &ExecOptions) -> Stage {
        Stage {
            kind,
            memory: opts.memory.clone(),
            cancel: opts.cancel.clone(),
        }
    }

    fn naming_origin(self, cell: Option<OriginCell>) -> Stage {
        Stage {
            kind: self.kind.naming_origin(cell),
            ..self
        }
    }

    fn apply(&self, input: ElementIter) -> Result<ElementIter, DatasetError> {
        self.kind.apply(input, &self.memory, &self.cancel)
    }
}

impl StageKind {
    /// This stage, its errors on an element prefixed with the element's origin from `cell`
    /// (`None`: not known exactly here). Only per-element stages fail on one element.
    fn naming_origin(self, cell: Option<OriginCell>) -> StageKind {
        let Some(cell) = cell else { return self };
        let named = |f: MapFn| -> MapFn {
            let cell = cell.clone();
            Arc::new(move |e| f(e).map_err(|err| cell.attach(err)))
        };
        match self {
            StageKind::Map(f) => StageKind::Map(named(f)),
            StageKind::MapCarried(f) => StageKind::MapCarried(named(f)),
            StageKind::ParseExample(parser) => {
                StageKind::Map(named(Arc::new(move |e| parser.parse(&e))))
            }
            StageKind::Filter(pred) => {
                StageKind::Filter(Arc::new(move |e| pred(e).map_err(|err| cell.attach(err))))
            }
            other => other,
        }
    }

    /// The stage of an op that runs on carriers (`enumerate_prefix` allowed only map,
    /// prefetch and enumerate there).
    fn on_carriers(op: &pb::Op, opts: &ExecOptions, last: bool) -> Result<StageKind, DatasetError> {
        Ok(match &op.kind {
            Some(OpKind::Map(m)) => StageKind::MapCarried(opts.registry.map_fn(&m.function)?.0),
            Some(OpKind::DecodeImage(_) | OpKind::Resize(_)) => match StageKind::new(op, opts)? {
                StageKind::Map(f) => StageKind::MapCarried(f),
                _ => unreachable!("the image ops are per-element maps"),
            },
            Some(OpKind::Enumerate(e)) => StageKind::EnumerateCarried {
                start: e.start,
                unwrap: last,
            },
            _ => StageKind::new(op, opts)?,
        })
    }

    fn new(op: &pb::Op, opts: &ExecOptions) -> Result<StageKind, DatasetError> {
        Ok(match &op.kind {
            None => return Err(DatasetError::invalid("dataset definition has an empty op")),
            Some(OpKind::Map(m)) => StageKind::Map(opts.registry.map_fn(&m.function)?.0),
            Some(OpKind::Filter(f)) => StageKind::Filter(opts.registry.filter_fn(&f.predicate)?),
            Some(OpKind::Batch(b)) => {
                if b.batch_size == 0 {
                    return Err(DatasetError::invalid("batch size must be positive, got 0"));
                }
                StageKind::Batch {
                    size: to_usize(b.batch_size),
                    drop_remainder: b.drop_remainder,
                }
            }
            Some(OpKind::Shuffle(s)) => {
                if s.buffer_size == 0 {
                    return Err(DatasetError::invalid(
                        "shuffle buffer size must be positive, got 0",
                    ));
                }
                // No seed: one random seed per pipeline, still derived per pass.
                let seed = s.seed.unwrap_or_else(rand::random);
                StageKind::Shuffle {
                    buffer: to_usize(s.buffer_size),
                    seed,
                    passes: AtomicU64::new(0),
                }
            }
            Some(OpKind::Repeat(_)) => unreachable!("repeat is handled by the caller"),
            Some(OpKind::Cache(_)) => unreachable!("cache is handled by the caller"),
            Some(OpKind::PaddedBatch(p)) => StageKind::PaddedBatch {
                size: to_usize(p.batch_size),
                drop_remainder: p.drop_remainder,
                padding: Arc::new(Padding::new(p)?),
            },
            Some(OpKind::Unbatch(_)) => StageKind::Unbatch,
            Some(OpKind::IgnoreErrors(i)) => StageKind::IgnoreErrors {
                log_warning: i.log_warning,
            },
            Some(OpKind::Concatenate(_)) => {
                return Err(DatasetError::invalid(
                    "concatenate cannot be applied to a distributed dataset on the client; put \
                     it in the dataset before distribute",
                ))
            }
            Some(OpKind::Take(t)) => StageKind::Take(to_usize(t.count)),
            Some(OpKind::Skip(s)) => StageKind::Skip(s.count),
            Some(OpKind::Shard(s)) if s.hint => return Err(DatasetError::UnresolvedShardHint),
            Some(OpKind::Shard(s)) => {
                if s.num_shards == 0 || s.index >= s.num_shards {
                    return Err(DatasetError::invalid(format!(
                        "shard index {} must be less than the number of shards {}",
                        s.index, s.num_shards
                    )));
                }
                StageKind::Shard {
                    num_shards: s.num_shards,
                    index: s.index,
                }
            }
            Some(OpKind::Prefetch(p)) => StageKind::Prefetch(to_usize(p.buffer_size)),
            Some(OpKind::Enumerate(e)) => StageKind::Enumerate(e.start),
            Some(OpKind::DecodeImage(d)) => {
                image_spec::check_decode_image(d)?;
                let d = d.clone();
                StageKind::Map(Arc::new(move |e| image_ops::decode_image(&d, e)))
            }
            Some(OpKind::Resize(r)) => {
                image_spec::check_resize(r)?;
                let r = r.clone();
                StageKind::Map(Arc::new(move |e| image_ops::resize(&r, e)))
            }
            Some(OpKind::ParseExample(p)) => {
                StageKind::ParseExample(Arc::new(ExampleParser::new(p)?))
            }
            Some(OpKind::PyFunction(f)) => {
                StageKind::Python(python_fn::prepare(f, opts.python.as_ref())?)
            }
            Some(OpKind::TakeWhile(t)) => {
                StageKind::TakeWhile(opts.registry.filter_fn(&t.predicate)?)
            }
            Some(OpKind::Interleave(i)) => StageKind::Interleave(interleave_spec(i, opts)?),
            Some(OpKind::GroupByWindow(g)) => StageKind::GroupByWindow(group_spec(g, opts)?),
        })
    }

    fn apply(
        &self,
        input: ElementIter,
        memory: &Option<Arc<MemoryShare>>,
        cancel: &Cancellation,
    ) -> Result<ElementIter, DatasetError> {
        Ok(match self {
            StageKind::Map(f) => {
                let f = f.clone();
                Box::new(input.map(move |r| r.and_then(|e| f(e))))
            }
            // Filter, skip and shard may drop many elements in a row inside one `next`: each
            // drop checks the cancellation flag (`dropped`), so a stopped pipeline leaves the
            // loop within one element.
            StageKind::Filter(pred) => {
                let (pred, cancel) = (pred.clone(), cancel.clone());
                Box::new(input.filter_map(move |r| match r {
                    Ok(e) => match pred(&e) {
                        Ok(true) => Some(Ok(e)),
                        Ok(false) => dropped(&cancel),
                        Err(err) => Some(Err(err)),
                    },
                    Err(err) => Some(Err(err)),
                }))
            }
            StageKind::Batch {
                size,
                drop_remainder,
            } => Box::new(BatchIter::new(
                input,
                *size,
                *drop_remainder,
                Reservation::new(memory.clone(), "batch"),
                cancel.clone(),
            )),
            StageKind::PaddedBatch {
                size,
                drop_remainder,
                padding,
            } => Box::new(
                BatchIter::new(
                    input,
                    *size,
                    *drop_remainder,
                    Reservation::new(memory.clone(), "padded_batch"),
                    cancel.clone(),
                )
                .padded(padding.clone()),
            ),
            StageKind::Unbatch => Box::new(UnbatchIter::new(
                input,
                Reservation::new(memory.clone(), "unbatch"),
                cancel.clone(),
            )),
            StageKind::IgnoreErrors { log_warning } => {
                let (log_warning, cancel) = (*log_warning, cancel.clone());
                Box::new(input.filter_map(move |r| match r {
                    Ok(e) => Some(Ok(e)),
                    Err(err) if ends_the_pipeline(&err) => Some(Err(err)),
                    Err(err) => {
                        if log_warning {
                            tracing::warn!("ignore_errors dropped an element: {err}");
                        }
                        dropped(&cancel)
                    }
                }))
            }
            StageKind::Shuffle {
                buffer,
                seed,
                passes,
            } => {
                let pass = passes.fetch_add(1, Ordering::Relaxed);
                Box::new(ShuffleIter::new(
                    input,
                    *buffer,
                    pass_seed(*seed, pass),
                    Reservation::new(memory.clone(), "shuffle"),
                    cancel.clone(),
                ))
            }
            StageKind::Take(n) => Box::new(input.take(*n)),
            StageKind::Skip(n) => {
                // Counts only elements: errors in the skipped prefix are still reported.
                let mut left = *n;
                let cancel = cancel.clone();
                Box::new(input.filter_map(move |r| {
                    if left > 0 && r.is_ok() {
                        left -= 1;
                        dropped(&cancel)
                    } else {
                        Some(r)
                    }
                }))
            }
            StageKind::Shard { num_shards, index } => {
                let (n, i) = (*num_shards, *index);
                let mut k = 0u64;
                let cancel = cancel.clone();
                Box::new(input.filter_map(move |r| match r {
                    Ok(e) => {
                        let keep = k % n == i;
                        k += 1;
                        if keep {
                            Some(Ok(e))
                        } else {
                            dropped(&cancel)
                        }
                    }
                    Err(err) => Some(Err(err)),
                }))
            }
            StageKind::ParseExample(parser) => {
                let parser = parser.clone();
                Box::new(input.map(move |r| r.and_then(|e| parser.parse(&e))))
            }
            StageKind::Python(stage) => stage.apply(input, memory, cancel.clone()),
            StageKind::Interleave(spec) => spec.apply(input, memory, cancel),
            StageKind::GroupByWindow(spec) => spec.apply(input, memory, cancel),
            StageKind::TakeWhile(pred) => {
                let (pred, mut input) = (pred.clone(), input);
                let mut ended = false;
                // An error (of the input or the predicate) is yielded and the stage goes on.
                Box::new(std::iter::from_fn(move || {
                    if ended {
                        return None;
                    }
                    match input.next()? {
                        Ok(e) => match pred(&e) {
                            Ok(true) => Some(Ok(e)),
                            Ok(false) => {
                                ended = true;
                                None
                            }
                            Err(err) => Some(Err(err)),
                        },
                        Err(err) => Some(Err(err)),
                    }
                }))
            }
            StageKind::Prefetch(0) => input,
            StageKind::Prefetch(n) => {
                prefetch(input, *n, Reservation::new(memory.clone(), "prefetch"))
            }
            StageKind::Enumerate(start) => {
                // Counts only elements: an error item does not take an index.
                let mut next = *start;
                Box::new(input.map(move |r| {
                    r.map(|e| {
                        let index = Element::Tensor(Tensor::scalar_i64(next));
                        next = next.wrapping_add(1);
                        Element::Tuple(vec![index, e])
                    })
                }))
            }
            StageKind::MapCarried(f) => {
                let f = f.clone();
                Box::new(input.map(move |r| {
                    r.and_then(|carrier| {
                        let (index, e) = split_carrier(carrier)?;
                        Ok(Element::Tuple(vec![index, f(e)?]))
                    })
                }))
            }
            StageKind::EnumerateCarried { start, unwrap } => {
                let (start, unwrap) = (*start, *unwrap);
                Box::new(input.map(move |r| {
                    r.and_then(|carrier| {
                        let (index, e) = split_carrier(carrier)?;
                        let position = index.as_i64().ok_or_else(|| {
                            DatasetError::invalid("a split index is not an int64 scalar")
                        })?;
                        let enumerated = Element::Tuple(vec![
                            Element::Tensor(Tensor::scalar_i64(start.wrapping_add(position))),
                            e,
                        ]);
                        Ok(if unwrap {
                            enumerated
                        } else {
                            Element::Tuple(vec![index, enumerated])
                        })
                    })
                }))
            }
        })
    }
}

/// The errors `ignore_errors` passes on instead of dropping: those that say the pipeline itself
/// cannot go on (it was stopped, the worker's memory budget or its link to the dispatcher
/// failed, a Python runner is missing or broken, a file is outside the server's data roots, a
/// placeholder was left unresolved), not that one element is bad. Exhaustive, so a new error
/// decides.
fn ends_the_pipeline(err: &DatasetError) -> bool {
    match err {
        DatasetError::Cancelled
        | DatasetError::Splits { .. }
        | DatasetError::ResourceExhausted { .. }
        | DatasetError::MemoryShareExceeded { .. }
        | DatasetError::PythonRuntime(_)
        | DatasetError::FileRefused { .. }
        | DatasetError::UnresolvedShardHint
        | DatasetError::UnshardableSource(_) => true,
        DatasetError::AtRecord { error, .. } => ends_the_pipeline(error),
        DatasetError::Parse { .. }
        | DatasetError::UnknownFunction { .. }
        | DatasetError::InvalidArgument(_)
        | DatasetError::Io { .. }
        | DatasetError::LineTooLong { .. }
        | DatasetError::CorruptRecord { .. }
        | DatasetError::Function { .. }
        | DatasetError::Image { .. }
        | DatasetError::BadExample { .. }
        | DatasetError::Python(_)
        | DatasetError::Codec(_) => false,
    }
}

/// An interleave op ready to run: its inner datasets made from its template (run natively with
/// `opts`, never split: the splits are the outer source's) or by its Python function.
fn interleave_spec(
    op: &pb::InterleaveOp,
    opts: &ExecOptions,
) -> Result<InterleaveSpec, DatasetError> {
    interleave_rules::check(op, &opts.registry)?;
    let make: MakeInner = match (&op.template, &op.function) {
        (Some(template), _) => {
            let template = template.clone();
            let inner_opts = ExecOptions {
                splits: None,
                ..opts.clone()
            };
            Arc::new(move |e| iterate(&resolve_template(&template, &e)?, &inner_opts))
        }
        (None, Some(f)) => {
            let stage = python_fn::prepare(f, opts.python.as_ref())?;
            Arc::new(move |e| stage.call_outputs(e))
        }
        (None, None) => unreachable!("check refuses an interleave without template or function"),
    };
    let cycle_length = match op.cycle_length {
        // tf.data's AUTOTUNE default: the CPU count.
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => to_usize(n),
    };
    let parallel = op.num_parallel_calls.map(|n| match n {
        0 => cycle_length,
        n => to_usize(n).min(interleave_rules::MAX_PARALLEL_CYCLE_LENGTH as usize),
    });
    Ok(InterleaveSpec {
        make,
        cycle_length,
        block_length: to_usize(op.block_length),
        parallel,
    })
}

/// A group_by_window op ready to run: its key and window size functions, and its reduction by
/// its template (run natively with `opts` on the window's elements) or its Python function.
fn group_spec(op: &pb::GroupByWindowOp, opts: &ExecOptions) -> Result<GroupSpec, DatasetError> {
    sluice_pipeline::group_by_window::check(op, &opts.registry)?;
    let key: KeyFn = match &op.key_function {
        Some(f) => {
            let stage = python_fn::prepare(f, opts.python.as_ref())?;
            Arc::new(move |e| single_int64(stage.call_one(e.clone())?, KEY_NOT_INT64))
        }
        None => {
            let f = opts.registry.map_fn(&op.key)?.0;
            Arc::new(move |e| single_int64(vec![f(e.clone())?], KEY_NOT_INT64))
        }
    };
    let window_size: WindowSizeFn = match &op.window_size_function {
        Some(f) => {
            let stage = python_fn::prepare(f, opts.python.as_ref())?;
            Arc::new(move |key| {
                let size = single_int64(
                    stage.call_one(Element::Tensor(Tensor::scalar_i64(key)))?,
                    "`window_size_func` must return a single tf.int64 scalar tensor.",
                )?;
                u64::try_from(size).ok().filter(|n| *n > 0).ok_or_else(|| {
                    DatasetError::invalid(format!(
                        "Window size must be greater than zero, but got {size}."
                    ))
                })
            })
        }
        None => {
            let n = op.window_size;
            Arc::new(move |_| Ok(n))
        }
    };
    let reduce: ReduceFn = match (&op.reduce, &op.reduce_function) {
        (Some(template), _) => {
            let ops = template.ops.clone();
            let inner_opts = ExecOptions {
                splits: None,
                ..opts.clone()
            };
            Arc::new(move |_, window| {
                apply_ops(Box::new(window.into_iter().map(Ok)), &ops, &inner_opts)
            })
        }
        (None, Some(f)) => {
            let stage = python_fn::prepare(f, opts.python.as_ref())?;
            Arc::new(move |key, window| {
                let input = Element::Tuple(vec![
                    Element::Tensor(Tensor::scalar_i64(key)),
                    Element::Tuple(window),
                ]);
                stage.call_outputs(input)
            })
        }
        (None, None) => unreachable!("check refuses a group_by_window without a reduction"),
    };
    Ok(GroupSpec {
        key,
        window_size,
        reduce,
    })
}

/// tf.data's text for a key that is not an int64 scalar.
const KEY_NOT_INT64: &str = "`key_func` must return a single tf.int64 scalar tensor.";

/// The one int64 scalar a function returned, or the error `message`.
fn single_int64(outputs: Vec<Element>, message: &str) -> Result<i64, DatasetError> {
    match outputs.as_slice() {
        [Element::Tensor(t)] if t.dtype() == sluice_element::DType::Int64 && t.rank() == 0 => t
            .as_i64_scalar()
            .ok_or_else(|| DatasetError::invalid(message.to_string())),
        _ => Err(DatasetError::invalid(message.to_string())),
    }
}

/// What a filtering op yields for an element it drops: nothing (its loop goes on to the next
/// element), or `Cancelled` once the pipeline is stopped.
fn dropped(cancel: &Cancellation) -> Option<Result<Element, DatasetError>> {
    cancel.check().err().map(Err)
}

/// A carrier's split index and element.
fn split_carrier(carrier: Element) -> Result<(Element, Element), DatasetError> {
    match carrier {
        Element::Tuple(items) if items.len() == 2 => {
            let mut items = items.into_iter();
            match (items.next(), items.next()) {
                (Some(index), Some(e)) => Ok((index, e)),
                _ => unreachable!("a tuple of length 2 has two items"),
            }
        }
        _ => Err(DatasetError::invalid(
            "internal: expected a (split index, element) carrier",
        )),
    }
}

#[cfg(test)]
#[path = "executor_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "executor_limits_tests.rs"]
mod limits_tests;

#[cfg(test)]
#[path = "executor_autoshard_tests.rs"]
mod autoshard_tests;

#[cfg(test)]
#[path = "executor_example_tests.rs"]
mod example_tests;

#[cfg(test)]
#[path = "executor_files_tests.rs"]
mod files_tests;

#[cfg(test)]
#[path = "executor_image_tests.rs"]
mod image_tests;

#[cfg(test)]
#[path = "executor_origin_tests.rs"]
mod origin_tests;

#[cfg(test)]
#[path = "executor_depth_tests.rs"]
mod depth_tests;

#[cfg(test)]
#[path = "executor_nested_tests.rs"]
mod nested_tests;

#[cfg(test)]
#[path = "executor_linear_tests.rs"]
mod linear_tests;

#[cfg(test)]
#[path = "executor_interleave_tests.rs"]
mod interleave_tests;

//! `DatasetError`: the one error type of the dataset crates (element, pipeline, formats,
//! executor).
//!
//! Messages are lowercase, one line, and name what they are about (file, byte offset, function,
//! column). `is_retryable` is an exhaustive match so a new variant has to decide.

/// Everything that can go wrong while defining, analysing, executing or encoding a dataset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DatasetError {
    /// A malformed dataset expression. `message` is the whole one-line description (it already
    /// names the 1-based `column`), e.g. `invalid dataset expression at column 14: expected ')'
    /// or ',', found 'x'`.
    #[error("{message}")]
    Parse { column: usize, message: String },

    /// A map or filter function that the registry does not know.
    #[error("unknown function '{name}' in {kind}; registered {kind} functions: {}", known.join(", "))]
    UnknownFunction {
        name: String,
        kind: String,
        known: Vec<String>,
    },

    /// A definition, argument or element that breaks a rule (batch size 0, shapes that cannot be
    /// batched, ...).
    #[error("{0}")]
    InvalidArgument(String),

    /// Reading a source file failed. `kind` is the operating system's reason, as
    /// `std::io::ErrorKind` (`NotFound`, `PermissionDenied`, ...), for callers that map it to
    /// their own errors; `message` is its text.
    #[error("cannot read '{path}': {message}")]
    Io {
        path: String,
        kind: std::io::ErrorKind,
        message: String,
    },

    /// A server refused a file of a files source: outside its data roots (after resolving
    /// symlinks), not a regular file, or the server has no roots. `reason` names the roots.
    #[error("refused to read '{path}': {reason}")]
    FileRefused { path: String, reason: String },

    /// A text line longer than the limit (`files::MAX_LINE_BYTES`), refused rather than
    /// buffered without end. `line` is 1-based.
    #[error("line {line} of '{path}' is longer than {limit} bytes, the maximum line length")]
    LineTooLong {
        path: String,
        line: u64,
        limit: usize,
    },

    /// A TFRecord file whose framing or checksums are wrong.
    #[error("corrupt record in '{file}' at byte offset {offset}: {reason}")]
    CorruptRecord {
        file: String,
        offset: u64,
        reason: String,
    },

    /// A registered function failed on an element.
    #[error("function '{name}' failed: {message}")]
    Function { name: String, message: String },

    /// `decode_image` or `resize` failed on an element: a corrupt or unsupported image, an
    /// element of the wrong type, or a size past the bounds. `key` is the dict entry the op
    /// works on, if any.
    #[error("{op}{} failed: {message}", key.as_ref().map(|k| format!(" of key '{k}'")).unwrap_or_default())]
    Image {
        op: &'static str,
        key: Option<String>,
        message: String,
    },
    /// A `tf.train.Example` whose feature does not fit the feature's spec in `parse_example`:
    /// missing without a default, of another type, or with the wrong number of values.
    #[error("parse_example: feature '{feature}' {message}")]
    BadExample { feature: String, message: String },

    /// A per-element op failed on an element of a files source whose origin is known exactly
    /// (see `origin_cell`): `error` prefixed with the file and record.
    #[error("{origin}: {error}")]
    AtRecord {
        origin: crate::record_origin::RecordOrigin,
        error: Box<DatasetError>,
    },

    /// A user's Python function raised an exception (boxed: a traceback is long).
    #[error("{0}")]
    Python(Box<crate::python_exception::PythonException>),

    /// A Python op could not run: no Python runner here (a worker not started with
    /// `--python`), an interpreter or cloudpickle version other than the pickling one, an
    /// executor process that died during the call, or a function that does not unpickle.
    #[error("{0}")]
    PythonRuntime(String),

    /// An encoded element that cannot be decoded.
    #[error("cannot decode element: {0}")]
    Codec(String),

    /// The split supplier (the worker's link to the dispatcher) failed; it decides whether
    /// trying again can help.
    #[error("cannot get next split: {message}")]
    Splits { message: String, retryable: bool },

    /// The consumer went away or the work was stopped.
    #[error("cancelled")]
    Cancelled,

    /// An op that holds elements (a batch being built, a shuffle buffer, a prefetch queue, a
    /// cross-trainer cache) would hold more than the process's memory budget allows: `op`
    /// holds `held` bytes and asked for `needed` more, with `in_use` of the `limit` taken by
    /// every holder together. `setting` is what sizes the budget (`--memory-budget`). gRPC's
    /// `RESOURCE_EXHAUSTED`.
    #[error("{op} needs {needed} more bytes (it holds {held}), more than the memory budget of {limit} bytes has left ({in_use} in use); raise {setting} or make the {op} smaller")]
    ResourceExhausted {
        op: String,
        held: u64,
        needed: u64,
        limit: u64,
        in_use: u64,
        setting: String,
    },

    /// An op of one of several holders of a shared memory budget (a worker's tasks) was refused
    /// for fairness: its holder would pass its fair share while the budget's reserve is needed
    /// by others, or it was past its share when another holder found the budget full (or it
    /// found the budget full because another was past its share). `reason` says which, with
    /// the figures. gRPC's `RESOURCE_EXHAUSTED`.
    #[error("{op} of {holder} needs {needed} more bytes (it holds {held}): {reason}")]
    MemoryShareExceeded {
        op: String,
        holder: String,
        held: u64,
        needed: u64,
        reason: String,
    },

    /// FILE auto-sharding found a source that is not a list of files; tf.data's `NotFound`
    /// text, naming the source.
    #[error("Found an unshardable source dataset: {0}")]
    UnshardableSource(String),

    /// A `shard(SHARD_HINT, SHARD_HINT)` placeholder reached execution: only the HINT sharding
    /// policy resolves it. tf.data's `FailedPrecondition` text, word for word.
    #[error("`tf.data.Dataset.shard(SHARD_HINT, ...)` can only be used in `tf.distribute.Strategy.experimental_distribute_dataset()` with `tf.data.experimental.AutoShardPolicy.HINT` policy, or tf.data service with `tf.data.experimental.service.ShardingPolicy.HINT` processing mode.")]
    UnresolvedShardHint,
}

impl DatasetError {
    /// Whether the same request may succeed if tried again unchanged.
    pub fn is_retryable(&self) -> bool {
        match self {
            DatasetError::Parse { .. } => false,
            DatasetError::UnknownFunction { .. } => false,
            DatasetError::InvalidArgument(_) => false,
            DatasetError::Io { .. } => false,
            DatasetError::FileRefused { .. } => false,
            DatasetError::LineTooLong { .. } => false,
            DatasetError::CorruptRecord { .. } => false,
            DatasetError::Function { .. } => false,
            DatasetError::Image { .. } => false,
            DatasetError::BadExample { .. } => false,
            DatasetError::AtRecord { error, .. } => error.is_retryable(),
            DatasetError::Python(_) => false,
            DatasetError::PythonRuntime(_) => false,
            DatasetError::Codec(_) => false,
            DatasetError::Splits { retryable, .. } => *retryable,
            DatasetError::Cancelled => false,
            // The same definition asks for the same bytes again.
            DatasetError::ResourceExhausted { .. } => false,
            // A holder that found the budget full because of another may succeed once that one
            // gave back; the one past its share asks for the same bytes again.
            DatasetError::MemoryShareExceeded { .. } => false,
            DatasetError::UnshardableSource(_) => false,
            DatasetError::UnresolvedShardHint => false,
        }
    }

    /// `InvalidArgument` with `message`.
    pub fn invalid(message: impl Into<String>) -> Self {
        DatasetError::InvalidArgument(message.into())
    }

    /// `Io` naming `path`, with `err`'s kind and text.
    pub fn io(path: &str, err: &std::io::Error) -> Self {
        DatasetError::Io {
            path: path.to_string(),
            kind: err.kind(),
            message: err.to_string().to_lowercase(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_their_subject() {
        let e = DatasetError::UnknownFunction {
            name: "foo".into(),
            kind: "map".into(),
            known: vec!["identity".into(), "square".into()],
        };
        assert_eq!(
            e.to_string(),
            "unknown function 'foo' in map; registered map functions: identity, square"
        );
        let e = DatasetError::CorruptRecord {
            file: "a.tfrecord".into(),
            offset: 12,
            reason: "bad data crc".into(),
        };
        assert_eq!(
            e.to_string(),
            "corrupt record in 'a.tfrecord' at byte offset 12: bad data crc"
        );
    }

    #[test]
    fn io_errors_keep_their_kind_and_their_text() {
        let err = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "Permission Denied");
        let e = DatasetError::io("a.txt", &err);
        assert_eq!(
            e,
            DatasetError::Io {
                path: "a.txt".into(),
                kind: std::io::ErrorKind::PermissionDenied,
                message: "permission denied".into(),
            }
        );
        assert_eq!(e.to_string(), "cannot read 'a.txt': permission denied");
    }

    #[test]
    fn only_split_errors_can_be_retryable() {
        assert!(DatasetError::Splits {
            message: "no leader".into(),
            retryable: true
        }
        .is_retryable());
        assert!(!DatasetError::Splits {
            message: "gone".into(),
            retryable: false
        }
        .is_retryable());
        assert!(!DatasetError::Cancelled.is_retryable());
        assert!(!DatasetError::Codec("x".into()).is_retryable());
    }
}

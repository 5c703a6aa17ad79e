//! `InvalidValue`: a shared enum was given a value it does not have (a string argument, or a
//! number from a protobuf message). The message is the user-visible text, tf.data's where it has
//! one; every crate turns it into its own `InvalidArgument`.

/// A value a shared enum does not have; the message names the argument and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidValue(pub String);

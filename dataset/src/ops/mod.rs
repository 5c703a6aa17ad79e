//! Iterators of the ops that keep state between elements. Stateless ops (map, filter, take,
//! skip, shard) are closures in `executor.rs`.

pub(crate) mod batch;
pub(crate) mod prefetch;
pub(crate) mod repeat;
pub(crate) mod shuffle;

//! What reaches the caller of an epoch: the elements of one message from a worker (or of the
//! local pipeline), with the permits that account for them, or the error that ended the epoch.
//! The task streams, coordinated reads and the local pipeline produce deliveries;
//! `ElementStream` hands their elements out.

use crate::error::ClientError;
use sluice_element::{DatasetError, Element, PackedDecoder};
use tokio::sync::OwnedSemaphorePermit;

/// Elements of one message from a worker, with the permits that account for them (released
/// when the caller has taken the last of them).
pub(crate) struct Delivered {
    pub elements: Elements,
    pub permit: Option<OwnedSemaphorePermit>,
    /// Their size, for the client metrics (see `client_metrics`).
    pub bytes: u64,
    /// Exactly-once tasks: the task and the indices of the elements in its stream, in order
    /// (what the reader hands out is recorded by them for its states).
    pub indices: Option<(u64, Vec<(u64, u64)>)>,
}

/// The elements of one delivery, front first: decoded already, or packed as the worker sent
/// them and decoded as the caller takes them. Decoding on the caller's thread means a small
/// element's allocation is made and freed by the same thread, and nothing per element is
/// shared between threads.
pub(crate) enum Elements {
    Decoded(std::vec::IntoIter<Element>),
    Packed(PackedDecoder),
}

impl Elements {
    pub(crate) fn one(element: Element) -> Elements {
        Elements::Decoded(vec![element].into_iter())
    }

    #[inline]
    pub(crate) fn remaining(&self) -> usize {
        match self {
            Elements::Decoded(elements) => elements.len(),
            Elements::Packed(elements) => elements.remaining(),
        }
    }

    /// The next element; `None` at the end or when it does not decode (`take_error` says why).
    #[inline]
    pub(crate) fn next_element(&mut self) -> Option<Element> {
        match self {
            Elements::Decoded(elements) => elements.next(),
            Elements::Packed(elements) => elements.next_element(),
        }
    }

    pub(crate) fn take_error(&mut self) -> Option<DatasetError> {
        match self {
            Elements::Decoded(_) => None,
            Elements::Packed(elements) => elements.take_error(),
        }
    }
}

impl Iterator for Elements {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_element() {
            Some(element) => Some(Ok(element)),
            None => self.take_error().map(Err),
        }
    }
}

/// What the iteration loop hands to the caller: elements, or the error that ended the epoch.
pub(crate) type Delivery = Result<Delivered, ClientError>;

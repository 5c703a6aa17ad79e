//! `ReaderLedger`: what one reader of one task was sent and has not acknowledged, so a stream
//! that breaks loses nothing while the worker lives.
//!
//! Elements leave a task's buffer (or a trainer's cursor into a cross-trainer cache) when a
//! stream takes them; from then on the ledger holds them until the reader acknowledges them.
//! The ledger numbers a reader's elements from 0, in the order they were taken, and every
//! message says the number of its first element: a reader that reconnects says how many it
//! received, and the stream resumes there, resending what was sent and not received.
//!
//! Invariants:
//! - `held` is every element numbered `acked..next`, in order, as the messages they were taken
//!   in (a message is a cheap clone: its buffers are shared with the message sent).
//! - Acknowledgements only move `acked` forward, never past `next`.
//! - The elements held are at most the reader's `window` (its credits at most): the stream takes
//!   no new element while the ledger is full, so `max_outstanding_requests` bounds the worker's
//!   memory per reader as it bounds the reader's.
//!
//! The ledger is per message, never per element: one lock and one clone of a message's lengths
//! per message sent. Where ledgers live, and when they go, is `WorkerState`'s business.

use crate::index_list::IndexList;
use sluice_element::Packed;
use std::collections::VecDeque;

/// A reader acknowledged elements it cannot have received.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the reader acknowledged {received} elements, but only {sent} were sent")]
pub struct AckError {
    pub received: u64,
    pub sent: u64,
}

#[derive(Debug, Default)]
pub struct ReaderLedger {
    /// Sequence number of the first element held: every element before it was acknowledged.
    acked: u64,
    /// The sequence number the next element taken gets.
    next: u64,
    /// The elements `acked..next`, as taken, with their task-stream indices (exactly-once
    /// tasks; empty otherwise).
    held: VecDeque<(Packed, IndexList)>,
    /// The stream serving this reader now: a stream opened again for the same reader makes an
    /// older one (on a connection that may not have noticed its break yet) stop.
    generation: u64,
    /// The planted bug's count of acknowledged elements (see `planted_resend`).
    #[cfg(feature = "planted-resend-bug")]
    acked_total: u64,
}

impl ReaderLedger {
    pub fn acked(&self) -> u64 {
        self.acked
    }

    pub fn next(&self) -> u64 {
        self.next
    }

    /// Elements sent (or about to be) and not acknowledged.
    pub fn unacked(&self) -> u64 {
        self.next - self.acked
    }

    /// A new stream serves the reader from now on; returns its generation.
    pub fn open_stream(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }

    /// Whether the stream of `generation` is the reader's newest.
    pub fn is_current(&self, generation: u64) -> bool {
        self.generation == generation
    }

    /// Holds `elements`, taken from the source just now; returns the sequence number of the
    /// first.
    pub fn record(&mut self, elements: Packed, indices: IndexList) -> u64 {
        let first = self.next;
        if !elements.is_empty() {
            self.next += elements.len() as u64;
            self.held.push_back((elements, indices));
        }
        first
    }

    /// The reader has received every element before `received`: those are dropped. An older
    /// acknowledgement than one already seen changes nothing (it was overtaken); one past what
    /// was sent is an error and changes nothing.
    pub fn ack(&mut self, received: u64) -> Result<(), AckError> {
        if received > self.next {
            return Err(AckError {
                received,
                sent: self.next,
            });
        }
        #[cfg(feature = "planted-resend-bug")]
        let again = self.planted_resend(received);
        while self.acked < received {
            let (front, indices) = self.held.front_mut().expect("held covers acked..next");
            let n = (received - self.acked) as usize;
            if front.len() <= n {
                self.acked += front.len() as u64;
                self.held.pop_front();
            } else {
                front.split_to(n);
                indices.split_to(n as u64);
                self.acked += n as u64;
            }
        }
        #[cfg(feature = "planted-resend-bug")]
        if let Some((again, indices)) = again {
            self.record(again, indices);
        }
        Ok(())
    }

    /// Up to `max_elements` held elements from sequence number `from` on (at least `acked`),
    /// and about `max_bytes` at most (one message taken at least): the first's sequence number,
    /// the elements and their indices. `None` when nothing from `from` on is held.
    pub fn unsent(
        &self,
        from: u64,
        max_elements: u64,
        max_bytes: usize,
    ) -> Option<(u64, Packed, IndexList)> {
        let from = from.max(self.acked);
        if from >= self.next || max_elements == 0 {
            return None;
        }
        let mut start = self.acked;
        let mut parts = Vec::new();
        let mut all_indices = IndexList::default();
        let (mut elements, mut bytes) = (0u64, 0usize);
        for (message, indices) in &self.held {
            let end = start + message.len() as u64;
            if end > from {
                let mut part = message.clone();
                let mut indices = indices.clone();
                // Skip what precedes `from`, then keep what the bounds allow (no split, and no
                // allocation, in the common case of a whole message).
                let skip = from.saturating_sub(start) as usize;
                if skip > 0 {
                    part.split_to(skip);
                    indices.split_to(skip as u64);
                }
                let keep = (max_elements - elements) as usize;
                let mut part = part.split_to(keep);
                let indices = indices.split_to(keep as u64);
                if !parts.is_empty() && bytes + part.byte_len() > max_bytes {
                    break;
                }
                elements += part.len() as u64;
                bytes += part.byte_len();
                all_indices.extend(indices);
                parts.push(std::mem::take(&mut part));
                if elements == max_elements || bytes >= max_bytes {
                    break;
                }
            }
            start = end;
        }
        Some((from, Packed::concat(parts), all_indices))
    }

    /// The planted bug of the chaos harness's self-test: once per 500 acknowledged elements,
    /// the last element an acknowledgement up to `received` covers is held again as if it were
    /// new, so the reader receives it twice.
    #[cfg(feature = "planted-resend-bug")]
    fn planted_resend(&mut self, received: u64) -> Option<(Packed, IndexList)> {
        if received <= self.acked {
            return None;
        }
        let before = self.acked_total;
        self.acked_total += received - self.acked;
        if before / 500 == self.acked_total / 500 {
            return None;
        }
        self.unsent(received - 1, 1, usize::MAX)
            .map(|(_, again, indices)| (again, indices))
    }
}

#[cfg(test)]
#[path = "reader_ledger_tests.rs"]
mod tests;

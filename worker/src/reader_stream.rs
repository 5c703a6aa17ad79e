//! `ReaderStream`: one fetch stream's account of its reader: the credits it was granted, and
//! where it stands in the reader's ledger (see `reader_ledger`).
//!
//! A reader that acknowledges shares one ledger between its streams: a stream opened again
//! starts at what the reader says it received, resends what the ledger holds past that, and
//! only then takes new elements. A reader that does not acknowledge (an older reader, a gRPC
//! caller that never asked) gets a ledger of the stream's own, acknowledged as each message is
//! sent: what it was sent is lost with its connection, as it always was for such readers.
//!
//! Invariants: a stream sends only what it holds credits for; it takes a new element only
//! while the ledger holds fewer than the reader's window of unacknowledged elements; and it
//! sends the ledger's elements in order, never skipping one (a resend starts at the reader's
//! count of what it received).
//!
//! Hazard: an older stream of the same reader, on a connection whose break it has not noticed
//! yet, may still be waiting to take elements when the newer one opens. What it takes goes into
//! the ledger all the same (then it stops), so nothing is lost; the newer stream sends it when it
//! next looks at the ledger (its next take, request, or the task's end).

use crate::error::WorkerError;
use crate::index_list::IndexList;
use crate::reader_ledger::ReaderLedger;
use crate::worker_state::{LedgerKey, SharedLedger, WorkerState};
use crate::worker_stats::WorkerStats;
use sluice_element::Packed;
use sluice_proto::worker::{ElementBatch, FetchRequest};
use std::sync::{Arc, MutexGuard};
use tokio::sync::Notify;

pub(crate) struct ReaderStream {
    key: LedgerKey,
    ledger: SharedLedger,
    /// This stream's generation in the ledger: a newer stream of the same reader replaces it.
    generation: u64,
    /// The sequence number this stream sends next.
    cursor: u64,
    /// Credits granted and not used.
    credits: u64,
    /// Whether the reader acknowledges what it receives.
    acknowledges: bool,
    /// Unacknowledged elements the ledger may hold.
    window: u64,
    /// The worker's incarnation, sent with every message of a reader that acknowledges.
    incarnation: u64,
    /// Where what this stream sends is counted.
    stats: Arc<WorkerStats>,
    /// Told of every acknowledgement (an exactly-once task's end waits for them).
    progress: Arc<Notify>,
}

impl ReaderStream {
    /// The stream `first` opens: its reader's ledger (shared when the reader acknowledges),
    /// resumed where the reader says it stands.
    pub(crate) fn open(
        state: &WorkerState,
        first: &FetchRequest,
        ledger: Option<SharedLedger>,
    ) -> Result<ReaderStream, WorkerError> {
        let key = ledger_key(first);
        let ledger = match (first.acknowledges, ledger) {
            (true, Some(ledger)) => ledger,
            (true, None) => state.ledger(key.clone()),
            (false, _) => SharedLedger::default(),
        };
        let (generation, cursor) = {
            let mut held = lock(&ledger);
            let generation = held.open_stream();
            // The reader's count is in sequence numbers of this process only when it names
            // this incarnation: otherwise it has received nothing of this ledger yet.
            let cursor = if first.acknowledges && first.incarnation == state.incarnation {
                held.ack(first.received)
                    .map_err(|source| WorkerError::Ack {
                        task_id: first.task_id,
                        source,
                    })?;
                first.received.max(held.acked())
            } else {
                held.acked()
            };
            (generation, cursor)
        };
        Ok(ReaderStream {
            key,
            ledger,
            generation,
            cursor,
            credits: u64::from(first.credits),
            acknowledges: first.acknowledges,
            window: if first.acknowledges {
                u64::from(first.window.max(1))
            } else {
                u64::MAX
            },
            incarnation: state.incarnation,
            stats: state.stats.clone(),
            progress: state.progress_notify(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, ReaderLedger> {
        lock(&self.ledger)
    }

    pub(crate) fn credits(&self) -> u64 {
        self.credits
    }

    /// Whether a newer stream of the same reader took over.
    pub(crate) fn is_replaced(&self) -> bool {
        !self.lock().is_current(self.generation)
    }

    /// Whether the ledger holds elements this stream has not sent.
    pub(crate) fn has_unsent(&self) -> bool {
        let held = self.lock();
        // What the reader acknowledged it has, whichever stream sent it.
        held.next() > self.cursor.max(held.acked())
    }

    /// New elements the stream may take now: its credits, and the room left in the window.
    pub(crate) fn room(&self) -> u64 {
        let unacked = self.lock().unacked();
        self.credits.min(self.window.saturating_sub(unacked))
    }

    /// A request of the reader: more credits, and what it received by then.
    pub(crate) fn on_request(&mut self, request: &FetchRequest) -> Result<(), WorkerError> {
        self.credits += u64::from(request.credits);
        // A count in another incarnation's numbers (a reader that has not heard from this
        // worker process yet) acknowledges nothing here.
        if self.acknowledges && request.incarnation == self.incarnation {
            self.lock()
                .ack(request.received)
                .map_err(|source| WorkerError::Ack {
                    task_id: self.key.task_id,
                    source,
                })?;
            self.progress.notify_waiters();
        }
        Ok(())
    }

    /// Holds elements just taken from the source, with their task-stream indices (empty but
    /// for exactly-once tasks).
    pub(crate) fn record(&self, (elements, indices): (Packed, IndexList)) {
        self.lock().record(elements, indices);
    }

    /// The next message of held elements this stream has not sent (as many as its credits and
    /// a message's byte bound allow), counted as sent; `None` when there are none or no
    /// credits.
    pub(crate) fn next_unsent(&mut self, max_bytes: usize) -> Option<(ElementBatch, Packed)> {
        let (first, elements, indices) = {
            let mut held = self.lock();
            let unsent = held.unsent(self.cursor, self.credits, max_bytes)?;
            if !self.acknowledges {
                // Nobody will acknowledge it: it is as good as received once it leaves.
                let sent = unsent.0 + unsent.1.len() as u64;
                held.ack(sent).expect("sent elements were held");
            }
            unsent
        };
        let n = elements.len() as u64;
        self.stats.record_served(n, elements.byte_len() as u64);
        self.cursor = first + n;
        self.credits -= n;
        let header = ElementBatch {
            index_runs: indices.flattened(),
            ..self.header(first)
        };
        Some((header, elements))
    }

    /// A message's fields that say where it stands in the sequence (set for readers that
    /// acknowledge only): `first` is its first element's number (or the end's).
    pub(crate) fn header(&self, first: u64) -> ElementBatch {
        if !self.acknowledges {
            return ElementBatch::default();
        }
        ElementBatch {
            first_sequence: first,
            incarnation: self.incarnation,
            ..Default::default()
        }
    }

    /// The end's message header: after everything held.
    pub(crate) fn end_header(&self) -> ElementBatch {
        self.header(self.cursor)
    }

    /// After the end was sent: whether the reader's acknowledgement of `request` covers it, in
    /// which case its ledger is dropped (nothing is left to resend).
    pub(crate) fn acknowledged_end(&mut self, state: &WorkerState, request: &FetchRequest) -> bool {
        if !self.acknowledges {
            return true;
        }
        if self.on_request(request).is_err() {
            return false;
        }
        let done = {
            let held = self.lock();
            held.acked() == held.next()
        };
        if done {
            state.forget_ledger(&self.key, &self.ledger);
        }
        done
    }

    pub(crate) fn acknowledges(&self) -> bool {
        self.acknowledges
    }
}

/// The ledger a stream's first request names.
pub(crate) fn ledger_key(first: &FetchRequest) -> LedgerKey {
    LedgerKey {
        task_id: first.task_id,
        client_id: first.client_id,
        trainer_id: first.trainer_id.clone(),
    }
}

fn lock(ledger: &SharedLedger) -> MutexGuard<'_, ReaderLedger> {
    ledger.lock().expect("reader ledger lock poisoned")
}

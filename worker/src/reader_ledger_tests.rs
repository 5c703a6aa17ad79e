use super::*;
use crate::index_list::IndexList;
use bytes::Bytes;
use sluice_element::PackedBuilder;

/// `n` elements whose encodings are their sequence numbers, from `first` on.
fn run(first: u64, n: u64) -> Packed {
    let mut builder = PackedBuilder::default();
    for seq in first..first + n {
        builder.push_encoded(&seq.to_le_bytes(), Bytes::new());
    }
    builder.finish()
}

/// The sequence numbers `elements` carry.
fn seqs(elements: &Packed) -> Vec<u64> {
    elements
        .encoded()
        .map(|(head, _)| u64::from_le_bytes(head[..].try_into().expect("8 bytes")))
        .collect()
}

/// The stream indices the elements of `run(first, n)` are recorded with: `1000 + seq`, so a
/// test sees that indices travel with their elements.
fn indices(first: u64, n: u64) -> IndexList {
    IndexList::from_runs([(1000 + first, 1000 + first + n)])
}

/// A ledger that was given `messages` (sizes, in order) and acknowledged up to `acked`.
fn ledger(messages: &[u64], acked: u64) -> ReaderLedger {
    let mut ledger = ReaderLedger::default();
    for &n in messages {
        let first = ledger.next();
        assert_eq!(ledger.record(run(first, n), indices(first, n)), first);
    }
    ledger.ack(acked).expect("acknowledged what was sent");
    ledger
}

/// Each row: the messages recorded, what was acknowledged, then a resend from `from` of at most
/// `max` elements and `bytes` bytes (8 per element): the sequence numbers it carries.
#[test]
fn unsent_resends_exactly_what_follows_the_reader_count() {
    type Row = (&'static [u64], u64, (u64, u64, usize), Option<Vec<u64>>);
    let rows: Vec<Row> = vec![
        // Nothing sent yet.
        (&[], 0, (0, 10, 1 << 20), None),
        // One message, all of it.
        (&[4], 0, (0, 10, 1 << 20), Some(vec![0, 1, 2, 3])),
        // Resumed mid-message.
        (&[4], 0, (2, 10, 1 << 20), Some(vec![2, 3])),
        // Across messages, bounded by the credits.
        (&[2, 3, 2], 0, (1, 3, 1 << 20), Some(vec![1, 2, 3])),
        // Acknowledged elements are never resent, whatever the reader asks.
        (&[2, 3, 2], 4, (0, 10, 1 << 20), Some(vec![4, 5, 6])),
        // Bounded by bytes: whole messages past the first one only.
        (&[2, 3, 2], 0, (0, 10, 24), Some(vec![0, 1])),
        (&[2, 3, 2], 0, (0, 10, 40), Some(vec![0, 1, 2, 3, 4])),
        // One message at least, however small the byte bound.
        (&[3], 0, (0, 10, 1), Some(vec![0, 1, 2])),
        // Everything was sent to this cursor already.
        (&[2, 3], 0, (5, 10, 1 << 20), None),
        // No credits.
        (&[2, 3], 0, (0, 0, 1 << 20), None),
    ];
    for (messages, acked, (from, max, bytes), want) in rows {
        let ledger = ledger(messages, acked);
        let got = ledger.unsent(from, max, bytes);
        let got_seqs = got.as_ref().map(|(_, elements, _)| seqs(elements));
        assert_eq!(got_seqs, want, "{messages:?} acked {acked}, from {from}");
        if let (Some((first, _, got_indices)), Some(want)) = (got, &want) {
            assert_eq!(
                first, want[0],
                "the first sequence number is the first element's"
            );
            assert_eq!(
                got_indices,
                indices(want[0], want.len() as u64),
                "the indices are the elements' own"
            );
        }
    }
}

/// Each row: the messages recorded, then acknowledgements in turn: what is held after them
/// (first held, next), or the error of the last.
#[test]
fn acknowledgements_only_move_forward_and_never_past_what_was_sent() {
    type Row = (&'static [u64], &'static [u64], Result<(u64, u64), AckError>);
    let rows: Vec<Row> = vec![
        (&[3, 2], &[], Ok((0, 5))),
        (&[3, 2], &[3], Ok((3, 5))),
        // Mid-message: the rest of the message stays.
        (&[3, 2], &[1], Ok((1, 5))),
        (&[3, 2], &[5], Ok((5, 5))),
        // An older acknowledgement (overtaken by a newer one) changes nothing.
        (&[3, 2], &[4, 2], Ok((4, 5))),
        // Past what was sent: an error, and nothing changes.
        (
            &[3, 2],
            &[2, 6],
            Err(AckError {
                received: 6,
                sent: 5,
            }),
        ),
    ];
    for (messages, acks, want) in rows {
        let mut ledger = ledger(messages, 0);
        let mut got = Ok(());
        for &ack in acks {
            got = ledger.ack(ack);
        }
        let got = got.map(|()| (ledger.acked(), ledger.next()));
        assert_eq!(got, want, "{messages:?} acks {acks:?}");
        if want.is_err() {
            assert_eq!(
                (ledger.acked(), ledger.next()),
                (2, 5),
                "a bad ack changed nothing"
            );
        }
        // What is held is exactly acked..next, in order.
        let held = ledger
            .unsent(0, u64::MAX, usize::MAX)
            .map(|(_, e, _)| seqs(&e))
            .unwrap_or_default();
        assert_eq!(held, (ledger.acked()..ledger.next()).collect::<Vec<_>>());
        assert_eq!(ledger.unacked(), ledger.next() - ledger.acked());
    }
}

#[test]
fn a_newer_stream_replaces_an_older_one() {
    let mut ledger = ReaderLedger::default();
    let old = ledger.open_stream();
    assert!(ledger.is_current(old));
    let new = ledger.open_stream();
    assert!(!ledger.is_current(old));
    assert!(ledger.is_current(new));
}

/// The planted bug: a reader acknowledging in steps of 100 is sent, once per 500 acknowledged
/// elements, an element it already has, under a new sequence number.
#[cfg(feature = "planted-resend-bug")]
#[test]
fn the_planted_bug_resends_an_acknowledged_element() {
    let mut ledger = ReaderLedger::default();
    let mut delivered = Vec::new();
    for step in 0..10u64 {
        ledger.record(run(step * 100, 100));
        let (_, elements) = ledger
            .unsent(delivered.len() as u64, u64::MAX, usize::MAX)
            .expect("new elements");
        delivered.extend(seqs(&elements));
        ledger.ack(delivered.len() as u64).expect("received");
    }
    let mut unique = delivered.clone();
    unique.sort_unstable();
    unique.dedup();
    assert!(
        unique.len() < delivered.len(),
        "a duplicate was delivered: {} of {}",
        unique.len(),
        delivered.len()
    );
}

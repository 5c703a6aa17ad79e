use super::*;
use futures::FutureExt;

/// Pushes a one-byte element.
fn push(tx: &mut Producer, v: u8) -> bool {
    tx.push(&[v], Bytes::new())
}

fn values(taken: Taken) -> Vec<u8> {
    match taken {
        Taken::Elements(e, _) => e.encoded().map(|(head, _)| head[0]).collect(),
        other => panic!("expected elements, got {other:?}"),
    }
}

/// The numbers of elements pushed as little-endian `u32`s.
fn numbers(elements: &Packed) -> impl Iterator<Item = u32> + '_ {
    elements
        .encoded()
        .map(|(head, _)| u32::from_le_bytes(head[..].try_into().expect("four bytes")))
}

/// Waits, with a deadline, until `n` pipelines are blocked waiting for room in `buffer`.
fn wait_for_waiting_pushers(buffer: &TaskBuffer, n: usize) {
    let what = format!("{n} blocked pushers");
    sluice_testwait::wait_until_blocking(&what, sluice_testwait::HANG, || {
        buffer.waiting_pushers() == n
    })
    .unwrap();
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime")
}

#[tokio::test]
async fn chunks_hold_at_most_chunk_elements_in_pipeline_order() {
    // A still clock: no chunk is sealed for its age, so only the bound splits them.
    test_clock::freeze();
    let (mut tx, buffer) = TaskBuffer::channel(4 * CHUNK_ELEMENTS, usize::MAX);
    let n = CHUNK_ELEMENTS + 3;
    for i in 0..n {
        assert!(tx.push(&(i as u32).to_le_bytes(), Bytes::new()));
    }
    tx.finish(Ok(()));
    let mut next = 0u32;
    let mut chunks = Vec::new();
    loop {
        match buffer.take(usize::MAX).await {
            Taken::Elements(elements, _) => {
                for number in numbers(&elements) {
                    assert_eq!(number, next);
                    next += 1;
                }
                chunks.push(elements.len());
            }
            Taken::End => break,
            Taken::Error(e) => panic!("{e}"),
            Taken::Stopped => panic!("never closed"),
        }
    }
    assert_eq!(next as usize, n);
    assert_eq!(chunks, vec![CHUNK_ELEMENTS, 3]);
    assert_eq!(buffer.take(1).await, Taken::End, "the end stays");
}

#[tokio::test]
async fn a_reader_takes_no_more_than_it_asks_and_order_is_kept() {
    let (mut tx, buffer) = TaskBuffer::channel(100, usize::MAX);
    for i in 0..5 {
        push(&mut tx, i);
    }
    tx.finish(Err("boom".into()));
    assert_eq!(values(buffer.take(2).await), vec![0, 1]);
    assert_eq!(values(buffer.take(2).await), vec![2, 3]);
    assert_eq!(values(buffer.take(2).await), vec![4]);
    assert_eq!(buffer.take(2).await, Taken::Error("boom".into()));
}

#[tokio::test(start_paused = true)]
async fn an_element_left_open_is_taken_after_the_linger() {
    // The buffer's clock held still, and tokio's paused: the reader's wait for the linger is
    // measured on tokio's clock, which moves only when every task waits.
    test_clock::freeze();
    let (mut tx, buffer) = TaskBuffer::channel(100, usize::MAX);
    push(&mut tx, 7);
    // The pipeline has not ended and pushes nothing more: the reader still gets the element,
    // once it has waited the linger, and not before.
    assert_eq!(buffer.try_take_sealed(10), None, "not sealed");
    assert!(
        buffer.take(10).now_or_never().is_none(),
        "the reader waits for the linger"
    );
    let started = tokio::time::Instant::now();
    let taken = tokio::time::timeout(Duration::from_secs(5), buffer.take(10))
        .await
        .expect("the open element after the linger");
    assert_eq!(values(taken), vec![7]);
    assert!(
        started.elapsed() >= LINGER,
        "waited {:?}",
        started.elapsed()
    );
    assert_eq!(buffer.try_take(10), None);
    // The pipeline goes on after a reader took its open chunk.
    push(&mut tx, 8);
    push(&mut tx, 9);
    tx.finish(Ok(()));
    let mut rest = Vec::new();
    loop {
        match buffer.take(10).await {
            Taken::Elements(e, _) => rest.extend(values(Taken::Elements(e, 0))),
            Taken::End => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(rest, vec![8, 9]);
}

#[tokio::test(start_paused = true)]
async fn an_element_pushed_while_a_reader_waits_is_taken_within_the_linger() {
    test_clock::freeze();
    let (mut tx, buffer) = TaskBuffer::channel(100, usize::MAX);
    let reader = {
        let buffer = buffer.clone();
        tokio::spawn(async move { buffer.take(10).await })
    };
    // The reader waits on an empty buffer when the pipeline pushes one element and then
    // blocks (pushes nothing more, does not end). On this current-thread runtime, yielding
    // runs the reader until it waits.
    tokio::task::yield_now().await;
    assert!(!reader.is_finished(), "nothing to take yet");
    let pushed = tokio::time::Instant::now();
    push(&mut tx, 9);
    let taken = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .expect("the element within the linger, not when the pipeline next pushes")
        .expect("the reader");
    assert_eq!(values(taken), vec![9]);
    // Tokio's timers count whole milliseconds: a wait of `LINGER` ends within one.
    assert!(
        pushed.elapsed() <= LINGER.max(Duration::from_millis(1)),
        "taken {:?} after the push",
        pushed.elapsed()
    );
}

#[tokio::test]
async fn a_slow_pipeline_seals_each_element_at_once() {
    test_clock::freeze();
    let (mut tx, buffer) = TaskBuffer::channel(100, usize::MAX);
    push(&mut tx, 1);
    assert_eq!(
        buffer.try_take_sealed(usize::MAX),
        None,
        "the chunk stays open for more"
    );
    test_clock::advance(LINGER * 2);
    // The gap since the previous element marks the pipeline slow: this one is sealed at
    // once, together with the one that was waiting.
    push(&mut tx, 2);
    let sealed = buffer.try_take_sealed(usize::MAX).expect("a sealed chunk");
    assert_eq!(values(sealed), vec![1, 2]);
    test_clock::advance(LINGER * 2);
    push(&mut tx, 3);
    let sealed = buffer.try_take_sealed(usize::MAX).expect("a sealed chunk");
    assert_eq!(values(sealed), vec![3], "alone, at once");
}

#[tokio::test]
async fn elements_small_and_large_come_out_as_they_went_in() {
    use sluice_element::Tensor;
    let floats = vec![0.5f32; 1 << 16];
    let elements: Vec<Element> = vec![
        Tensor::scalar_i64(3).into(),
        Tensor::from_f32s(vec![floats.len()], &floats)
            .unwrap()
            .into(),
        Tensor::scalar_string("s").into(),
    ];
    for compression in [Compression::None, Compression::Auto] {
        let (mut tx, buffer) = TaskBuffer::channel(100, usize::MAX);
        buffer.reader_elsewhere();
        let mut scratch = BytesMut::new();
        for e in &elements {
            assert!(tx.push_element(e, compression, &mut scratch));
        }
        tx.finish(Ok(()));
        // A slow push (compressing the large one) may seal a chunk early.
        let mut decoded = Vec::new();
        while let Taken::Elements(packed, _) = buffer.take(100).await {
            decoded.extend(packed.into_decoder().map(Result::unwrap));
        }
        assert_eq!(decoded.len(), elements.len());
        for (i, (d, e)) in decoded.iter().zip(&elements).enumerate() {
            assert!(
                d == e,
                "{compression}: element {i}: {:?} {:?}",
                d.spec(),
                e.spec()
            );
        }
    }
}

/// Pushes `elements` with `Auto` compression and reads them back, a reader on another machine
/// having come after `elsewhere_after` of them: per element, whether its data travelled as a
/// part of its own (sent uncompressed, without a copy). Checks that they come back equal.
async fn auto_pushed(elements: &[Element], elsewhere_after: usize) -> Vec<bool> {
    let (mut tx, buffer) = TaskBuffer::channel(elements.len(), usize::MAX);
    let mut scratch = BytesMut::new();
    for (i, e) in elements.iter().enumerate() {
        if i == elsewhere_after {
            buffer.reader_elsewhere();
        }
        assert!(tx.push_element(e, Compression::Auto, &mut scratch));
    }
    tx.finish(Ok(()));
    let mut as_parts = Vec::new();
    let mut decoded = Vec::new();
    while let Taken::Elements(packed, _) = buffer.take(elements.len()).await {
        as_parts.extend(packed.encoded().map(|(_, payload)| !payload.is_empty()));
        decoded.extend(packed.into_decoder().map(Result::unwrap));
    }
    assert!(
        decoded == elements,
        "the elements come back as they went in"
    );
    as_parts
}

#[tokio::test]
async fn auto_compression_stops_trying_a_tasks_incompressible_elements_and_sends_them_as_parts() {
    use rand::{Rng, SeedableRng};
    use sluice_element::{AutoCompression, Tensor};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let n = 40;
    let noise: Vec<Element> = (0..n)
        .map(|_| {
            let floats: Vec<f32> = (0..8192).map(|_| rng.random::<f32>()).collect();
            Tensor::from_f32s(vec![floats.len()], &floats)
                .unwrap()
                .into()
        })
        .collect();
    let tried = AutoCompression::MISSES_BEFORE_SKIPPING as usize;
    let mut want = vec![false; tried];
    want.resize(n, true);
    assert_eq!(
        auto_pushed(&noise, 0).await,
        want,
        "tried {tried} times, then sent without trying"
    );

    // Elements that compress stay compressed (whole, no parts).
    let zeros: Vec<Element> = (0..n)
        .map(|_| Tensor::from_f32s(vec![8192], &[0.0; 8192]).unwrap().into())
        .collect();
    assert_eq!(auto_pushed(&zeros, 0).await, vec![false; n]);
}

#[tokio::test]
async fn auto_compression_waits_for_a_reader_on_another_machine() {
    use sluice_element::Tensor;
    let n = 10;
    let zeros: Vec<Element> = (0..n)
        .map(|_| Tensor::from_f32s(vec![8192], &[0.0; 8192]).unwrap().into())
        .collect();
    // Compressible, but read on this machine only: sent as they are, their data as parts.
    assert_eq!(auto_pushed(&zeros, n).await, vec![true; n]);
    // A reader elsewhere after 4: compressed from then on.
    let mut want = vec![true; 4];
    want.resize(n, false);
    assert_eq!(auto_pushed(&zeros, 4).await, want);
}

#[tokio::test]
async fn a_closed_buffer_reports_stopped_after_its_elements_not_end() {
    let (mut tx, buffer) = TaskBuffer::channel(16, usize::MAX);
    assert!(push(&mut tx, b'x'));
    buffer.close();
    assert!(!push(&mut tx, b'y'), "closed: the pipeline stops");
    tx.finish(Ok(()));
    assert!(matches!(buffer.take(16).await, Taken::Elements(e, _) if e.len() == 1));
    assert_eq!(buffer.take(16).await, Taken::Stopped);
}

#[tokio::test]
async fn a_pipeline_thread_that_panics_ends_the_buffer_with_an_error() {
    let (mut tx, buffer) = TaskBuffer::channel(16, usize::MAX);
    let pipeline = std::thread::spawn(move || {
        push(&mut tx, 1);
        panic!("a bug in the pipeline");
    });
    assert!(pipeline.join().is_err());
    assert_eq!(values(buffer.take(16).await), vec![1]);
    assert_eq!(
        buffer.take(16).await,
        Taken::Error("the task's pipeline thread panicked".into())
    );
}

#[test]
fn the_pipeline_blocks_while_full_and_stops_when_closed() {
    let (mut tx, buffer) = TaskBuffer::channel(3, usize::MAX);
    for i in 0..3 {
        assert!(push(&mut tx, i));
    }
    let pusher = std::thread::spawn(move || {
        let pushed = push(&mut tx, 3);
        (tx, pushed)
    });
    // Full: the pusher waits until a reader makes room.
    wait_for_waiting_pushers(&buffer, 1);
    assert!(!pusher.is_finished());
    let rt = current_thread();
    assert_eq!(values(rt.block_on(buffer.take(1))), vec![0]);
    let (mut tx, pushed) = pusher.join().unwrap();
    assert!(pushed);
    // Full again (1, 2, 3). Closed: a blocked (or later) push says stop.
    let blocked = std::thread::spawn(move || {
        let pushed = push(&mut tx, 99);
        (tx, pushed)
    });
    wait_for_waiting_pushers(&buffer, 1);
    buffer.close();
    let (mut tx, pushed) = blocked.join().unwrap();
    assert!(!pushed);
    assert!(!push(&mut tx, 100));
}

#[test]
fn the_byte_bound_holds_but_a_large_element_still_goes_alone() {
    let (mut tx, buffer) = TaskBuffer::channel(100, 10);
    assert!(tx.push(&[0u8; 64], Bytes::new()));
    let pusher = std::thread::spawn(move || tx.push(&[1u8; 4], Bytes::new()));
    wait_for_waiting_pushers(&buffer, 1);
    assert!(
        !pusher.is_finished(),
        "over the byte bound: the pipeline waits"
    );
    match current_thread().block_on(buffer.take(10)) {
        Taken::Elements(e, _) => assert_eq!(e.byte_len(), 64),
        other => panic!("{other:?}"),
    }
    assert!(pusher.join().unwrap());
}

/// Readers that take the open chunk back as often as they can, while the pipeline appends as
/// fast as it can: each element arrives once, and each reader sees them in order. This is the
/// handshake of the module header under load. The revocations are counted: rounds repeat until
/// at least ten have happened (how many a round has depends on the machine's scheduling), so the
/// test fails if the revocation path is never taken.
#[test]
fn readers_taking_the_open_chunk_back_lose_and_repeat_nothing() {
    for max_elements in [1 << 16, 64] {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut partial = 0;
        while partial < 10 {
            assert!(
                std::time::Instant::now() < deadline,
                "max {max_elements}: readers took only {partial} open chunks in 60 s"
            );
            partial += one_round_of_readers_taking_open_chunks(max_elements);
        }
    }
}

/// One round of the test above: checks that nothing is lost or repeated, and returns how many
/// chunks the readers took while they were still open.
fn one_round_of_readers_taking_open_chunks(max_elements: usize) -> usize {
    const N: u32 = 400_000;
    let (mut tx, buffer) = TaskBuffer::channel(max_elements, usize::MAX);
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let buffer = buffer.clone();
            std::thread::spawn(move || {
                let (mut seen, mut partial) = (Vec::new(), 0usize);
                loop {
                    match buffer.try_take(usize::MAX) {
                        Some(Taken::Elements(elements, _)) => {
                            partial += usize::from(elements.len() < CHUNK_ELEMENTS);
                            seen.extend(numbers(&elements));
                        }
                        Some(Taken::End) => return (seen, partial),
                        Some(other) => panic!("{other:?}"),
                        None => std::thread::yield_now(),
                    }
                }
            })
        })
        .collect();
    for i in 0..N {
        assert!(tx.push(&i.to_le_bytes(), Bytes::new()));
    }
    tx.finish(Ok(()));
    let mut all = Vec::new();
    let mut partial = 0;
    for reader in readers {
        let (seen, chunks) = reader.join().expect("a reader");
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "in order per reader");
        all.extend(seen);
        partial += chunks;
    }
    all.sort_unstable();
    assert_eq!(
        all.len(),
        N as usize,
        "max {max_elements}: none lost or repeated"
    );
    assert!(
        all.iter().copied().eq(0..N),
        "max {max_elements}: every element"
    );
    partial
}

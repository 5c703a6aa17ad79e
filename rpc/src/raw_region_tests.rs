use super::*;

/// Room for a few payloads of `MIN_PAYLOAD` bytes: each takes a head and its bytes.
const SLOT: usize = SLOT_HEAD + MIN_PAYLOAD;

fn pair(slots: usize) -> (RegionWriter, RegionReader) {
    let writer = RegionWriter::with_size(SLOT_HEAD + slots * SLOT).unwrap();
    let reader = RegionReader::open(&writer.offer()).unwrap();
    (writer, reader)
}

fn payload(tag: u8) -> Vec<u8> {
    vec![tag; MIN_PAYLOAD]
}

/// Places `tag`'s payload and reads it back as the reader would.
fn send(writer: &mut RegionWriter, reader: &RegionReader, tag: u8) -> Option<(u64, Bytes)> {
    let at = writer.place(&payload(tag))?;
    let bytes = reader.payload(at, MIN_PAYLOAD as u64).unwrap();
    assert_eq!(bytes[..], payload(tag)[..], "payload {tag}");
    Some((at, bytes))
}

#[test]
fn what_the_worker_places_the_reader_reads_and_frees() {
    let (mut writer, reader) = pair(2);
    let (first_at, first) = send(&mut writer, &reader, 1).unwrap();
    assert_eq!(first_at, (2 * SLOT_HEAD) as u64);
    let (_, second) = send(&mut writer, &reader, 2).unwrap();
    // Full: the next payload goes over the socket.
    assert_eq!(writer.place(&payload(3)), None);
    assert_eq!(writer.lent(), 2);
    // A slice keeps its payload lent.
    let slice = first.slice(10..20);
    drop(first);
    assert_eq!(writer.place(&payload(3)), None);
    drop(slice);
    let (third_at, third) = send(&mut writer, &reader, 3).unwrap();
    assert_eq!(third_at, first_at, "back at the start");
    assert_eq!(
        &second[..],
        &payload(2)[..],
        "the payload still lent is untouched"
    );
    drop((second, third));
    assert!(writer.place(&payload(4)).is_some());
    assert_eq!(writer.lent(), 1, "both freed payloads were reclaimed");
}

#[test]
fn payloads_freed_out_of_order_wait_for_the_oldest() {
    let (mut writer, reader) = pair(3);
    let (_, a) = send(&mut writer, &reader, 1).unwrap();
    let (_, b) = send(&mut writer, &reader, 2).unwrap();
    let (_, c) = send(&mut writer, &reader, 3).unwrap();
    drop((b, c));
    assert_eq!(writer.place(&payload(4)), None, "the oldest is still lent");
    drop(a);
    for tag in 4..7 {
        send(&mut writer, &reader, tag).unwrap();
    }
}

#[test]
fn the_ring_wraps_before_the_oldest_payload_still_lent() {
    let (mut writer, reader) = pair(3);
    let (a_at, a) = send(&mut writer, &reader, 1).unwrap();
    let (b_at, b) = send(&mut writer, &reader, 2).unwrap();
    drop(a);
    // Room before `b` (where `a` was) and after it: the start is taken first.
    let (c_at, c) = send(&mut writer, &reader, 3).unwrap();
    assert_eq!(c_at, a_at);
    // Wrapped: the only room is between `c` and `b`, which is none.
    assert_eq!(writer.place(&payload(4)), None);
    drop(b);
    let (d_at, _d) = send(&mut writer, &reader, 4).unwrap();
    assert_eq!(d_at, b_at);
    assert_eq!(&c[..], &payload(3)[..]);
}

#[test]
fn only_payloads_of_the_sizes_it_takes_are_placed() {
    let mut writer = RegionWriter::with_size(4 * MAX_PAYLOAD).unwrap();
    for len in [0, 1, MIN_PAYLOAD - 1, MAX_PAYLOAD + 1] {
        assert_eq!(writer.place(&vec![0; len]), None, "{len} bytes");
    }
    for len in [MIN_PAYLOAD, MIN_PAYLOAD + 1, MAX_PAYLOAD] {
        assert!(writer.place(&vec![0; len]).is_some(), "{len} bytes");
    }
    assert_eq!(writer.lent(), 3);
}

#[test]
fn a_reader_that_scribbles_on_the_region_gets_the_socket_not_a_crash() {
    let (mut writer, reader) = pair(2);
    let (at, a) = send(&mut writer, &reader, 1).unwrap();
    // The reader sets its state word to nonsense, and the region's header too.
    reader
        .map
        .word(at as usize - SLOT_HEAD)
        .unwrap()
        .store(7, Ordering::Relaxed);
    reader
        .map
        .word(0)
        .unwrap()
        .store(u64::MAX, Ordering::Relaxed);
    drop(a); // sets it free again, as a careless reader might not
    reader
        .map
        .word(at as usize - SLOT_HEAD)
        .unwrap()
        .store(7, Ordering::Relaxed);
    send(&mut writer, &reader, 2).unwrap();
    assert_eq!(
        writer.place(&payload(3)),
        None,
        "never freed: no room, no panic"
    );
}

#[test]
fn a_reader_refuses_offers_and_places_that_are_not_the_regions() {
    let writer = RegionWriter::with_size(SLOT_HEAD + 2 * SLOT).unwrap();
    let offer = writer.offer();
    let cases: Vec<(&str, RegionOffer, &str)> = vec![
        (
            "another nonce",
            RegionOffer {
                nonce: vec![0; NONCE_BYTES],
                ..offer.clone()
            },
            "is not the region this stream was offered",
        ),
        (
            "another size",
            RegionOffer {
                size: offer.size * 2,
                ..offer.clone()
            },
            "bytes, not",
        ),
        (
            "too small to be one",
            RegionOffer {
                size: 64,
                ..offer.clone()
            },
            "a region of 64 bytes",
        ),
        (
            "no such descriptor",
            RegionOffer {
                fd: 999_999,
                ..offer.clone()
            },
            "No such file",
        ),
    ];
    for (case, offer, message) in cases {
        let err = RegionReader::open(&offer).err().expect(case);
        assert!(err.to_string().contains(message), "{case}: {err}");
    }

    let reader = RegionReader::open(&offer).unwrap();
    let end = offer.size;
    for (offset, len) in [
        (0, 1),
        (SLOT_HEAD as u64, 1),
        (2 * SLOT_HEAD as u64 + 8, 1),
        (end, 0),
        (2 * SLOT_HEAD as u64, end),
        (u64::MAX - 63, 2),
        (2 * SLOT_HEAD as u64, u64::MAX),
    ] {
        let err = reader.payload(offset, len).err().unwrap();
        assert_eq!(err.code(), tonic::Code::Internal, "{offset}+{len}");
        assert!(
            err.message().contains("raw fetch payload"),
            "{offset}+{len}"
        );
    }
}

#[test]
fn lent_payloads_outlive_the_writer_and_the_reader() {
    let (mut writer, reader) = pair(2);
    let (_, a) = send(&mut writer, &reader, 9).unwrap();
    drop(writer);
    drop(reader);
    assert_eq!(&a[..], &payload(9)[..]);
}

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

/// Places `tag`'s payload, not yet read: its place stays lent.
fn place(writer: &mut RegionWriter, tag: u8) -> Option<u64> {
    writer.place(&payload(tag))
}

/// Reads the payload at `at` as the reader does (copied out, its place freed) and checks it.
fn read(reader: &RegionReader, at: u64, tag: u8) -> Bytes {
    let bytes = reader.payload(at, MIN_PAYLOAD as u64).unwrap();
    assert_eq!(bytes[..], payload(tag)[..], "payload {tag}");
    bytes
}

#[test]
fn what_the_worker_places_the_reader_copies_out_and_frees() {
    let (mut writer, reader) = pair(2);
    let a = place(&mut writer, 1).unwrap();
    assert_eq!(a, (2 * SLOT_HEAD) as u64);
    let b = place(&mut writer, 2).unwrap();
    // Full: the next payload goes over the socket.
    assert_eq!(place(&mut writer, 3), None);
    assert_eq!(writer.lent(), 2);
    let copy = read(&reader, a, 1);
    // The copy is the reader's own: a writable buffer, unaffected by the place's next payload.
    let c = place(&mut writer, 3).unwrap();
    assert_eq!(c, a, "back at the start");
    assert_eq!(&copy[..], &payload(1)[..]);
    assert!(copy.try_into_mut().is_ok(), "a buffer of its own");
    read(&reader, b, 2);
    read(&reader, c, 3);
    place(&mut writer, 4).unwrap();
    assert_eq!(writer.lent(), 1, "every freed payload was reclaimed");
}

#[test]
fn payloads_freed_out_of_order_wait_for_the_oldest() {
    let (mut writer, reader) = pair(3);
    let a = place(&mut writer, 1).unwrap();
    let b = place(&mut writer, 2).unwrap();
    let c = place(&mut writer, 3).unwrap();
    read(&reader, b, 2);
    read(&reader, c, 3);
    assert_eq!(place(&mut writer, 4), None, "the oldest is still lent");
    read(&reader, a, 1);
    for tag in 4..7 {
        let at = place(&mut writer, tag).unwrap();
        read(&reader, at, tag);
    }
}

#[test]
fn the_ring_wraps_before_the_oldest_payload_still_lent() {
    let (mut writer, reader) = pair(3);
    let a = place(&mut writer, 1).unwrap();
    let b = place(&mut writer, 2).unwrap();
    read(&reader, a, 1);
    // Room before `b` (where `a` was) and after it: the start is taken first.
    let c = place(&mut writer, 3).unwrap();
    assert_eq!(c, a);
    // Wrapped: the only room is between `c` and `b`, which is none.
    assert_eq!(place(&mut writer, 4), None);
    read(&reader, b, 2);
    let d = place(&mut writer, 4).unwrap();
    assert_eq!(d, b);
    read(&reader, c, 3);
    read(&reader, d, 4);
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
    let a = place(&mut writer, 1).unwrap();
    // The reader sets the state word to nonsense, and the region's header too.
    let map = reader.map();
    map.word(a as usize - SLOT_HEAD)
        .unwrap()
        .store(7, Ordering::Relaxed);
    map.word(0).unwrap().store(u64::MAX, Ordering::Relaxed);
    let b = place(&mut writer, 2).unwrap();
    read(&reader, b, 2);
    assert_eq!(
        place(&mut writer, 3),
        None,
        "never freed: no room, and no panic"
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
            "too large to believe",
            RegionOffer {
                size: MAX_OFFERED_BYTES as u64 + 1,
                ..offer.clone()
            },
            "a region of 1073741825 bytes",
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

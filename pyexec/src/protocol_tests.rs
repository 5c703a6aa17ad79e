use super::*;
use sluice_element::Tensor;

fn int(v: i64) -> Element {
    Element::Tensor(Tensor::scalar(v))
}

#[test]
fn a_frame_reads_back_as_written_from_parts() {
    let mut buf = Vec::new();
    write_frame(&mut buf, CALL, &[&function_head(7), b"abc", b""]).unwrap();
    assert_eq!(buf[..4], 12u32.to_le_bytes());
    let frame = read_frame(&mut buf.as_slice()).unwrap().unwrap();
    assert_eq!(frame.kind, CALL);
    assert_eq!(&frame.body[..8], &7u64.to_le_bytes());
    assert_eq!(&frame.body[8..], b"abc");
}

#[test]
fn frames_follow_each_other_and_end_cleanly() {
    let mut buf = Vec::new();
    write_frame(&mut buf, LOADED, &[]).unwrap();
    write_frame(&mut buf, KEEP, &[&[1]]).unwrap();
    let mut input = buf.as_slice();
    assert_eq!(read_frame(&mut input).unwrap().unwrap().kind, LOADED);
    let keep = read_frame(&mut input).unwrap().unwrap();
    assert_eq!((keep.kind, &keep.body[..]), (KEEP, &[1u8][..]));
    assert!(read_frame(&mut input).unwrap().is_none());
}

#[test]
fn a_stream_cut_inside_a_frame_is_an_error() {
    let mut buf = Vec::new();
    write_frame(&mut buf, CALL, &[b"0123456789"]).unwrap();
    for cut in [2, 4, 5, 9] {
        let err = read_frame(&mut &buf[..cut]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "cut at {cut}");
    }
}

#[test]
fn a_zero_or_oversized_length_is_refused_without_allocating() {
    for len in [0u32, (MAX_FRAME + 1) as u32] {
        let buf = len.to_le_bytes();
        let err = read_frame(&mut buf.as_slice()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "length {len}");
    }
}

#[test]
fn outputs_round_trip_in_order() {
    let outputs = vec![
        int(1),
        Element::Tuple(vec![int(2), int(3)]),
        Element::Tensor(
            Tensor::from_raw(
                sluice_element::DType::UInt8,
                vec![2, 2],
                Bytes::from(vec![1, 2, 3, 4]),
            )
            .unwrap(),
        ),
        // Large enough to travel as a part of its own, between two small outputs.
        Element::Tensor(
            Tensor::from_raw(
                sluice_element::DType::UInt8,
                vec![300, 300],
                Bytes::from((0..90_000u32).map(|i| i as u8).collect::<Vec<_>>()),
            )
            .unwrap(),
        ),
        int(4),
    ];
    let body = Bytes::from(encode_outputs(&outputs).unwrap());
    assert_eq!(decode_outputs(&body).unwrap(), outputs);
    assert_eq!(
        decode_outputs(&Bytes::from(encode_outputs(&[]).unwrap())).unwrap(),
        vec![]
    );
}

#[test]
fn garbage_outputs_are_a_codec_error() {
    let good = encode_outputs(&[int(5)]).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("truncated element", good[..good.len() - 1].to_vec()),
        ("trailing byte", [good.as_slice(), &[0]].concat()),
        ("huge count", u32::MAX.to_le_bytes().to_vec()),
        (
            "length past the end",
            [&1u32.to_le_bytes()[..], &100u32.to_le_bytes()].concat(),
        ),
    ];
    for (what, body) in cases {
        let err = decode_outputs(&Bytes::from(body)).unwrap_err();
        assert!(matches!(err, DatasetError::Codec(_)), "{what}: {err}");
    }
}

#[test]
fn hello_and_exceptions_are_json() {
    let hello: Hello =
        serde_json::from_str(r#"{"python": "3.11", "cloudpickle": "3.0.0", "pid": 42}"#).unwrap();
    assert_eq!(hello.pid, 42);
    assert!(
        !hello.shared,
        "an executor that does not say it mapped its region did not"
    );
    let e: RemoteException = serde_json::from_str(
        r#"{"type_module": "builtins", "type_name": "ValueError", "message": "m", "traceback": "t"}"#,
    )
    .unwrap();
    assert_eq!(e.type_name, "ValueError");
}

#[test]
fn a_batch_reads_back_element_by_element_with_large_tensors_shared() {
    // 128 KiB of floats: past the codec's size for a piece of its own.
    let floats: Vec<f32> = (0..32_768).map(|v| v as f32).collect();
    let image = Element::Tensor(Tensor::from_f32s(vec![64, 64, 8], &floats).unwrap());
    let inputs = vec![
        int(1),
        image.clone(),
        Element::Tuple(vec![int(2), int(3)]),
        int(4),
    ];
    let pieces = encode_batch(&inputs).unwrap();
    assert!(
        pieces.iter().any(|p| p.len() == 32_768 * 4),
        "the image's data is a piece of its own"
    );
    let mut frame = Vec::new();
    let head = function_head(9);
    let mut parts: Vec<&[u8]> = vec![&head];
    parts.extend(pieces.iter().map(|p| p.as_ref()));
    write_frame(&mut frame, BATCH, &parts).unwrap();
    let frame = read_frame(&mut frame.as_slice()).unwrap().unwrap();
    assert_eq!(frame.kind, BATCH);
    assert_eq!(&frame.body[..8], &9u64.to_le_bytes());
    let elements: Vec<Element> = split_elements(&frame.body[8..])
        .unwrap()
        .into_iter()
        .map(|e| codec::decode_element(e).unwrap())
        .collect();
    assert_eq!(elements, inputs);
    assert_eq!(
        split_elements(&encode_batch(&[]).unwrap()[0])
            .unwrap()
            .len(),
        0
    );
}

#[test]
fn garbage_batches_are_a_codec_error() {
    let good: Vec<u8> = encode_batch(&[int(5)]).unwrap().concat();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("truncated element", good[..good.len() - 1].to_vec()),
        ("trailing byte", [good.as_slice(), &[0]].concat()),
        ("huge count", u32::MAX.to_le_bytes().to_vec()),
        (
            "length past the end",
            [&1u32.to_le_bytes()[..], &100u32.to_le_bytes()].concat(),
        ),
    ];
    for (what, body) in cases {
        let err = split_elements(&body).unwrap_err();
        assert!(matches!(err, DatasetError::Codec(_)), "{what}: {err}");
    }
}

#[test]
fn results_read_back_in_order_with_the_batch_time() {
    let outputs = encode_outputs(&[int(7)]).unwrap();
    let body = encode_results(
        1_234_567,
        &[
            (OUTPUTS, &outputs),
            (KEEP, &[0]),
            (ERROR, b"{}"),
            (OUTPUTS, &encode_outputs(&[]).unwrap()),
        ],
    );
    let batch = decode_results(&Bytes::from(body)).unwrap();
    assert_eq!(batch.nanos, 1_234_567);
    let kinds: Vec<u8> = batch.results.iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, [OUTPUTS, KEEP, ERROR, OUTPUTS]);
    assert_eq!(decode_outputs(&batch.results[0].1).unwrap(), vec![int(7)]);
    assert_eq!(&batch.results[1].1[..], &[0]);
    assert_eq!(&batch.results[2].1[..], b"{}");
    assert!(decode_outputs(&batch.results[3].1).unwrap().is_empty());
}

#[test]
fn garbage_results_are_a_codec_error() {
    let good = encode_results(5, &[(KEEP, &[1]), (KEEP, &[0])]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("no time", 0u32.to_le_bytes().to_vec()),
        ("truncated result", good[..good.len() - 1].to_vec()),
        ("trailing byte", [good.as_slice(), &[0]].concat()),
        (
            "huge count",
            [&u32::MAX.to_le_bytes()[..], &0u64.to_le_bytes()].concat(),
        ),
        (
            "length past the end",
            [
                &1u32.to_le_bytes()[..],
                &0u64.to_le_bytes(),
                &[KEEP],
                &9u32.to_le_bytes(),
            ]
            .concat(),
        ),
    ];
    for (what, body) in cases {
        let err = decode_results(&Bytes::from(body)).unwrap_err();
        assert!(matches!(err, DatasetError::Codec(_)), "{what}: {err}");
    }
}

#[test]
fn results_written_into_a_slot_read_back_as_a_results_body() {
    let tensor = Tensor::from_f32s(vec![3], &[1.0, 2.0, 3.0]).unwrap();
    let outputs = encode_outputs_parts(&[Element::Tensor(tensor), int(4)]).unwrap();
    let results = vec![
        (OUTPUTS, outputs.clone()),
        (KEEP, vec![Bytes::from_static(&[1])]),
        (ERROR, vec![Bytes::from_static(b"{}")]),
    ];
    let mut slot = vec![0u8; 4096];
    let len = write_results(&mut slot, 77, &results).unwrap();
    let read = decode_results(&Bytes::copy_from_slice(&slot[..len])).unwrap();
    assert_eq!(read.nanos, 77);
    let flat: Vec<(u8, Bytes)> = results
        .iter()
        .map(|(kind, parts)| (*kind, Bytes::from(parts.concat())))
        .collect();
    assert_eq!(read.results, flat);
    // One byte short of the whole body: refused, not cut.
    assert_eq!(write_results(&mut slot[..len - 1], 77, &results), None);
    assert_eq!(write_results(&mut slot[..len], 77, &results), Some(len));
}

#[test]
fn shared_references_round_trip_and_other_bodies_are_not_one() {
    assert_eq!(parse_shared_ref(&shared_ref(1, 70_000)), Some((1, 70_000)));
    assert_eq!(parse_shared_ref(&[1, 2, 3]), None);
    assert_eq!(parse_shared_ref(&[0; 6]), None);
    let mut out = [0u8; 4];
    assert_eq!(copy_parts(&mut out, [&b"ab"[..], b"cd"]), Some(4));
    assert_eq!(&out, b"abcd");
    assert_eq!(copy_parts(&mut out, [&b"abc"[..], b"de"]), None);
}

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
    ];
    let body = Bytes::from(encode_outputs(&outputs));
    assert_eq!(decode_outputs(&body).unwrap(), outputs);
    assert_eq!(
        decode_outputs(&Bytes::from(encode_outputs(&[]))).unwrap(),
        vec![]
    );
}

#[test]
fn garbage_outputs_are_a_codec_error() {
    let good = encode_outputs(&[int(5)]);
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
    let e: RemoteException = serde_json::from_str(
        r#"{"type_module": "builtins", "type_name": "ValueError", "message": "m", "traceback": "t"}"#,
    )
    .unwrap();
    assert_eq!(e.type_name, "ValueError");
}

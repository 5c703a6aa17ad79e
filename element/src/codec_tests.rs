use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

pub(crate) fn samples() -> Vec<Element> {
    let mut out: Vec<Element> = vec![
        Tensor::scalar(true).into(),
        Tensor::scalar(-5i8).into(),
        Tensor::scalar(-300i16).into(),
        Tensor::scalar(i32::MIN).into(),
        Tensor::scalar_i64(i64::MAX).into(),
        Tensor::scalar(200u8).into(),
        Tensor::scalar(60000u16).into(),
        Tensor::scalar(u32::MAX).into(),
        Tensor::scalar(u64::MAX).into(),
        Tensor::scalar(1.5f32).into(),
        Tensor::scalar_f64(-0.25).into(),
        Tensor::scalar_string("hello").into(),
        Tensor::scalar_string(Bytes::new()).into(),
        Tensor::from_values::<bool>(vec![2, 2], &[true, false, false, true])
            .unwrap()
            .into(),
        Tensor::from_values::<u16>(vec![3], &[1, 2, 3])
            .unwrap()
            .into(),
        Tensor::from_f32s(vec![0, 4], &[]).unwrap().into(),
        Tensor::from_f64s(vec![2, 1, 2], &[1.0, 2.0, 3.0, f64::NAN])
            .unwrap()
            .into(),
        Tensor::from_strings(
            vec![3],
            vec![Bytes::from("a"), Bytes::from(vec![0xff; 300]), Bytes::new()],
        )
        .unwrap()
        .into(),
    ];
    let nested = Element::Tuple(vec![
        Tensor::scalar_i64(1).into(),
        Element::Dict(BTreeMap::from([
            ("b".to_string(), Element::Tuple(vec![])),
            (
                "a".to_string(),
                Tensor::from_i64s(vec![100], &[7; 100]).unwrap().into(),
            ),
            ("é".to_string(), Element::Dict(BTreeMap::new())),
        ])),
    ]);
    out.push(nested);
    for dtype in DType::ALL {
        assert!(
            out.iter().any(|e| e.spec().dtypes().contains(&dtype)),
            "no sample of {dtype}"
        );
    }
    out
}

/// NaN != NaN, so compare encodings: the codec is deterministic.
fn same(a: &Element, b: &Element) -> bool {
    encode_element(a, Compression::None) == encode_element(b, Compression::None)
}

#[test]
fn round_trips_every_dtype_and_structure() {
    for el in samples() {
        for c in [Compression::None, Compression::Auto] {
            let buf = encode_element(&el, c);
            let back = decode_element(&buf).unwrap();
            assert!(same(&el, &back), "{el:?} with {c}");
            let back = decode_element_bytes(buf).unwrap();
            assert!(same(&el, &back), "{el:?} with {c}");
            assert_eq!(back.spec(), el.spec());
        }
    }
}

#[test]
fn tiny_scalars_are_tiny() {
    let buf = encode_element(&Tensor::scalar_i64(42).into(), Compression::Auto);
    assert_eq!(buf.len(), 12);
    assert_eq!(buf[0], 1, "never compressed");
}

#[test]
fn compression_applies_only_when_it_pays() {
    let zeros: Element = Tensor::from_f32s(vec![256, 1024], &vec![0.0; 256 * 1024])
        .unwrap()
        .into();
    let plain = encode_element(&zeros, Compression::None);
    let packed = encode_element(&zeros, Compression::Auto);
    assert_eq!(plain[0], 1);
    assert_eq!(packed[0], 0x81);
    assert!(
        packed.len() * 10 < plain.len(),
        "{} vs {}",
        packed.len(),
        plain.len()
    );
    assert_eq!(decode_element(&packed).unwrap(), zeros);

    let mut rng = StdRng::seed_from_u64(7);
    let noise: Vec<f32> = (0..4096).map(|_| rng.random()).collect();
    let noise: Element = Tensor::from_f32s(vec![4096], &noise).unwrap().into();
    let buf = encode_element(&noise, Compression::Auto);
    assert_eq!(buf[0], 1, "incompressible data is sent as is");
    assert_eq!(buf, encode_element(&noise, Compression::None));
}

#[test]
fn large_tensors_decode_without_copying() {
    let el: Element = Tensor::from_f32s(vec![512, 512], &vec![1.25; 512 * 512])
        .unwrap()
        .into();
    let buf = encode_element(&el, Compression::None);
    assert_eq!(buf.len(), 1 + 1 + 1 + 1 + 2 + 2 + 512 * 512 * 4);
    let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
    let back = decode_element_bytes(buf.clone()).unwrap();
    let data = back.as_tensor().unwrap().raw_data().unwrap();
    assert!(
        range.contains(&(data.as_ptr() as usize)),
        "tensor data points into the input buffer"
    );
    assert_eq!(back, el);
}

#[test]
fn bad_input_is_an_error() {
    let scalar = encode_element(&Tensor::scalar_i64(1).into(), Compression::None);
    let mut trailing = scalar.to_vec();
    trailing.push(0);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![], "cannot decode element: empty buffer"),
        (
            vec![2, 0],
            "cannot decode element: unsupported format version 2",
        ),
        (vec![1], "cannot decode element: unexpected end of data"),
        (vec![1, 9], "cannot decode element: unknown element tag 9"),
        (
            vec![1, 0, 0, 0],
            "cannot decode element: dtype is unspecified",
        ),
        (
            vec![1, 0, 5, 65],
            "cannot decode element: rank 65 is too large",
        ),
        (
            vec![1, 0, 5, 1, 4, 1, 2],
            "cannot decode element: need 32 bytes, 2 left",
        ),
        (
            vec![1, 0, 12, 1, 200, 1, 0],
            "cannot decode element: 200 strings cannot fit in 1 bytes",
        ),
        (
            vec![
                1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ],
            "cannot decode element: varint too long",
        ),
        (
            vec![1, 2, 1, 1, 0xff, 1, 0],
            "cannot decode element: dict key is not UTF-8",
        ),
        (
            vec![0x81, 0xff, 0xff, 0xff, 0xff, 0x0f, 0],
            "cannot decode element: implausible decompressed length 4294967295",
        ),
        (trailing, "cannot decode element: 1 trailing bytes"),
    ];
    for (buf, want) in cases {
        assert_eq!(
            decode_element(&buf).unwrap_err().to_string(),
            want,
            "{buf:?}"
        );
    }
    let mut deep = vec![1u8];
    deep.extend(std::iter::repeat_n([1u8, 1], 100).flatten());
    assert!(decode_element(&deep)
        .unwrap_err()
        .to_string()
        .contains("nested too deeply"));
}

#[test]
fn garbage_never_panics() {
    let seed = 20240611;
    eprintln!("garbage_never_panics seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let valid: Vec<Bytes> = samples()
        .iter()
        .flat_map(|e| {
            [
                encode_element(e, Compression::None),
                encode_element(e, Compression::Auto),
            ]
        })
        .collect();
    for _ in 0..20_000 {
        let buf: Vec<u8> = if rng.random_bool(0.5) {
            let n = rng.random_range(0..48);
            let mut b: Vec<u8> = (0..n).map(|_| rng.random()).collect();
            if let Some(first) = b.first_mut() {
                *first = if rng.random_bool(0.5) { 1 } else { 0x81 };
            }
            b
        } else {
            let mut b = valid[rng.random_range(0..valid.len())].to_vec();
            for _ in 0..rng.random_range(1..4) {
                let i = rng.random_range(0..b.len());
                b[i] = rng.random();
            }
            b.truncate(rng.random_range(0..=b.len()));
            b
        };
        // Either outcome is fine; only a panic fails the test.
        let _ = decode_element(&buf);
    }
}

#[test]
fn elements_appended_to_one_buffer_match_separate_encodings() {
    for compression in [Compression::None, Compression::Auto] {
        let mut out = BytesMut::new();
        let mut ends = Vec::new();
        for element in samples() {
            assert!(encode_element_append(&element, compression, &mut out).is_none());
            ends.push(out.len());
        }
        let mut start = 0;
        for (element, end) in samples().iter().zip(ends) {
            assert_eq!(&out[start..end], &encode_element(element, compression)[..]);
            start = end;
        }
    }
}

#[test]
fn an_element_split_at_its_tensors_data_concatenates_to_its_encoding() {
    let image = Tensor::from_values::<u8>(vec![64, 64, 3], &[7; 64 * 64 * 3]).unwrap();
    let mut samples = samples();
    samples.push(Element::Tuple(vec![
        image.clone().into(),
        Tensor::scalar_i64(3).into(),
        Element::Dict(BTreeMap::from([("mask".to_string(), image.clone().into())])),
    ]));
    for part_min in [0, 1, 100, 4096, usize::MAX] {
        let mut out = BytesMut::new();
        out.extend_from_slice(b"before");
        let mut parts = Vec::new();
        for element in &samples {
            encode_element_split(element, part_min, &mut out, &mut parts);
        }
        parts.push(out.freeze());
        let mut expected = b"before".to_vec();
        for element in &samples {
            expected.extend_from_slice(&encode_element(element, Compression::None));
        }
        assert_eq!(parts.concat(), expected, "part_min {part_min}");
        if part_min == 4096 {
            // The image's data is shared, twice, not copied.
            let shared = parts
                .iter()
                .filter(|p| p.as_ptr() == image.raw_data().unwrap().as_ptr())
                .count();
            assert_eq!(shared, 2);
        }
    }
}

#[test]
fn a_large_tensor_travels_as_header_and_shared_data() {
    let floats = vec![0.25f32; PART_MIN / 4 + 3];
    let tensor = Tensor::from_f32s(vec![1, floats.len()], &floats).unwrap();
    let element: Element = tensor.clone().into();
    let mut head = BytesMut::new();
    let payload = encode_element_append(&element, Compression::None, &mut head)
        .expect("a large tensor is split");
    let head = head.freeze();
    // No copy: the payload is the tensor's own buffer.
    assert_eq!(payload.as_ptr(), tensor.raw_data().unwrap().as_ptr());
    // The two parts concatenated are the element's whole encoding.
    let whole = [&head[..], &payload[..]].concat();
    assert_eq!(whole, encode_element(&element, Compression::None).to_vec());
    let decoded = decode_element_parts(head.clone(), payload.clone()).unwrap();
    assert!(same(&decoded, &element));
    // Small tensors, other structures and compressed elements stay whole.
    for (el, compression) in [
        (Tensor::scalar_i64(5).into(), Compression::None),
        (Element::Tuple(vec![element.clone()]), Compression::None),
        (element.clone(), Compression::Auto),
    ] {
        let mut whole = BytesMut::new();
        assert!(encode_element_append(&el, compression, &mut whole).is_none());
        assert!(same(
            &decode_element_parts(whole.freeze(), Bytes::new()).unwrap(),
            &el
        ));
    }
    // A payload that does not fit its header is refused.
    let short = payload.slice(1..);
    assert!(decode_element_parts(head.clone(), short).is_err());
    let scalar = encode_element(&Tensor::scalar_i64(5).into(), Compression::None);
    assert!(decode_element_parts(scalar, payload).is_err());
}

#[test]
fn compression_parses_tf_data_spellings_and_refuses_anything_else() {
    assert_eq!("AUTO".parse::<Compression>().ok(), Some(Compression::Auto));
    assert_eq!("none".parse::<Compression>().ok(), Some(Compression::None));
    assert_eq!(
        "gzip".parse::<Compression>().unwrap_err().to_string(),
        "Invalid `compression` argument: gzip. Must be one of ['auto', 'none']."
    );
    use sluice_proto::dispatcher::Compression as Proto;
    // (proto value, decoded): unspecified is the default, a number that is no compression an
    // error, never a silent default.
    let cases = [
        (Proto::Unspecified as i32, Some(Compression::Auto)),
        (Proto::None as i32, Some(Compression::None)),
        (Proto::Auto as i32, Some(Compression::Auto)),
        (7, None),
    ];
    for (value, decoded) in cases {
        assert_eq!(Compression::from_proto(value).ok(), decoded, "{value}");
    }
    for c in [Compression::None, Compression::Auto] {
        assert_eq!(Compression::from_proto(c.to_proto() as i32).ok(), Some(c));
    }
}

/// Which of `verdicts` (whether each tried element compressed) `AutoCompression` tries, as a
/// string: `t` tried, `.` sent without trying, until the verdicts run out.
fn auto_trace(verdicts: &[bool], elements: usize) -> String {
    let mut auto = AutoCompression::default();
    let mut verdicts = verdicts.iter();
    let mut trace = String::new();
    for _ in 0..elements {
        match auto.next(Compression::Auto) {
            Compression::Auto => {
                let Some(&compressed) = verdicts.next() else {
                    break;
                };
                auto.tried(compressed);
                trace.push('t');
            }
            Compression::None => trace.push('.'),
        }
    }
    trace
}

#[test]
fn auto_compression_stops_trying_what_does_not_compress_and_keeps_what_does() {
    let dots = |n: usize| ".".repeat(n);
    let cases: [(&str, Vec<bool>, usize, String); 5] = [
        (
            "compressible: always tried",
            vec![true; 100],
            100,
            "t".repeat(100),
        ),
        (
            "incompressible: four misses, then 64 skipped, 128, 256",
            vec![false; 7],
            4 + 64 + 1 + 128 + 1 + 256 + 1,
            format!("tttt{}t{}t{}t", dots(64), dots(128), dots(256)),
        ),
        (
            "a hit starts over",
            vec![false, false, false, true, false, false, false, false],
            8 + 64,
            format!("tttttttt{}", dots(64)),
        ),
        (
            "a compressible stretch after skipping is compressed again",
            vec![false, false, false, false, true, true, true],
            4 + 64 + 3,
            format!("tttt{}ttt", dots(64)),
        ),
        (
            "the skip stops growing",
            vec![false; 12],
            4 + 64 + 1 + 128 + 1 + 256 + 1 + 512 + 1 + 1024 + 1 + 2048 + 1 + 4096 + 1 + 4096 + 1,
            format!(
                "tttt{}t{}t{}t{}t{}t{}t{}t{}t",
                dots(64),
                dots(128),
                dots(256),
                dots(512),
                dots(1024),
                dots(2048),
                dots(4096),
                dots(4096)
            ),
        ),
    ];
    for (name, verdicts, elements, want) in cases {
        assert_eq!(auto_trace(&verdicts, elements), want, "{name}");
    }
    // A dataset without compression never tries.
    let mut auto = AutoCompression::default();
    assert_eq!(auto.next(Compression::None), Compression::None);
    // Many misses saturate, never wrap to trying every element.
    let mut auto = AutoCompression::default();
    for _ in 0..100 {
        auto.tried(false);
    }
    let skipped = (0..AutoCompression::MAX_SKIP)
        .filter(|_| auto.next(Compression::Auto) == Compression::None)
        .count();
    assert_eq!(skipped, AutoCompression::MAX_SKIP as usize);
}

#[test]
fn is_compressed_reads_the_header() {
    let zeros: Element = Tensor::from_raw(DType::Float32, vec![4096], vec![0u8; 16384].into())
        .unwrap()
        .into();
    assert!(is_compressed(&encode_element(&zeros, Compression::Auto)));
    assert!(!is_compressed(&encode_element(&zeros, Compression::None)));
    assert!(!is_compressed(&[]));
}

use std::collections::BTreeMap;

use super::*;
use crate::codec::{encode_element, PART_MIN};
use crate::tensor::Tensor;

fn large() -> Element {
    let floats = vec![0.5f32; PART_MIN / 4];
    Tensor::from_f32s(vec![floats.len()], &floats)
        .unwrap()
        .into()
}

/// Small and large elements of every structure, in an order that mixes them.
fn samples() -> Vec<Element> {
    vec![
        Tensor::scalar_i64(7).into(),
        Tensor::scalar_string("hello").into(),
        large(),
        Element::Tuple(vec![
            Tensor::scalar(1.5f32).into(),
            Element::Dict(BTreeMap::from([(
                "a".to_string(),
                Tensor::from_i64s(vec![2], &[3, 4]).unwrap().into(),
            )])),
        ]),
        Tensor::from_i64s(vec![512], &[9; 512]).unwrap().into(),
        Tensor::scalar_i64(-1).into(),
    ]
}

fn build(elements: &[Element], compression: Compression) -> Packed {
    let mut builder = PackedBuilder::default();
    for e in elements {
        builder.push(e, compression);
    }
    assert_eq!(builder.len(), elements.len());
    builder.finish()
}

fn decode(packed: Packed) -> Vec<Element> {
    packed
        .into_decoder()
        .collect::<Result<_, _>>()
        .expect("decodes")
}

#[test]
fn elements_round_trip_in_order_with_and_without_compression() {
    for compression in [Compression::None, Compression::Auto] {
        let packed = build(&samples(), compression);
        assert_eq!(decode(packed), samples(), "{compression}");
    }
}

#[test]
fn only_large_uncompressed_tensors_carry_payloads() {
    let (_, lengths, payloads) = build(&samples(), Compression::None).into_parts();
    assert_eq!(lengths.len(), samples().len());
    let with_data: Vec<usize> = (0..payloads.len())
        .filter(|&i| !payloads[i].is_empty())
        .collect();
    assert_eq!(with_data, [2], "the large tensor's data travels apart");
    let (_, _, payloads) = build(&samples(), Compression::Auto).into_parts();
    assert!(payloads.is_empty(), "compressed elements are whole");
    let (_, _, payloads) = build(&samples()[..2], Compression::None).into_parts();
    assert!(payloads.is_empty(), "no payloads without a large tensor");
}

#[test]
fn encoded_slices_are_each_elements_whole_encoding() {
    for compression in [Compression::None, Compression::Auto] {
        let packed = build(&samples(), compression);
        let whole: Vec<Vec<u8>> = packed
            .encoded()
            .map(|(head, payload)| [&head[..], &payload[..]].concat())
            .collect();
        let expected: Vec<Vec<u8>> = samples()
            .iter()
            .map(|e| encode_element(e, compression).to_vec())
            .collect();
        assert_eq!(whole, expected);
    }
}

#[test]
fn push_encoded_builds_the_same_run_as_push() {
    let by_element = build(&samples(), Compression::None);
    let mut builder = PackedBuilder::default();
    for (head, payload) in by_element.encoded() {
        builder.push_encoded(&head, payload);
    }
    assert_eq!(builder.finish(), by_element);
}

#[test]
fn split_and_concat_keep_every_element_in_order() {
    let all = samples();
    for n in 0..=all.len() + 1 {
        let mut rest = build(&all, Compression::None);
        let front = rest.split_to(n);
        assert_eq!(front.len(), n.min(all.len()));
        assert_eq!(front.len() + rest.len(), all.len());
        assert_eq!(decode(front.clone()), all[..front.len()]);
        assert_eq!(decode(rest.clone()), all[front.len()..]);
        // Runs with and without payloads, and empty ones, join back.
        let mut third = rest.clone();
        let second = third.split_to(1);
        let joined = Packed::concat(vec![front, Packed::default(), second, third]);
        assert_eq!(decode(joined), all, "split at {n} and joined");
    }
    assert_eq!(Packed::concat(vec![]), Packed::default());
}

#[test]
fn equal_lengths_travel_once_and_come_back() {
    let scalars: Vec<Element> = (0..100).map(|i| Tensor::scalar_i64(i).into()).collect();
    for elements in [&scalars[..], &samples()[..], &[][..]] {
        let packed = build(elements, Compression::None);
        let (buffer, lengths, each, payloads) = packed.clone().into_wire();
        if elements.len() == 100 {
            assert!(lengths.is_empty() && each == 12, "scalars: one length");
        } else {
            assert_eq!(each, 0, "mixed or no elements: every length");
        }
        let back = Packed::from_wire(buffer, lengths, each, payloads).unwrap();
        assert_eq!(back, packed);
    }
    // A length that does not divide the buffer is refused, and a huge count is impossible.
    assert!(Packed::from_wire(Bytes::from_static(&[0; 10]), vec![], 3, vec![]).is_err());
    let one_each = Packed::from_wire(Bytes::from_static(&[0; 10]), vec![], 1, vec![]).unwrap();
    assert_eq!(one_each.len(), 10);
}

#[test]
fn small_elements_get_their_own_allocation_and_large_ones_share_the_buffer() {
    let small = Tensor::scalar_i64(5);
    let big = Tensor::from_i64s(vec![1024], &[1; 1024]).unwrap();
    let packed = build(&[small.into(), big.into()], Compression::None);
    let (buffer, _, _) = packed.clone().into_parts();
    let range = buffer.as_ptr_range();
    let decoded = decode(packed);
    let inside = |e: &Element| {
        let data = e.as_tensor().unwrap().raw_data().unwrap();
        range.contains(&data.as_ptr())
    };
    assert!(!inside(&decoded[0]), "a scalar is copied out");
    assert!(inside(&decoded[1]), "8 KiB of data is shared");
}

#[test]
fn parts_that_do_not_add_up_are_refused() {
    let ok = build(&samples()[..2], Compression::None);
    let (buffer, lengths, _) = ok.into_parts();
    let cases: Vec<(&str, Vec<u64>, Vec<Bytes>)> = vec![
        ("too short", vec![lengths[0]], vec![]),
        ("too long", vec![lengths[0], lengths[1] + 1], vec![]),
        ("overflow", vec![u64::MAX, 2], vec![]),
        ("payload count", lengths.clone(), vec![Bytes::new()]),
    ];
    for (name, lengths, payloads) in cases {
        assert!(
            Packed::from_parts(buffer.clone(), lengths, payloads).is_err(),
            "{name}"
        );
    }
    assert!(Packed::from_parts(buffer, lengths, vec![]).is_ok());
}

#[test]
fn garbage_decodes_to_errors_not_panics() {
    let packed = Packed::from_parts(
        Bytes::from_static(&[1, 0, 9, 0, 0xff, 0xff]),
        vec![3, 0, 3],
        vec![],
    )
    .unwrap();
    let results: Vec<_> = packed.into_decoder().collect();
    assert_eq!(results.len(), 3);
    assert!(results.iter().all(Result::is_err));
}

//! The fuzz targets of this crate's decoders of outside input (see `sluice-fuzz`): the element
//! codec and packed element runs. Each checks that a decoder returns a value or a clean error,
//! never panics, and holds at most a bounded multiple of its input in memory at once; and that
//! what decodes encodes back to itself.
//!
//! A long session: `SLUICE_FUZZ_CASES=100000 cargo nextest run -p sluice-element --profile fuzz
//! -E 'test(fuzz_)'`.

use bytes::Bytes;
use prost::Message;
use sluice_fuzz::proptest::prelude::*;
use sluice_fuzz::proptest::test_runner::TestRunner;
use sluice_fuzz::{within, AllocMeter, FuzzTarget};
use sluice_proto::worker::ElementBatch;

use crate::codec::{decode_element, decode_element_bytes, decode_element_parts, encode_element};
use crate::codec::{encode_element_append, Compression, PART_MIN};
use crate::packed::{Packed, PackedBuilder};
use crate::{DType, Element, Tensor};

#[global_allocator]
static METER: AllocMeter = AllocMeter;

/// Memory a decoder may hold per byte of its input, and regardless of it: an element tree takes
/// a few machine words per node, and every node takes at least two bytes of input.
const PER_BYTE: usize = 256;
const SLACK: usize = 256 << 10;

// ---------------------------------------------------------------- element codec

fn arb_tensor() -> impl Strategy<Value = Tensor> {
    let shape = prop::collection::vec(0usize..4, 0..4);
    (prop::sample::select(DType::ALL.to_vec()), shape).prop_flat_map(|(dtype, shape)| {
        let n: usize = shape.iter().product();
        match dtype.size() {
            Some(size) => prop::collection::vec(any::<u8>(), n * size)
                .prop_map(move |data| {
                    let data = if dtype == DType::Bool {
                        data.iter().map(|b| b & 1).collect()
                    } else {
                        data
                    };
                    Tensor::from_raw(dtype, shape.clone(), Bytes::from(data))
                        .expect("data sized to the shape")
                })
                .boxed(),
            None => prop::collection::vec(prop::collection::vec(any::<u8>(), 0..20), n)
                .prop_map(move |strings| {
                    Tensor::from_strings(
                        shape.clone(),
                        strings.into_iter().map(Bytes::from).collect(),
                    )
                    .expect("one string per element")
                })
                .boxed(),
        }
    })
}

fn arb_element() -> impl Strategy<Value = Element> {
    arb_tensor()
        .prop_map(Element::Tensor)
        .prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Element::Tuple),
                prop::collection::btree_map("[a-z\u{e9}]{0,6}", inner, 0..4)
                    .prop_map(Element::Dict),
            ]
        })
}

fn codec_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for el in crate::codec::tests::samples() {
        for c in [Compression::None, Compression::Auto] {
            seeds.push(encode_element(&el, c).to_vec());
        }
    }
    seeds
}

fn same(a: &Element, b: &Element) -> bool {
    encode_element(a, Compression::None) == encode_element(b, Compression::None)
}

/// The bytes an element encoding may inflate to: its snappy header's claim when compressed.
fn element_body_len(input: &[u8]) -> usize {
    match input.split_first() {
        Some((&h, rest)) if h & 0x80 != 0 => snap::raw::decompress_len(rest).unwrap_or(0),
        _ => 0,
    }
}

fn check_element(input: &[u8]) -> Result<(), String> {
    let (copied, peak) = AllocMeter::peak_during(|| decode_element(input));
    let size = input.len() + element_body_len(input);
    within("decode_element", peak, size, PER_BYTE, SLACK)?;
    let owned = Bytes::copy_from_slice(input);
    let (shared, peak) = AllocMeter::peak_during(|| decode_element_bytes(owned.clone()));
    within("decode_element_bytes", peak, size, PER_BYTE, SLACK)?;
    let parts = decode_element_parts(owned, Bytes::new());
    match (&copied, &shared, &parts) {
        (Ok(a), Ok(b), Ok(c)) if same(a, b) && same(a, c) => {}
        (Err(_), Err(_), Err(_)) => {}
        _ => {
            return Err(format!(
                "the decoders disagree: {copied:?} / {shared:?} / {parts:?}"
            ))
        }
    }
    if let Ok(el) = copied {
        for c in [Compression::None, Compression::Auto] {
            let again = decode_element(&encode_element(&el, c))
                .map_err(|e| format!("{el:?} encoded with {c} does not decode: {e}"))?;
            if !same(&el, &again) {
                return Err(format!("{el:?} encoded with {c} decodes as {again:?}"));
            }
        }
    }
    Ok(())
}

#[test]
fn fuzz_element_codec() {
    let target = FuzzTarget::new("element")
        .seeds(codec_seeds())
        .dictionary(&[
            &[1u8, 0][..],
            &[1, 1],
            &[1, 2],
            &[0x81],
            &[0, 9],
            &[1, 0, 9, 1],
            &[0xff, 0xff, 0xff, 0xff, 0x0f],
        ]);
    let mut runner = TestRunner::new(target.config());
    runner
        .run(&arb_element(), |el| {
            for c in [Compression::None, Compression::Auto] {
                let back = decode_element(&encode_element(&el, c)).expect("decodes");
                prop_assert!(same(&el, &back), "{:?} with {}", el, c);
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("element round trip: {e}"));
    target.run(check_element);
}

// ---------------------------------------------------------------- packed element runs

fn packed_seeds() -> Vec<Vec<u8>> {
    let batch = |p: Packed| {
        let (packed, lengths, each_length, payloads) = p.into_wire();
        ElementBatch {
            packed,
            lengths,
            each_length,
            payloads,
            ..Default::default()
        }
        .encode_to_vec()
    };
    let mut seeds = Vec::new();
    let mut b = PackedBuilder::default();
    for i in 0..5 {
        b.push(&Tensor::scalar_i64(i).into(), Compression::Auto);
    }
    seeds.push(batch(b.finish()));
    for el in crate::codec::tests::samples() {
        b.push(&el, Compression::Auto);
    }
    seeds.push(batch(b.finish()));
    // A large tensor's data as its own part, beside whole elements.
    let large = Tensor::from_raw(
        DType::UInt8,
        vec![PART_MIN],
        Bytes::from(vec![7u8; PART_MIN]),
    )
    .expect("a valid tensor");
    b.push(&Tensor::scalar_string("x").into(), Compression::None);
    b.push(&large.into(), Compression::None);
    seeds.push(batch(b.finish()));
    seeds
}

fn check_packed(input: &[u8]) -> Result<(), String> {
    let Ok(batch) = ElementBatch::decode(input) else {
        return Ok(());
    };
    let (decoded, peak) = AllocMeter::peak_during(|| {
        let packed = Packed::from_wire(
            batch.packed,
            batch.lengths,
            batch.each_length,
            batch.payloads,
        )?;
        let again = packed.clone().into_wire();
        let again = Packed::from_wire(again.0, again.1, again.2, again.3)?;
        let elements: Vec<_> = packed.clone().into_decoder().collect();
        Ok::<_, crate::DatasetError>((packed, again, elements))
    });
    within("a packed run", peak, input.len(), PER_BYTE, SLACK)?;
    if let Ok((packed, again, elements)) = decoded {
        if packed != again {
            return Err("a packed run changes through its wire form".into());
        }
        if elements.len() != packed.len() {
            return Err(format!("{} elements of {}", elements.len(), packed.len()));
        }
        for ((head, payload), decoded) in packed.encoded().zip(&elements) {
            let whole = decode_element_parts(head, payload);
            if whole.is_ok() != decoded.is_ok() {
                return Err(format!("element decoded as {decoded:?} and as {whole:?}"));
            }
        }
    }
    Ok(())
}

#[test]
fn fuzz_packed_elements() {
    let target = FuzzTarget::new("packed")
        .seeds(packed_seeds())
        .dictionary(&[&[0x2au8][..], &[0x32], &[0x22], &[0x50], &[1, 0, 9, 0]]);
    let mut runner = TestRunner::new(target.config());
    runner
        .run(&prop::collection::vec(arb_element(), 0..6), |elements| {
            let mut b = PackedBuilder::default();
            for el in &elements {
                let mut head = bytes::BytesMut::new();
                match encode_element_append(el, Compression::None, &mut head) {
                    Some(payload) => b.push_encoded(&head, payload),
                    None => b.push_encoded(&head, Bytes::new()),
                };
            }
            let (packed, lengths, each, payloads) = b.finish().into_wire();
            let back: Vec<_> = Packed::from_wire(packed, lengths, each, payloads)
                .expect("a built run is valid")
                .into_decoder()
                .collect::<Result<_, _>>()
                .expect("every element decodes");
            prop_assert_eq!(back.len(), elements.len());
            for (a, b) in elements.iter().zip(&back) {
                prop_assert!(same(a, b), "{:?} came back as {:?}", a, b);
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("packed round trip: {e}"));
    target.run(check_packed);
}

// ---------------------------------------------------------------- regressions

/// `fuzz/corpus/element/crash-nested-tuple-capacity`: 64 nested tuples, each claiming 1,000
/// items. Each open tuple reserved room for all its items before decoding one, so 1,193 bytes
/// held 4 MB at once (a megabyte of input would have held gigabytes).
#[test]
fn nested_tuples_do_not_reserve_room_for_items_they_never_get() {
    let mut input = vec![1u8];
    for _ in 0..64 {
        input.extend_from_slice(&[1, 0xe8, 0x07]); // a tuple of 1,000 items
    }
    input.extend(std::iter::repeat_n(1u8, 1000));
    let (decoded, peak) = AllocMeter::peak_during(|| decode_element(&input));
    assert!(decoded.is_err());
    assert!(peak < 128 << 10, "held {peak} bytes");
    let saved =
        std::fs::read(sluice_fuzz::Corpus::dir("element").join("crash-nested-tuple-capacity"))
            .expect("the input is in the corpus");
    assert_eq!(saved, input);
}

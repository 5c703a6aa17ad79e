//! Pipelines with the native image ops, run: over a TFRecord file of PNGs, and before
//! `enumerate` in distributed_epoch mode.

use std::io::Cursor;

use bytes::Bytes;
use image::{DynamicImage, GrayImage, ImageBuffer, ImageFormat, RgbImage};
use sluice_element::{DType, DatasetError, Element, Tensor};
use sluice_formats::tfrecord::TfRecordWriter;
use sluice_pipeline::{parse, Dataset, Transform};

use crate::executor::{iterate, ExecOptions};
use crate::splits::SplitSupplier;

fn encode(img: DynamicImage, format: ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

/// A 2x3 RGB image whose pixel (y, x) is (10y + x, 100 + x, 200 - y).
fn rgb_2x3() -> RgbImage {
    ImageBuffer::from_fn(3, 2, |x, y| {
        image::Rgb([(10 * y + x) as u8, (100 + x) as u8, (200 - y) as u8])
    })
}

fn u8_image(e: &Element) -> (Vec<usize>, Vec<u8>) {
    let t = e.as_tensor().expect("a tensor");
    assert_eq!(t.dtype(), DType::UInt8);
    (t.shape().to_vec(), t.raw_data().unwrap().to_vec())
}

/// Hands out the given splits of repetition 0, in order.
struct Splits(std::sync::Mutex<Vec<u64>>);

impl SplitSupplier for Splits {
    fn next_split(&self, _provider: u32, repetition: u64) -> Result<Option<u64>, DatasetError> {
        let mut left = self.0.lock().unwrap();
        Ok((repetition == 0 && !left.is_empty()).then(|| left.remove(0)))
    }
}

#[test]
fn a_tfrecord_file_of_pngs_decodes_and_resizes_through_the_executor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("images.tfrecord");
    let mut w = TfRecordWriter::create(&path).unwrap();
    w.write_record(&encode(rgb_2x3().into(), ImageFormat::Png))
        .unwrap();
    w.write_record(b"not an image").unwrap();
    w.into_inner().unwrap();
    let expr = format!(
        "files(\"{}\").tfrecord().decode_image().resize(4, 6)",
        path.display()
    );
    let def = parse(&expr).unwrap().into_def();
    let out: Vec<_> = iterate(&def, &ExecOptions::default()).unwrap().collect();
    assert_eq!(out.len(), 2);
    let first = out[0].as_ref().unwrap();
    assert_eq!(u8_image(first).0, vec![4, 6, 3]);
    let err = out[1].as_ref().unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "record 1 (0-based) of '{}': decode_image failed: not a JPEG or PNG image (12 bytes",
            path.display()
        )),
        "{err}"
    );
}

#[test]
fn image_ops_before_enumerate_keep_split_indices_in_distributed_epoch_mode() {
    let pngs: Vec<Bytes> = (1..=3u32)
        .map(|w| Bytes::from(encode(GrayImage::new(w, 1).into(), ImageFormat::Png)))
        .collect();
    let def = Dataset::from_slices(Tensor::from_strings(vec![3], pngs).unwrap())
        .decode_image(None, 1)
        .resize(None, 2, 2)
        .enumerate()
        .into_def();
    let opts = ExecOptions {
        splits: Some(std::sync::Arc::new(Splits(std::sync::Mutex::new(vec![
            2, 0,
        ])))),
        ..ExecOptions::default()
    };
    let out: Vec<Element> = iterate(&def, &opts).unwrap().map(Result::unwrap).collect();
    let indices: Vec<Option<i64>> = out
        .iter()
        .map(|e| match e {
            Element::Tuple(items) => items[0].as_i64(),
            _ => None,
        })
        .collect();
    assert_eq!(indices, vec![Some(2), Some(0)]);
    for e in &out {
        let Element::Tuple(items) = e else {
            panic!("a tuple")
        };
        assert_eq!(u8_image(&items[1]).0, vec![2, 2, 1]);
    }
}

use std::collections::BTreeMap;
use std::io::Cursor;

use image::{DynamicImage, GrayImage, ImageBuffer, RgbImage, RgbaImage};
use sluice_pipeline::{element_spec, parse, render_def, Dataset, FunctionRegistry, Transform};

use super::*;

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

fn png(img: DynamicImage) -> Element {
    Element::Tensor(Tensor::scalar_string(encode(img, ImageFormat::Png)))
}

fn u8_image(e: &Element) -> (Vec<usize>, Vec<u8>) {
    let t = e.as_tensor().expect("a tensor");
    assert_eq!(t.dtype(), DType::UInt8);
    (t.shape().to_vec(), t.raw_data().unwrap().to_vec())
}

fn decode_op(key: Option<&str>, channels: u32) -> pb::DecodeImageOp {
    pb::DecodeImageOp {
        key: key.map(str::to_string),
        channels,
    }
}

fn resize_op(key: Option<&str>, height: u64, width: u64) -> pb::ResizeOp {
    pb::ResizeOp {
        key: key.map(str::to_string),
        height,
        width,
    }
}

#[test]
fn png_images_decode_to_exact_hwc_pixels_in_every_channel_count() {
    let rgb = rgb_2x3();
    let grey = GrayImage::from_fn(3, 2, |x, y| image::Luma([(40 * y + x) as u8]));
    let rgba = RgbaImage::from_fn(3, 2, |x, y| image::Rgba([x as u8, y as u8, 7, 128]));
    let rgb_raw = rgb.as_raw().clone();
    let grey_raw = grey.as_raw().clone();
    let grey_as_rgb: Vec<u8> = grey_raw.iter().flat_map(|&v| [v, v, v]).collect();
    let rgb_with_alpha: Vec<u8> = rgb_raw
        .chunks(3)
        .flat_map(|p| [p[0], p[1], p[2], 255])
        .collect();
    let rgba_without_alpha: Vec<u8> = rgba
        .as_raw()
        .chunks(4)
        .flat_map(|p| [p[0], p[1], p[2]])
        .collect();
    let cases: Vec<(&str, Element, u32, Vec<u8>)> = vec![
        ("rgb as rgb", png(rgb.clone().into()), 3, rgb_raw),
        ("rgb as rgba", png(rgb.into()), 4, rgb_with_alpha),
        ("grey as grey", png(grey.clone().into()), 1, grey_raw),
        ("grey as rgb", png(grey.into()), 3, grey_as_rgb),
        ("rgba as rgb", png(rgba.into()), 3, rgba_without_alpha),
    ];
    for (name, input, channels, want) in cases {
        let out = decode_image(&decode_op(None, channels), input).unwrap();
        let (shape, data) = u8_image(&out);
        assert_eq!(shape, vec![2, 3, channels as usize], "{name}");
        assert_eq!(data, want, "{name}");
    }
}

#[test]
fn a_jpeg_decodes_to_its_pixels_within_compression_error() {
    let solid = RgbImage::from_pixel(16, 8, image::Rgb([200, 40, 90]));
    let bytes = encode(solid.into(), ImageFormat::Jpeg);
    let e = Element::Tensor(Tensor::scalar_string(bytes));
    let (shape, data) = u8_image(&decode_image(&decode_op(None, 3), e).unwrap());
    assert_eq!(shape, vec![8, 16, 3]);
    for (i, (&got, want)) in data.iter().zip([200u8, 40, 90].iter().cycle()).enumerate() {
        assert!(got.abs_diff(*want) <= 3, "sample {i}: {got} vs {want}");
    }
}

#[test]
fn decode_image_with_a_key_replaces_only_that_entry() {
    let mut fields = BTreeMap::new();
    fields.insert("image".to_string(), png(rgb_2x3().into()));
    fields.insert("label".to_string(), Element::Tensor(Tensor::scalar_i64(7)));
    let out = decode_image(&decode_op(Some("image"), 3), Element::Dict(fields)).unwrap();
    let Element::Dict(out) = out else {
        panic!("a dict")
    };
    assert_eq!(u8_image(&out["image"]).0, vec![2, 3, 3]);
    assert_eq!(out["label"].as_i64(), Some(7));
}

#[test]
fn bad_decode_inputs_are_errors_naming_the_op_and_key() {
    let good = encode(rgb_2x3().into(), ImageFormat::Png);
    let truncated = good[..good.len() / 2].to_vec();
    let dict = |k: &str, v: Element| Element::Dict(BTreeMap::from([(k.to_string(), v)]));
    let s = |b: Vec<u8>| Element::Tensor(Tensor::scalar_string(b));
    let cases: Vec<(&str, Option<&str>, Element, &str)> = vec![
        ("truncated png", None, s(truncated), "decode_image failed: corrupt or unsupported image"),
        ("text", None, s(b"hello".to_vec()), "decode_image failed: not a JPEG or PNG image (5 bytes starting 68 65 6c 6c)"),
        ("empty", None, s(Vec::new()), "decode_image failed: not a JPEG or PNG image (0 bytes"),
        ("an int", None, Element::Tensor(Tensor::scalar_i64(1)), "decode_image failed: needs a scalar string of image bytes, got a int64 tensor"),
        ("a tuple", None, Element::Tuple(vec![]), "decode_image failed: the element is not a tensor; pass key="),
        ("missing key", Some("img"), dict("image", s(good.clone())), "decode_image of key 'img' failed: the element has no such entry; its entries are 'image'"),
        ("key on a tensor", Some("img"), s(good), "decode_image of key 'img' failed: key= needs a dict element"),
        ("corrupt entry", Some("img"), dict("img", s(b"\x89PNG\r\n\x1a\nxx".to_vec())), "decode_image of key 'img' failed: corrupt or unsupported image"),
    ];
    for (name, key, input, want) in cases {
        let err = decode_image(&decode_op(key, 3), input).unwrap_err();
        assert!(matches!(err, DatasetError::Image { .. }), "{name}: {err:?}");
        assert!(err.to_string().starts_with(want), "{name}: {err}");
    }
}

#[test]
fn an_image_past_the_side_bound_is_refused() {
    let wide = GrayImage::new(MAX_IMAGE_SIDE as u32 + 1, 1);
    let err = decode_image(&decode_op(None, 1), png(wide.into())).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("decode_image failed: corrupt or unsupported image"),
        "{msg}"
    );
    assert!(msg.to_lowercase().contains("limit"), "{msg}");
}

fn f32_image(shape: Vec<usize>, values: &[f32]) -> Element {
    Element::Tensor(Tensor::from_values(shape, values).unwrap())
}

fn f32_values(e: &Element) -> (Vec<usize>, Vec<f32>) {
    let t = e.as_tensor().unwrap();
    assert_eq!(t.dtype(), DType::Float32);
    (t.shape().to_vec(), t.to_values::<f32>().unwrap())
}

#[test]
fn resize_keeps_constant_images_constant_in_uint8_and_float32() {
    let cases: &[(usize, u64, u64)] = &[(1, 5, 7), (2, 1, 1), (3, 4, 2), (4, 9, 9)];
    for &(c, h, w) in cases {
        let data: Vec<u8> = (0..3 * 5 * c).map(|i| [17u8, 200, 3, 99][i % c]).collect();
        let t = Tensor::from_raw(DType::UInt8, vec![3, 5, c], data.into()).unwrap();
        let (shape, out) = u8_image(&resize(&resize_op(None, h, w), t.into()).unwrap());
        assert_eq!(shape, vec![h as usize, w as usize, c]);
        let want: Vec<u8> = (0..out.len()).map(|i| [17u8, 200, 3, 99][i % c]).collect();
        assert_eq!(out, want, "uint8, {c} channels to {h}x{w}");

        let values: Vec<f32> = (0..3 * 5 * c)
            .map(|i| [-40.5f32, 300.0, 0.25, 1e6][i % c])
            .collect();
        let out = resize(&resize_op(None, h, w), f32_image(vec![3, 5, c], &values)).unwrap();
        let (shape, out) = f32_values(&out);
        assert_eq!(shape, vec![h as usize, w as usize, c]);
        for (i, v) in out.iter().enumerate() {
            let want = [-40.5f32, 300.0, 0.25, 1e6][i % c];
            assert!(
                (v - want).abs() <= want.abs() * 1e-5 + 1e-3,
                "float32 {i}: {v} vs {want}"
            );
        }
    }
}

#[test]
fn resize_interpolates_bilinearly_beyond_the_unit_range() {
    // A 1x2 ramp 0..300 upsampled to 1x3: the middle pixel's centre falls half-way.
    let out = resize(
        &resize_op(None, 1, 3),
        f32_image(vec![1, 2, 1], &[0.0, 300.0]),
    )
    .unwrap();
    let (_, v) = f32_values(&out);
    assert!((v[1] - 150.0).abs() < 1e-3, "{v:?}");
    assert!(
        v[0] < v[1] && v[1] < v[2] && v[0] >= 0.0 && v[2] <= 300.0,
        "{v:?}"
    );
    // A 2x2 uint8 image shrunk to 1x1 is the average.
    let t = Tensor::from_raw(DType::UInt8, vec![2, 2, 1], vec![0u8, 100, 100, 200].into()).unwrap();
    assert_eq!(
        u8_image(&resize(&resize_op(None, 1, 1), t.into()).unwrap()).1,
        vec![100]
    );
}

#[test]
fn bad_resize_inputs_are_clear_errors() {
    let img = |shape: Vec<usize>| {
        let n = shape.iter().product::<usize>();
        Element::Tensor(Tensor::from_raw(DType::UInt8, shape, vec![0u8; n].into()).unwrap())
    };
    let cases: Vec<(&str, pb::ResizeOp, Element, &str)> = vec![
        ("rank 2", resize_op(None, 2, 2), img(vec![4, 4]), "resize failed: needs a tensor of shape [height, width, channels], got shape [4, 4]"),
        ("5 channels", resize_op(None, 2, 2), img(vec![4, 4, 5]), "resize failed: channels must be between 1 and 4, got 5"),
        ("empty", resize_op(None, 2, 2), img(vec![0, 4, 3]), "resize failed: cannot resize an empty image of shape [0, 4, 3]"),
        ("int64", resize_op(None, 2, 2), Element::Tensor(Tensor::from_i64s(vec![1, 1, 1], &[1]).unwrap()), "resize failed: needs a uint8 or float32 image, got int64"),
        ("zero height", resize_op(None, 0, 2), img(vec![4, 4, 3]), "resize height must be between 1 and 16384, got 0"),
        ("absurd width", resize_op(None, 2, 1 << 40), img(vec![4, 4, 3]), "resize width must be between 1 and 16384, got 1099511627776"),
        ("too many bytes", resize_op(None, 16384, 16384), img(vec![1, 1, 4]), "resize failed: the resized image of shape [16384, 16384, 4] would take 1073741824 bytes, more than 268435456"),
        ("nan", resize_op(None, 2, 2), f32_image(vec![1, 1, 1], &[f32::NAN]), "resize failed: float32 images must hold finite values only"),
        ("missing key", resize_op(Some("x"), 2, 2), Element::Dict(BTreeMap::new()), "resize of key 'x' failed: the element has no such entry; its entries are none"),
    ];
    for (name, op, input, want) in cases {
        let err = resize(&op, input).unwrap_err();
        assert_eq!(err.to_string(), want, "{name}");
    }
}

#[test]
fn element_specs_know_the_channels_and_the_resized_sides() {
    let reg = FunctionRegistry::global();
    let strings = Tensor::from_strings(vec![1], vec![Bytes::from_static(b"x")]).unwrap();
    let spec_of = |ds: Dataset| element_spec(ds.def(), &reg).map(|s| s.to_string());
    let base = || Dataset::from_slices(strings.clone());
    let cases: Vec<(&str, Dataset, Result<&str, &str>)> = vec![
        ("decode", base().decode_image(None, 1), Ok("TensorSpec(shape=(None, None, 1), dtype=uint8)")),
        ("decode then resize", base().decode_image(None, 4).resize(None, 5, 7), Ok("TensorSpec(shape=(5, 7, 4), dtype=uint8)")),
        ("resize bytes", base().resize(None, 5, 7), Err("resize failed: needs a uint8 or float32 tensor of shape [height, width, channels], got TensorSpec(shape=(), dtype=string)")),
        ("decode ints", Dataset::range(3).decode_image(None, 3), Err("decode_image failed: needs a scalar string of image bytes, got TensorSpec(shape=(), dtype=int64)")),
        ("two channels", base().decode_image(None, 2), Err("decode_image channels must be 1, 3 or 4, got 2")),
        ("key on a tensor", base().decode_image(Some("a"), 3), Err("decode_image of key 'a' failed: key= needs a dict element, got TensorSpec(shape=(), dtype=string)")),
    ];
    for (name, ds, want) in cases {
        let got = spec_of(ds).map_err(|e| e.to_string());
        assert_eq!(got.as_deref().map_err(String::as_str), want, "{name}");
    }
}

#[test]
fn the_expression_syntax_parses_and_renders_the_image_ops() {
    let cases: &[(&str, &str)] = &[
        (
            "range(1).decode_image()",
            "range(1).decode_image(channels=3)",
        ),
        (
            "range(1).decode_image(channels=1)",
            "range(1).decode_image(channels=1)",
        ),
        (
            "range(1).decode_image(channels=4, key=\"img\")",
            "range(1).decode_image(key=\"img\", channels=4)",
        ),
        (
            "range(1).decode_image(key=img).resize(224, 200, key=img)",
            "range(1).decode_image(key=\"img\", channels=3).resize(224, 200, key=\"img\")",
        ),
        ("range(1).resize(1, 16384)", "range(1).resize(1, 16384)"),
    ];
    for (text, rendered) in cases {
        let def = parse(text).unwrap().into_def();
        assert_eq!(render_def(&def), *rendered, "{text}");
        assert_eq!(parse(rendered).unwrap().into_def(), def, "{rendered}");
    }
    let errors: &[(&str, &str)] = &[
        ("range(1).decode_image(channels=2)", "invalid dataset expression at column 32: channels must be 1, 3 or 4, found 2"),
        ("range(1).decode_image(3)", "invalid dataset expression at column 23: expected 'key=', 'channels=' or ')', found '3'"),
        ("range(1).resize(0, 2)", "invalid dataset expression at column 17: resize height must be positive, found 0"),
        ("range(1).resize(2, 16385)", "invalid dataset expression at column 20: resize width must be at most 16384, found 16385"),
        ("range(1).resize(2)", "invalid dataset expression at column 18: expected ',', found ')'"),
        ("range(1).resize(2, 2, img)", "invalid dataset expression at column 23: expected 'key=', found 'img'"),
    ];
    for (text, want) in errors {
        assert_eq!(parse(text).unwrap_err().to_string(), *want, "{text}");
    }
}

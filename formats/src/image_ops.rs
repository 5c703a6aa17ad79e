//! The native image ops: `decode_image` (JPEG or PNG bytes to a uint8 HWC tensor) and `resize`
//! (bilinear, uint8 or float32 HWC), on a bare tensor element or on one entry of a dict element.
//!
//! Decoding and resampling are the `image` crate's (built with only its JPEG and PNG decoders);
//! this module checks what goes in and out. Image bytes are outside input: a header may claim
//! any size, so decoding runs under limits (`MAX_IMAGE_SIDE` per side, `MAX_IMAGE_BYTES` in all)
//! and a resize past the same bounds is refused before anything is allocated. Every failure is a
//! `DatasetError::Image` naming the op and the key.
//!
//! The `image` crate clamps float samples to [0, 1] while resampling. Bilinear weights are
//! non-negative and sum to one, so every output lies within the input's range: float32 images
//! are mapped affinely onto [0, 1] around the resize and back, which keeps any value range.

use std::io::Cursor;

use bytes::Bytes;
use image::imageops::{self, FilterType};
use image::{ImageBuffer, ImageFormat, ImageReader, Limits, Luma, LumaA, Pixel, Rgb, Rgba};
use sluice_element::{pb, DType, DatasetError, Element, Tensor};
use sluice_pipeline::image_spec::{
    check_channels, check_resize, image_error, names, DECODE, MAX_IMAGE_BYTES, MAX_IMAGE_SIDE,
    RESIZE,
};

/// Decodes one element (or its entry `op.key`).
pub fn decode_image(op: &pb::DecodeImageOp, e: Element) -> Result<Element, DatasetError> {
    let key = op.key.as_deref();
    on_entry(DECODE, key, e, |t| {
        let bytes = match t.strings() {
            Some([b]) if t.rank() == 0 => b.clone(),
            _ => {
                return Err(format!(
                    "needs a scalar string of image bytes, got a {} tensor of shape {:?}",
                    t.dtype(),
                    t.shape()
                ))
            }
        };
        decode_bytes(&bytes, op.channels)
    })
}

/// Resizes one element (or its entry `op.key`).
pub fn resize(op: &pb::ResizeOp, e: Element) -> Result<Element, DatasetError> {
    check_resize(op)?;
    let key = op.key.as_deref();
    on_entry(RESIZE, key, e, |t| resize_tensor(&t, op.height, op.width))
}

fn decode_bytes(bytes: &Bytes, channels: u32) -> Result<Tensor, String> {
    let reader = ImageReader::new(Cursor::new(bytes.as_ref()))
        .with_guessed_format()
        .map_err(|e| e.to_string())?;
    match reader.format() {
        Some(ImageFormat::Jpeg | ImageFormat::Png) => {}
        _ => {
            let head: Vec<String> = bytes.iter().take(4).map(|b| format!("{b:02x}")).collect();
            return Err(format!(
                "not a JPEG or PNG image ({} bytes starting {})",
                bytes.len(),
                head.join(" ")
            ));
        }
    }
    let mut reader = reader;
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_IMAGE_SIDE as u32);
    limits.max_image_height = Some(MAX_IMAGE_SIDE as u32);
    limits.max_alloc = Some(MAX_IMAGE_BYTES);
    reader.limits(limits);
    let img = reader
        .decode()
        .map_err(|e| format!("corrupt or unsupported image: {e}"))?;
    let (w, h) = (img.width() as usize, img.height() as usize);
    let data = match channels {
        1 => img.into_luma8().into_raw(),
        3 => img.into_rgb8().into_raw(),
        4 => img.into_rgba8().into_raw(),
        c => return Err(format!("channels must be 1, 3 or 4, got {c}")),
    };
    Tensor::from_raw(
        DType::UInt8,
        vec![h, w, channels as usize],
        Bytes::from(data),
    )
    .map_err(|e| e.to_string())
}

fn resize_tensor(t: &Tensor, height: u64, width: u64) -> Result<Tensor, String> {
    let &[h, w, c] = t.shape() else {
        return Err(format!(
            "needs a tensor of shape [height, width, channels], got shape {:?}",
            t.shape()
        ));
    };
    check_channels(c)?;
    if h == 0 || w == 0 {
        return Err(format!(
            "cannot resize an empty image of shape {:?}",
            t.shape()
        ));
    }
    let side = |v: usize| u32::try_from(v).map_err(|_| format!("image side {v} is too large"));
    let (h32, w32) = (side(h)?, side(w)?);
    let (nh, nw) = (height as u32, width as u32);
    let out_shape = vec![height as usize, width as usize, c];
    let size = t.dtype().size().unwrap_or(1) as u64;
    let out_bytes = height * width * c as u64 * size;
    if out_bytes > MAX_IMAGE_BYTES {
        return Err(format!(
            "the resized image of shape {out_shape:?} would take {out_bytes} bytes, more than \
             {MAX_IMAGE_BYTES}"
        ));
    }
    match t.dtype() {
        DType::UInt8 => {
            let data = t.raw_data().expect("a uint8 tensor has raw data").to_vec();
            let out = resize_channels(data, c, w32, h32, nw, nh);
            Tensor::from_raw(DType::UInt8, out_shape, Bytes::from(out)).map_err(|e| e.to_string())
        }
        DType::Float32 => {
            let values = t
                .to_values::<f32>()
                .expect("a float32 tensor has f32 values");
            let out = resize_f32(values, c, w32, h32, nw, nh)?;
            Tensor::from_values(out_shape, &out).map_err(|e| e.to_string())
        }
        other => Err(format!("needs a uint8 or float32 image, got {other}")),
    }
}

/// Maps float samples onto [0, 1] (where the `image` crate keeps them), resizes, maps back.
fn resize_f32(
    values: Vec<f32>,
    c: usize,
    w: u32,
    h: u32,
    nw: u32,
    nh: u32,
) -> Result<Vec<f32>, String> {
    if values.iter().any(|v| !v.is_finite()) {
        return Err("float32 images must hold finite values only".to_string());
    }
    let lo = values.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let out_len = nw as usize * nh as usize * c;
    if hi <= lo {
        return Ok(vec![lo; out_len]);
    }
    let (lo64, span) = (f64::from(lo), f64::from(hi) - f64::from(lo));
    let unit: Vec<f32> = values
        .iter()
        .map(|&v| ((f64::from(v) - lo64) / span) as f32)
        .collect();
    let out = resize_channels(unit, c, w, h, nw, nh);
    Ok(out
        .into_iter()
        .map(|v| (f64::from(v) * span + lo64) as f32)
        .collect())
}

/// Resizes row-major `data` of `c` (1..=4, checked) interleaved channels.
fn resize_channels<S>(data: Vec<S>, c: usize, w: u32, h: u32, nw: u32, nh: u32) -> Vec<S>
where
    S: image::Primitive + 'static,
    Luma<S>: Pixel<Subpixel = S>,
    LumaA<S>: Pixel<Subpixel = S>,
    Rgb<S>: Pixel<Subpixel = S>,
    Rgba<S>: Pixel<Subpixel = S>,
{
    match c {
        1 => resize_pixels::<Luma<S>>(data, w, h, nw, nh),
        2 => resize_pixels::<LumaA<S>>(data, w, h, nw, nh),
        3 => resize_pixels::<Rgb<S>>(data, w, h, nw, nh),
        _ => resize_pixels::<Rgba<S>>(data, w, h, nw, nh),
    }
}

fn resize_pixels<P: Pixel + 'static>(
    data: Vec<P::Subpixel>,
    w: u32,
    h: u32,
    nw: u32,
    nh: u32,
) -> Vec<P::Subpixel> {
    let img = ImageBuffer::<P, Vec<P::Subpixel>>::from_raw(w, h, data)
        .expect("the tensor's shape is [h, w, channels], so its data fills the buffer");
    // Triangle is bilinear; when shrinking, its support widens with the scale (antialiasing).
    imageops::resize(&img, nw, nh, FilterType::Triangle).into_raw()
}

/// Applies `f` to the element's tensor, or to its dict entry `key`.
fn on_entry(
    op: &'static str,
    key: Option<&str>,
    e: Element,
    f: impl FnOnce(Tensor) -> Result<Tensor, String>,
) -> Result<Element, DatasetError> {
    let err = |m: String| image_error(op, key, m);
    match (key, e) {
        (None, Element::Tensor(t)) => Ok(Element::Tensor(f(t).map_err(err)?)),
        (Some(k), Element::Dict(mut fields)) => match fields.remove(k) {
            Some(Element::Tensor(t)) => {
                fields.insert(k.to_string(), Element::Tensor(f(t).map_err(err)?));
                Ok(Element::Dict(fields))
            }
            Some(_) => Err(err("the entry is not a tensor".to_string())),
            None => Err(err(format!(
                "the element has no such entry; its entries are {}",
                names(&fields)
            ))),
        },
        (None, _) => Err(err(
            "the element is not a tensor; pass key= to name a dict entry".to_string(),
        )),
        (Some(_), _) => Err(err("key= needs a dict element".to_string())),
    }
}

/// Encodes `height`×`width` RGB pixels (`height * width * 3` bytes, row-major) as a JPEG of
/// `quality` (1-100): the images benchmarks and tests write into TFRecord files.
pub fn encode_jpeg(
    pixels: &[u8],
    height: u32,
    width: u32,
    quality: u8,
) -> Result<Vec<u8>, DatasetError> {
    let want = height as usize * width as usize * 3;
    if pixels.len() != want || !(1..=100).contains(&quality) {
        return Err(DatasetError::invalid(format!(
            "encode_jpeg needs {height}x{width}x3 = {want} bytes and a quality in 1..=100, \
             got {} bytes and quality {quality}",
            pixels.len()
        )));
    }
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality)
        .encode(pixels, width, height, image::ExtendedColorType::Rgb8)
        .map_err(|e| DatasetError::invalid(format!("encode_jpeg failed: {e}")))?;
    Ok(out)
}

#[cfg(test)]
#[path = "image_ops_tests.rs"]
mod tests;

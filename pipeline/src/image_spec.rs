//! The rules of the native image ops `decode_image` and `resize`: their bounds (`MAX_IMAGE_SIDE`,
//! `MAX_IMAGE_BYTES`), the checks of their arguments, and the specs of their outputs. Decoding
//! and resizing pixels is `sluice-formats`' (`image_ops`), under these same bounds.

use std::collections::BTreeMap;

use sluice_element::{pb, DType, DatasetError, ElementSpec};

/// The largest height or width `decode_image` accepts and `resize` produces.
pub const MAX_IMAGE_SIDE: u64 = 16384;
/// The most bytes one decoded or resized image may take (and the decoder may allocate).
pub const MAX_IMAGE_BYTES: u64 = 256 << 20;

pub const DECODE: &str = "decode_image";
pub const RESIZE: &str = "resize";

/// `DatasetError::Image` of `op` on entry `key`.
pub fn image_error(
    op: &'static str,
    key: Option<&str>,
    message: impl Into<String>,
) -> DatasetError {
    DatasetError::Image {
        op,
        key: key.map(str::to_string),
        message: message.into(),
    }
}

/// Checks the op's own arguments (not the elements): channels 1, 3 or 4.
pub fn check_decode_image(op: &pb::DecodeImageOp) -> Result<(), DatasetError> {
    match op.channels {
        1 | 3 | 4 => Ok(()),
        c => Err(DatasetError::invalid(format!(
            "decode_image channels must be 1, 3 or 4, got {c}"
        ))),
    }
}

/// Checks the op's own arguments: both sides in 1..=`MAX_IMAGE_SIDE`.
pub fn check_resize(op: &pb::ResizeOp) -> Result<(), DatasetError> {
    for (name, side) in [("height", op.height), ("width", op.width)] {
        if side == 0 || side > MAX_IMAGE_SIDE {
            return Err(DatasetError::invalid(format!(
                "resize {name} must be between 1 and {MAX_IMAGE_SIDE}, got {side}"
            )));
        }
    }
    Ok(())
}

/// The spec after `decode_image`: the scalar string becomes uint8 [?, ?, channels].
pub(crate) fn decode_image_spec(
    op: &pb::DecodeImageOp,
    spec: ElementSpec,
) -> Result<ElementSpec, DatasetError> {
    check_decode_image(op)?;
    let key = op.key.as_deref();
    on_spec_entry(DECODE, key, spec, |s| match s {
        ElementSpec::Tensor {
            dtype: DType::String,
            shape,
        } if shape.is_empty() => Ok(ElementSpec::Tensor {
            dtype: DType::UInt8,
            shape: vec![None, None, Some(op.channels as usize)],
        }),
        other => Err(format!("needs a scalar string of image bytes, got {other}")),
    })
}

/// The spec after `resize`: a uint8 or float32 [H, W, C] becomes [height, width, C].
pub(crate) fn resize_spec(
    op: &pb::ResizeOp,
    spec: ElementSpec,
) -> Result<ElementSpec, DatasetError> {
    check_resize(op)?;
    let key = op.key.as_deref();
    on_spec_entry(RESIZE, key, spec, |s| match s {
        ElementSpec::Tensor { dtype, shape }
            if matches!(dtype, DType::UInt8 | DType::Float32) && shape.len() == 3 =>
        {
            if let Some(c) = shape[2] {
                check_channels(c)?;
            }
            Ok(ElementSpec::Tensor {
                dtype,
                shape: vec![Some(op.height as usize), Some(op.width as usize), shape[2]],
            })
        }
        other => Err(format!(
            "needs a uint8 or float32 tensor of shape [height, width, channels], got {other}"
        )),
    })
}

/// Checks an image's channel count: 1 to 4.
pub fn check_channels(c: usize) -> Result<(), String> {
    if (1..=4).contains(&c) {
        Ok(())
    } else {
        Err(format!("channels must be between 1 and 4, got {c}"))
    }
}

/// `on_entry` for specs.
fn on_spec_entry(
    op: &'static str,
    key: Option<&str>,
    spec: ElementSpec,
    f: impl FnOnce(ElementSpec) -> Result<ElementSpec, String>,
) -> Result<ElementSpec, DatasetError> {
    let err = |m: String| image_error(op, key, m);
    match (key, spec) {
        (None, s @ ElementSpec::Tensor { .. }) => f(s).map_err(err),
        (Some(k), ElementSpec::Dict(mut fields)) => match fields.remove(k) {
            Some(s) => {
                fields.insert(k.to_string(), f(s).map_err(err)?);
                Ok(ElementSpec::Dict(fields))
            }
            None => Err(err(format!(
                "the element has no such entry; its entries are {}",
                names(&fields)
            ))),
        },
        (None, s) => Err(err(format!(
            "the element {s} is not a tensor; pass key= to name a dict entry"
        ))),
        (Some(_), s) => Err(err(format!("key= needs a dict element, got {s}"))),
    }
}

/// The entries of a dict, quoted, for messages.
pub fn names<V>(fields: &BTreeMap<String, V>) -> String {
    if fields.is_empty() {
        return "none".to_string();
    }
    fields
        .keys()
        .map(|k| format!("'{k}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

//! The rules of the `parse_example` op: the feature specs a definition gives (`fixed_len_feature`,
//! `var_len_feature`), checked once into an `ExampleSpec` (names unique and non-empty, dtype
//! int64, float32 or string, a default of the feature's dtype and shape), the spec of the dicts
//! it produces and of the input it needs. Parsing records is `sluice-formats`'
//! (`ExampleParser`), which works from a checked `ExampleSpec`.

use sluice_element::{pb, DType, DatasetError, ElementSpec, Tensor};

/// A fixed-length feature of `shape` and `dtype` (int64, float32 or string), with an optional
/// default for records that lack it.
pub fn fixed_len_feature(
    name: &str,
    shape: Vec<u64>,
    dtype: DType,
    default_value: Option<Tensor>,
) -> pb::FeatureSpec {
    pb::FeatureSpec {
        name: name.to_string(),
        dtype: pb::DType::from(dtype) as i32,
        var_len: false,
        shape,
        default_value: default_value.map(|t| t.to_proto()),
    }
}

/// A variable-length feature: a 1-D tensor of however many values each record has.
pub fn var_len_feature(name: &str, dtype: DType) -> pb::FeatureSpec {
    pb::FeatureSpec {
        name: name.to_string(),
        dtype: pb::DType::from(dtype) as i32,
        var_len: true,
        shape: Vec::new(),
        default_value: None,
    }
}

/// The checked features of one `parse_example` op.
#[derive(Debug, Clone)]
pub struct ExampleSpec {
    pub features: Vec<Feature>,
}

/// One checked feature.
#[derive(Debug, Clone)]
pub struct Feature {
    pub name: String,
    pub dtype: DType,
    pub kind: FeatureKind,
}

/// A feature of fixed shape (with its default, if any) or of variable length.
#[derive(Debug, Clone)]
pub enum FeatureKind {
    Fixed {
        shape: Vec<usize>,
        /// Number of values the shape holds.
        len: usize,
        default: Option<Tensor>,
    },
    Var,
}

impl ExampleSpec {
    /// Checks the op's features (see the module header).
    pub fn new(op: &pb::ParseExampleOp) -> Result<ExampleSpec, DatasetError> {
        if op.features.is_empty() {
            return Err(DatasetError::invalid(
                "parse_example needs at least one feature",
            ));
        }
        let mut features = Vec::with_capacity(op.features.len());
        for f in &op.features {
            if f.name.is_empty() {
                return Err(DatasetError::invalid(
                    "parse_example: a feature has no name",
                ));
            }
            if features.iter().any(|g: &Feature| g.name == f.name) {
                return Err(DatasetError::invalid(format!(
                    "parse_example: feature '{}' is given twice",
                    f.name
                )));
            }
            let dtype = DType::try_from(f.dtype())?;
            if !matches!(dtype, DType::Int64 | DType::Float32 | DType::String) {
                return Err(DatasetError::invalid(format!(
                    "parse_example: feature '{}' has dtype {dtype}; a tf.train.Example holds \
                     int64, float32 or string (bytes) values",
                    f.name
                )));
            }
            let kind = if f.var_len {
                FeatureKind::Var
            } else {
                let shape = f
                    .shape
                    .iter()
                    .map(|&d| usize::try_from(d).unwrap_or(usize::MAX))
                    .collect::<Vec<_>>();
                let len = shape
                    .iter()
                    .try_fold(1usize, |n, &d| n.checked_mul(d))
                    .ok_or_else(|| {
                        DatasetError::invalid(format!(
                            "parse_example: feature '{}' has a shape too large: {shape:?}",
                            f.name
                        ))
                    })?;
                let default = match &f.default_value {
                    None => None,
                    Some(p) => Some(checked_default(&f.name, dtype, &shape, p)?),
                };
                FeatureKind::Fixed {
                    shape,
                    len,
                    default,
                }
            };
            features.push(Feature {
                name: f.name.clone(),
                dtype,
                kind,
            });
        }
        Ok(ExampleSpec { features })
    }

    /// The spec of the dicts this parser produces.
    pub fn element_spec(&self) -> ElementSpec {
        ElementSpec::Dict(
            self.features
                .iter()
                .map(|f| {
                    let shape = match &f.kind {
                        FeatureKind::Fixed { shape, .. } => {
                            shape.iter().map(|&d| Some(d)).collect()
                        }
                        FeatureKind::Var => vec![None],
                    };
                    (
                        f.name.clone(),
                        ElementSpec::Tensor {
                            dtype: f.dtype,
                            shape,
                        },
                    )
                })
                .collect(),
        )
    }

    /// Checks that the input elements are scalar strings (serialized Examples).
    pub fn check_input(input: &ElementSpec) -> Result<(), DatasetError> {
        match input {
            ElementSpec::Tensor {
                dtype: DType::String,
                shape,
            } if shape.is_empty() => Ok(()),
            other => Err(DatasetError::invalid(format!(
                "parse_example needs scalar string elements (serialized tf.train.Example \
                 records), got {other}"
            ))),
        }
    }
}

/// The default of a fixed-length feature as a tensor of its dtype and shape; a default with as
/// many values in another shape (a flat list) is reshaped, as tf reshapes it.
fn checked_default(
    name: &str,
    dtype: DType,
    shape: &[usize],
    proto: &pb::TensorProto,
) -> Result<Tensor, DatasetError> {
    let t = Tensor::from_proto(proto)?;
    if t.dtype() != dtype {
        return Err(DatasetError::invalid(format!(
            "parse_example: the default value of feature '{name}' is {}, the feature is {dtype}",
            t.dtype()
        )));
    }
    t.reshaped(shape).map_err(|_| {
        DatasetError::invalid(format!(
            "parse_example: the default value of feature '{name}' has shape {:?}, which does \
             not fit the feature's shape {shape:?}",
            t.shape()
        ))
    })
}

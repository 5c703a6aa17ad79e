//! The arguments of `parse_example` and `tfrecord` in the expression syntax, kept beside the
//! parser (a child module, so it shares the parser's token cursor):
//!
//! ```text
//! files("d/*.tfrecord").tfrecord(compression="GZIP")
//!     .parse_example(label=fixed(int64), xy=fixed(float32, shape=[2], default=[0.0, 0.0]),
//!                    image=fixed(bytes), tags=var(int64), "odd name"=var(bytes))
//! ```
//!
//! A feature's dtype is `int64`, `float32` or `bytes` (`string` is the same); its name is an
//! identifier or a quoted string. Whole-op rules (unique names, a default that fits the shape)
//! are `ExampleSpec`'s, checked when the definition is validated.

use sluice_element::{pb, DType, DatasetError};

use super::{parse_error, tensor_from_literal, Parser, Tok};
use crate::example_spec::{fixed_len_feature, var_len_feature};

const FEATURE_DTYPES: &str = "int64, float32 or bytes";

impl Parser {
    /// `compression="GZIP"` (or the bare string): GZIP, ZLIB, or "" for none, as tf spells them.
    pub(super) fn compression_arg(&mut self) -> Result<pb::RecordCompression, DatasetError> {
        self.keyword("compression");
        let col = self.peek().col;
        let Tok::Str(_) = self.peek().tok else {
            return Err(self.unexpected("a quoted compression (\"GZIP\", \"ZLIB\" or \"\")"));
        };
        match self.string_arg("a quoted compression")?.as_str() {
            "" => Ok(pb::RecordCompression::None),
            "GZIP" => Ok(pb::RecordCompression::Gzip),
            "ZLIB" => Ok(pb::RecordCompression::Zlib),
            other => Err(parse_error(
                col,
                format!("unknown compression '{other}'; expected \"GZIP\", \"ZLIB\" or \"\""),
            )),
        }
    }

    /// `name=fixed(...)` or `name=var(...)`, comma-separated, up to (not including) `)`.
    pub(super) fn feature_args(&mut self) -> Result<Vec<pb::FeatureSpec>, DatasetError> {
        let mut features = Vec::new();
        loop {
            features.push(self.feature()?);
            if !self.more_args()? {
                return Ok(features);
            }
        }
    }

    fn feature(&mut self) -> Result<pb::FeatureSpec, DatasetError> {
        let name = match &self.peek().tok {
            Tok::Ident(_) | Tok::Str(_) => self.string_arg("a feature name")?,
            _ => return Err(self.unexpected("a feature name")),
        };
        self.expect_punct('=', "'='")?;
        let fixed = match &self.peek().tok {
            Tok::Ident(k) if k == "fixed" => true,
            Tok::Ident(k) if k == "var" => false,
            _ => return Err(self.unexpected("'fixed(...)' or 'var(...)'")),
        };
        self.next();
        self.expect_punct('(', "'('")?;
        let dtype = self.feature_dtype()?;
        if !fixed {
            self.close()?;
            return Ok(var_len_feature(&name, dtype));
        }
        let mut shape = Vec::new();
        let mut default = None;
        while self.more_args()? {
            if self.keyword("shape") {
                shape = self.shape()?;
            } else if self.keyword("default") {
                let lit = self.literal()?;
                default = Some(tensor_from_literal(&lit, Some(dtype))?);
            } else {
                return Err(self.unexpected("'shape=' or 'default='"));
            }
        }
        self.close()?;
        Ok(fixed_len_feature(&name, shape, dtype, default))
    }

    fn feature_dtype(&mut self) -> Result<DType, DatasetError> {
        let col = self.peek().col;
        let Tok::Ident(_) = self.peek().tok else {
            return Err(self.unexpected(&format!("a feature dtype ({FEATURE_DTYPES})")));
        };
        match self.string_arg("a feature dtype")?.as_str() {
            "int64" => Ok(DType::Int64),
            "float32" => Ok(DType::Float32),
            "bytes" | "string" => Ok(DType::String),
            other => Err(parse_error(
                col,
                format!("unknown feature dtype '{other}'; expected {FEATURE_DTYPES}"),
            )),
        }
    }

    /// `[d0, d1, ...]`, possibly empty (a scalar).
    fn shape(&mut self) -> Result<Vec<u64>, DatasetError> {
        self.expect_punct('[', "'['")?;
        let mut dims = Vec::new();
        if self.is_punct(']') {
            self.next();
            return Ok(dims);
        }
        loop {
            dims.push(self.u64_arg("dimension")?);
            if self.is_punct(',') {
                self.next();
            } else {
                self.expect_punct(']', "']' or ','")?;
                return Ok(dims);
            }
        }
    }
}

//! The literals of the expression syntax: nested lists of numbers, booleans and strings (the
//! columns of `from_slices`, a feature's default), bounded in depth, and the tensors they make.

use bytes::Bytes;
use sluice_element::{DType, DatasetError, Tensor, TensorValue};

use super::{parse_error, Parser, Tok, Token};
use crate::render::implied_dtype;

/// A parsed `from_slices` literal value with its column.
pub(super) enum Lit {
    List(Vec<Lit>, usize),
    Leaf(Token),
}

/// How deeply list literals may nest (a tensor's rank, plus one): far past any real tensor.
pub(crate) const MAX_LITERAL_DEPTH: usize = 32;

impl Parser {
    /// A nested list literal or a leaf value.
    pub(super) fn literal(&mut self) -> Result<Lit, DatasetError> {
        self.literal_at(0)
    }

    /// A literal inside `depth` open lists: nesting is bounded, so an expression from anyone
    /// cannot exhaust the stack.
    fn literal_at(&mut self, depth: usize) -> Result<Lit, DatasetError> {
        let t = self.next();
        match &t.tok {
            Tok::Punct('[') if depth >= MAX_LITERAL_DEPTH => Err(parse_error(
                t.col,
                format!("list literal nested deeper than {MAX_LITERAL_DEPTH} levels"),
            )),
            Tok::Punct('[') => {
                let mut items = Vec::new();
                if self.is_punct(']') {
                    self.next();
                    return Ok(Lit::List(items, t.col));
                }
                loop {
                    items.push(self.literal_at(depth + 1)?);
                    if self.is_punct(',') {
                        self.next();
                        // A trailing comma is fine, as in Python.
                        if self.is_punct(']') {
                            self.next();
                            break;
                        }
                    } else {
                        self.expect_punct(']', "']' or ','")?;
                        break;
                    }
                }
                Ok(Lit::List(items, t.col))
            }
            Tok::Punct('-') if matches!(&self.peek().tok, Tok::Ident(s) if s == "inf") => {
                let inf = self.next();
                Ok(Lit::Leaf(Token {
                    tok: Tok::Float(f64::NEG_INFINITY),
                    col: t.col,
                    text: format!("-{}", inf.text),
                }))
            }
            Tok::Int(_) | Tok::Float(_) | Tok::Str(_) => Ok(Lit::Leaf(t)),
            Tok::Ident(s)
                if matches!(
                    s.as_str(),
                    "true" | "false" | "True" | "False" | "nan" | "inf"
                ) =>
            {
                Ok(Lit::Leaf(t))
            }
            _ => Err(parse_error(
                t.col,
                format!("expected a value or '[', found {}", t.found()),
            )),
        }
    }
}

/// Shape of a rectangular literal, checking every sibling has the same shape.
fn literal_shape(lit: &Lit) -> Result<Vec<usize>, DatasetError> {
    match lit {
        Lit::Leaf(_) => Ok(Vec::new()),
        Lit::List(items, col) => {
            let mut shape = vec![items.len()];
            if let Some(first) = items.first() {
                let inner = literal_shape(first)?;
                for item in &items[1..] {
                    let s = literal_shape(item)?;
                    if s != inner {
                        let at = match item {
                            Lit::List(_, c) => *c,
                            Lit::Leaf(t) => t.col,
                        };
                        return Err(parse_error(at, format!("ragged list: expected shape {inner:?}, found {s:?} (list at column {col})")));
                    }
                }
                shape.extend(inner);
            }
            Ok(shape)
        }
    }
}

fn leaves<'a>(lit: &'a Lit, out: &mut Vec<&'a Token>) {
    match lit {
        Lit::Leaf(t) => out.push(t),
        Lit::List(items, _) => items.iter().for_each(|i| leaves(i, out)),
    }
}

pub(super) fn tensor_from_literal(lit: &Lit, dtype: Option<DType>) -> Result<Tensor, DatasetError> {
    let shape = literal_shape(lit)?;
    let mut flat = Vec::new();
    leaves(lit, &mut flat);
    let dtype = dtype.unwrap_or_else(|| {
        let has = |f: fn(&Tok) -> bool| flat.iter().any(|t| f(&t.tok));
        implied_dtype(
            has(|t| matches!(t, Tok::Str(_))),
            has(|t| {
                matches!(t, Tok::Float(_)) || matches!(t, Tok::Ident(s) if s == "nan" || s == "inf")
            }),
            has(|t| matches!(t, Tok::Ident(s) if s != "nan" && s != "inf")),
        )
    });
    let mismatch = |t: &Token| {
        parse_error(
            t.col,
            format!("expected a {dtype} value, found {}", t.found()),
        )
    };
    match dtype {
        DType::String => {
            let values = flat
                .iter()
                .map(|t| match &t.tok {
                    Tok::Str(b) => Ok(Bytes::from(b.clone())),
                    _ => Err(mismatch(t)),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Tensor::from_strings(shape, values)
        }
        DType::Bool => {
            let values = flat
                .iter()
                .map(|t| match &t.tok {
                    Tok::Ident(s) if s == "true" || s == "True" => Ok(true),
                    Tok::Ident(s) if s == "false" || s == "False" => Ok(false),
                    _ => Err(mismatch(t)),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Tensor::from_values(shape, &values)
        }
        DType::Float32 => {
            let values: Vec<f32> = floats(&flat, &mismatch)?
                .into_iter()
                .map(|v| v as f32)
                .collect();
            Tensor::from_values(shape, &values)
        }
        DType::Float64 => Tensor::from_values(shape, &floats(&flat, &mismatch)?),
        DType::Int8 => ints::<i8>(shape, &flat, &mismatch),
        DType::Int16 => ints::<i16>(shape, &flat, &mismatch),
        DType::Int32 => ints::<i32>(shape, &flat, &mismatch),
        DType::Int64 => ints::<i64>(shape, &flat, &mismatch),
        DType::UInt8 => ints::<u8>(shape, &flat, &mismatch),
        DType::UInt16 => ints::<u16>(shape, &flat, &mismatch),
        DType::UInt32 => ints::<u32>(shape, &flat, &mismatch),
        DType::UInt64 => ints::<u64>(shape, &flat, &mismatch),
    }
}

fn floats(
    flat: &[&Token],
    mismatch: &dyn Fn(&Token) -> DatasetError,
) -> Result<Vec<f64>, DatasetError> {
    flat.iter()
        .map(|t| match &t.tok {
            Tok::Float(v) => Ok(*v),
            Tok::Int(s) => s.parse::<f64>().map_err(|_| mismatch(t)),
            Tok::Ident(s) if s == "nan" => Ok(f64::NAN),
            Tok::Ident(s) if s == "inf" => Ok(f64::INFINITY),
            _ => Err(mismatch(t)),
        })
        .collect()
}

fn ints<T: TensorValue + TryFrom<i128>>(
    shape: Vec<usize>,
    flat: &[&Token],
    mismatch: &dyn Fn(&Token) -> DatasetError,
) -> Result<Tensor, DatasetError> {
    let values = flat
        .iter()
        .map(|t| match &t.tok {
            Tok::Int(s) => s
                .parse::<i128>()
                .ok()
                .and_then(|v| T::try_from(v).ok())
                .ok_or_else(|| {
                    parse_error(t.col, format!("value {s} is out of range for {}", T::DTYPE))
                }),
            _ => Err(mismatch(t)),
        })
        .collect::<Result<Vec<T>, _>>()?;
    Tensor::from_values(shape, &values)
}

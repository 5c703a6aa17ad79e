//! The dataset expression parser: text such as `range(10).map(square).batch(4)` to a
//! `pb::DatasetDef` (rendering back is `Display for Dataset`, in `dataset.rs`).
//!
//! A tokenizer records each token's 1-based column; a recursive-descent parser over the tokens
//! reports `DatasetError::Parse` naming the column, what was expected and what was found.
//! Function names are not resolved here (the registry may grow later); `validate` does that.

use bytes::Bytes;

use crate::dataset::{implied_dtype, Dataset, Transform};
use crate::dtype::DType;
use crate::error::DatasetError;
use crate::lexer::{parse_error, tokenize, Tok, Token};
use crate::pb;
use crate::tensor::{Tensor, TensorValue};

const TRANSFORMATIONS: &str = "map, filter, batch, shuffle, repeat, take, skip, shard, prefetch, \
     enumerate, decode_image, resize, parse_example";
const SOURCES: &str = "range, from_slices, files";
/// tf.data's placeholder for numbers the HINT sharding policy fills in.
const SHARD_HINT: &str = "SHARD_HINT";

/// Parses a whole expression: a source, then zero or more `.op(...)`.
pub fn parse(expr: &str) -> Result<Dataset, DatasetError> {
    let mut p = Parser::new(expr)?;
    let mut ds = p.source()?;
    for op in p.ops(false)? {
        ds = ds.push_op(op);
    }
    Ok(ds)
}

/// Parses a chain of ops without a source: `.map(square).batch(2)` or `map(square).batch(2)`.
/// An empty string is an empty chain.
pub fn parse_ops(expr: &str) -> Result<Vec<pb::Op>, DatasetError> {
    let mut p = Parser::new(expr)?;
    p.ops(true)
}

/// A parsed `from_slices` literal value with its column.
enum Lit {
    List(Vec<Lit>, usize),
    Leaf(Token),
}

/// How deeply list literals may nest (a tensor's rank, plus one): far past any real tensor.
pub const MAX_LITERAL_DEPTH: usize = 32;

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn new(expr: &str) -> Result<Self, DatasetError> {
        Ok(Parser {
            tokens: tokenize(expr)?,
            pos: 0,
        })
    }

    fn peek(&self) -> &Token {
        &self.tokens[self.pos.min(self.tokens.len() - 1)]
    }

    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if self.pos < self.tokens.len() - 1 {
            self.pos += 1;
        }
        t
    }

    fn unexpected(&self, expected: &str) -> DatasetError {
        let t = self.peek();
        parse_error(t.col, format!("expected {expected}, found {}", t.found()))
    }

    fn is_punct(&self, c: char) -> bool {
        self.peek().tok == Tok::Punct(c)
    }

    fn expect_punct(&mut self, c: char, expected: &str) -> Result<(), DatasetError> {
        if self.is_punct(c) {
            self.next();
            Ok(())
        } else {
            Err(self.unexpected(expected))
        }
    }

    /// After an argument: `,` (returns true) or `)` (returns false, consumed).
    fn comma_or_close(&mut self) -> Result<bool, DatasetError> {
        if self.is_punct(',') {
            self.next();
            Ok(true)
        } else {
            self.expect_punct(')', "')' or ','").map(|()| false)
        }
    }

    /// After an argument: `,` (consumed, returns true) or `)` (left for `close`, returns false).
    fn more_args(&mut self) -> Result<bool, DatasetError> {
        if self.is_punct(',') {
            self.next();
            Ok(true)
        } else if self.is_punct(')') {
            Ok(false)
        } else {
            Err(self.unexpected("')' or ','"))
        }
    }

    fn is_ident(&self, name: &str) -> bool {
        matches!(&self.peek().tok, Tok::Ident(s) if s == name)
    }

    /// Consumes a `SHARD_HINT` argument if one is next.
    fn shard_hint_arg(&mut self) -> bool {
        let found = self.is_ident(SHARD_HINT);
        if found {
            self.next();
        }
        found
    }

    fn close(&mut self) -> Result<(), DatasetError> {
        self.expect_punct(')', "')'")
    }

    fn int(&mut self, what: &str) -> Result<(i128, usize), DatasetError> {
        let t = self.peek().clone();
        match &t.tok {
            Tok::Int(text) => {
                let v = text
                    .parse::<i128>()
                    .map_err(|_| parse_error(t.col, format!("{what} {text} is out of range")))?;
                self.next();
                Ok((v, t.col))
            }
            _ => Err(self.unexpected(&format!("an integer {what}"))),
        }
    }

    fn i64_arg(&mut self, what: &str) -> Result<(i64, usize), DatasetError> {
        let (v, col) = self.int(what)?;
        let v = i64::try_from(v)
            .map_err(|_| parse_error(col, format!("{what} {v} is out of range")))?;
        Ok((v, col))
    }

    fn u64_arg(&mut self, what: &str) -> Result<u64, DatasetError> {
        let (v, col) = self.int(what)?;
        if v < 0 {
            return Err(parse_error(
                col,
                format!("{what} must not be negative, found {v}"),
            ));
        }
        u64::try_from(v).map_err(|_| parse_error(col, format!("{what} {v} is out of range")))
    }

    fn positive_arg(&mut self, what: &str) -> Result<u64, DatasetError> {
        let col = self.peek().col;
        let v = self.int(what)?.0;
        if v <= 0 {
            return Err(parse_error(
                col,
                format!("{what} must be positive, found {v}"),
            ));
        }
        u64::try_from(v).map_err(|_| parse_error(col, format!("{what} {v} is out of range")))
    }

    fn bool_arg(&mut self, what: &str) -> Result<bool, DatasetError> {
        match &self.peek().tok {
            Tok::Ident(s) if s == "true" || s == "True" => {
                self.next();
                Ok(true)
            }
            Tok::Ident(s) if s == "false" || s == "False" => {
                self.next();
                Ok(false)
            }
            _ => Err(self.unexpected(what)),
        }
    }

    /// Consumes `name=` if it comes next.
    fn keyword(&mut self, name: &str) -> bool {
        let is_kw = matches!(&self.peek().tok, Tok::Ident(s) if s == name)
            && self
                .tokens
                .get(self.pos + 1)
                .is_some_and(|t| t.tok == Tok::Punct('='));
        if is_kw {
            self.pos += 2;
        }
        is_kw
    }

    fn string_arg(&mut self, expected: &str) -> Result<String, DatasetError> {
        let t = self.peek().clone();
        let s = match &t.tok {
            Tok::Ident(s) => s.clone(),
            Tok::Str(b) => String::from_utf8(b.clone())
                .map_err(|_| parse_error(t.col, "string must be valid UTF-8"))?,
            _ => return Err(self.unexpected(expected)),
        };
        self.next();
        Ok(s)
    }

    fn source(&mut self) -> Result<Dataset, DatasetError> {
        let t = self.next();
        let Tok::Ident(name) = &t.tok else {
            return Err(parse_error(
                t.col,
                format!("expected a source ({SOURCES}), found {}", t.found()),
            ));
        };
        match name.as_str() {
            "range" => {
                self.expect_punct('(', "'('")?;
                let mut args = vec![self.i64_arg("range bound")?];
                while args.len() < 3 && self.comma_or_close()? {
                    let what = if args.len() == 1 {
                        "range bound"
                    } else {
                        "range step"
                    };
                    args.push(self.i64_arg(what)?);
                }
                if args.len() == 3 {
                    self.close()?;
                }
                Ok(match args[..] {
                    [(stop, _)] => Dataset::range(stop),
                    [(start, _), (stop, _)] => Dataset::range_with(start, stop, 1),
                    [(start, _), (stop, _), (step, col)] => {
                        if step == 0 {
                            return Err(parse_error(col, "range step must not be zero"));
                        }
                        Dataset::range_with(start, stop, step)
                    }
                    _ => unreachable!("between one and three range arguments were parsed"),
                })
            }
            "from_slices" => {
                self.expect_punct('(', "'('")?;
                if !self.is_punct('[') {
                    return Err(self.unexpected("'['"));
                }
                let lit = self.literal()?;
                let mut dtype = None;
                if self.comma_or_close()? {
                    if !self.keyword("dtype") {
                        return Err(self.unexpected("'dtype='"));
                    }
                    let t = self.peek().clone();
                    let name = self.string_arg("a dtype name")?;
                    dtype = Some(name.parse::<DType>().map_err(|_| {
                        parse_error(
                            t.col,
                            format!("unknown dtype '{name}'; expected one of {}", dtype_names()),
                        )
                    })?);
                    self.close()?;
                }
                Ok(Dataset::from_slices(tensor_from_literal(&lit, dtype)?))
            }
            "files" => {
                self.expect_punct('(', "'('")?;
                let t = self.peek().clone();
                let Tok::Str(_) = t.tok else {
                    return Err(self.unexpected("a quoted file pattern"));
                };
                let pattern = self.string_arg("a quoted file pattern")?;
                self.close()?;
                self.expect_punct('.', "'.lines()' or '.tfrecord()'")?;
                let builder = Dataset::files(&pattern);
                let tfrecord = match &self.peek().tok {
                    Tok::Ident(f) if f == "lines" => false,
                    Tok::Ident(f) if f == "tfrecord" => true,
                    _ => return Err(self.unexpected("'lines' or 'tfrecord'")),
                };
                self.next();
                self.expect_punct('(', "'('")?;
                if !tfrecord {
                    self.close()?;
                    return Ok(builder.lines());
                }
                let compression = if self.is_punct(')') {
                    pb::RecordCompression::None
                } else {
                    self.compression_arg()?
                };
                self.close()?;
                Ok(builder.tfrecord_compressed(compression))
            }
            _ => Err(DatasetError::Parse {
                column: t.col,
                message: format!(
                    "unknown source '{name}' at column {}; expected one of {SOURCES}",
                    t.col
                ),
            }),
        }
    }

    /// `.op(...)` until the end. With `bare_first`, the first op may omit its `.`.
    fn ops(&mut self, bare_first: bool) -> Result<Vec<pb::Op>, DatasetError> {
        let mut ops = Vec::new();
        if bare_first && matches!(self.peek().tok, Tok::Ident(_)) {
            ops.push(self.op()?);
        }
        loop {
            if self.peek().tok == Tok::End {
                return Ok(ops);
            }
            let expected = if ops.is_empty() && bare_first {
                "a transformation"
            } else {
                "'.' or end of input"
            };
            self.expect_punct('.', expected)?;
            ops.push(self.op()?);
        }
    }

    fn op(&mut self) -> Result<pb::Op, DatasetError> {
        let t = self.peek().clone();
        let Tok::Ident(name) = &t.tok else {
            return Err(self.unexpected("a transformation name"));
        };
        let builder = OpCollector::default();
        let known = matches!(
            name.as_str(),
            "map"
                | "filter"
                | "batch"
                | "shuffle"
                | "repeat"
                | "take"
                | "skip"
                | "shard"
                | "prefetch"
                | "enumerate"
                | "decode_image"
                | "resize"
                | "parse_example"
        );
        if !known {
            return Err(DatasetError::Parse {
                column: t.col,
                message: format!("unknown transformation '{name}' at column {}; expected one of {TRANSFORMATIONS}", t.col),
            });
        }
        self.next();
        self.expect_punct('(', "'('")?;
        let b = match name.as_str() {
            "map" => builder.map(&self.string_arg("a function name")?),
            "filter" => builder.filter(&self.string_arg("a function name")?),
            "batch" => {
                let n = self.positive_arg("batch size")?;
                let mut drop = false;
                if self.more_args()? {
                    self.keyword("drop_remainder");
                    drop = self.bool_arg("'drop_remainder=true' or 'drop_remainder=false'")?;
                }
                builder.batch_with(n, drop)
            }
            "shuffle" => {
                let n = self.positive_arg("shuffle buffer size")?;
                let mut seed = None;
                if self.more_args()? {
                    self.keyword("seed");
                    seed = Some(self.u64_arg("seed")?);
                }
                builder.shuffle(n, seed)
            }
            "repeat" => {
                if self.is_punct(')') {
                    builder.repeat_forever()
                } else {
                    builder.repeat(self.u64_arg("repeat count")?)
                }
            }
            "take" => builder.take(self.u64_arg("take count")?),
            "skip" => builder.skip(self.u64_arg("skip count")?),
            "shard" if self.shard_hint_arg() => {
                // As in tf.data, the index next to a SHARD_HINT is not used: the HINT policy
                // supplies both numbers.
                self.expect_punct(',', "','")?;
                if !self.shard_hint_arg() {
                    self.u64_arg("shard index or SHARD_HINT")?;
                }
                builder.shard_hint()
            }
            "shard" => {
                let n = self.positive_arg("number of shards")?;
                self.expect_punct(',', "','")?;
                let col = self.peek().col;
                if self.is_ident(SHARD_HINT) {
                    return Err(parse_error(
                        col,
                        format!("{SHARD_HINT} as the shard index needs {SHARD_HINT} as the number of shards too: shard({SHARD_HINT}, {SHARD_HINT})"),
                    ));
                }
                let index = self.u64_arg("shard index")?;
                if index >= n {
                    return Err(parse_error(
                        col,
                        format!("shard index {index} must be less than the number of shards {n}"),
                    ));
                }
                builder.shard(n, index)
            }
            "parse_example" => builder.parse_example(self.feature_args()?),
            "enumerate" => {
                if self.is_punct(')') {
                    builder.enumerate()
                } else {
                    self.keyword("start");
                    builder.enumerate_from(self.i64_arg("enumerate start")?.0)
                }
            }
            "decode_image" => {
                let (key, channels) = self.decode_image_args()?;
                builder.decode_image(key.as_deref(), channels)
            }
            "resize" => {
                let (height, width, key) = self.resize_args()?;
                builder.resize(key.as_deref(), height, width)
            }
            _ => builder.prefetch(self.u64_arg("prefetch buffer size")?),
        };
        self.close()?;
        Ok(b.0
            .into_iter()
            .next()
            .expect("the builder pushed exactly one op"))
    }

    /// A nested list literal or a leaf value.
    fn literal(&mut self) -> Result<Lit, DatasetError> {
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

#[path = "parser_features.rs"]
mod features;

/// Collects ops pushed through `Transform`, so the parser builds ops exactly as the builder does.
#[derive(Default)]
struct OpCollector(Vec<pb::Op>);

impl Transform for OpCollector {
    fn push_op(mut self, op: pb::Op) -> Self {
        self.0.push(op);
        self
    }
}

fn dtype_names() -> String {
    DType::ALL
        .iter()
        .map(|d| d.name())
        .collect::<Vec<_>>()
        .join(", ")
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

fn tensor_from_literal(lit: &Lit, dtype: Option<DType>) -> Result<Tensor, DatasetError> {
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

#[path = "parser_image.rs"]
mod image;

#[cfg(test)]
#[path = "parser_tests.rs"]
mod tests;

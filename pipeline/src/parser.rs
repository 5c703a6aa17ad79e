//! The dataset expression parser: text such as `range(10).map(square).batch(4)` to a
//! `pb::DatasetDef` (rendering back is `render`'s).
//!
//! A tokenizer records each token's 1-based column; a recursive-descent parser over the tokens
//! reports `DatasetError::Parse` naming the column, what was expected and what was found.
//! Function names are not resolved here (the registry may grow later); `validate` does that.

use sluice_element::{pb, DType, DatasetError};

use crate::dataset::{Dataset, Transform};
use crate::lexer::{parse_error, tokenize, Tok, Token};
use literals::tensor_from_literal;

pub(crate) const TRANSFORMATIONS: &str =
    "map, filter, batch, shuffle, repeat, take, skip, shard, prefetch, \
     enumerate, decode_image, resize, parse_example, padded_batch, unbatch, ignore_errors, cache, \
     snapshot, concatenate, interleave, take_while, group_by_window";
const SOURCES: &str =
    "range, from_slices, from_tensors, files, random, zip, sample_from_datasets, choose_from_datasets";
/// A nested dataset is parsed on a new stack segment of `STACK_SEGMENT` bytes when less than
/// `STACK_RED_ZONE` is left of the current one.
const STACK_RED_ZONE: usize = 128 * 1024;
const STACK_SEGMENT: usize = 2 * 1024 * 1024;
/// The most interleave templates an expression may nest (each is parsed recursively).
const MAX_TEMPLATE_NESTING: usize = 16;
/// tf.data's placeholder for numbers the HINT sharding policy fills in.
pub(crate) const SHARD_HINT: &str = "SHARD_HINT";

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

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    /// How many dataset expressions enclose the one being parsed (zip inputs, concatenate's
    /// argument, ...): bounded, so an expression from anyone cannot exhaust the stack.
    depth: usize,
    /// How many interleave templates enclose the current position.
    templates: usize,
}

impl Parser {
    fn new(expr: &str) -> Result<Self, DatasetError> {
        Ok(Parser {
            tokens: tokenize(expr)?,
            pos: 0,
            depth: 0,
            templates: 0,
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

    /// The rest of a literal source's arguments: `)`, or `, dtype="NAME")`.
    fn optional_dtype(&mut self) -> Result<Option<DType>, DatasetError> {
        if !self.comma_or_close()? {
            return Ok(None);
        }
        if !self.keyword("dtype") {
            return Err(self.unexpected("'dtype='"));
        }
        let t = self.peek().clone();
        let name = self.string_arg("a dtype name")?;
        let dtype = name.parse::<DType>().map_err(|_| {
            parse_error(
                t.col,
                format!("unknown dtype '{name}'; expected one of {}", dtype_names()),
            )
        })?;
        self.close()?;
        Ok(Some(dtype))
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

    /// A dataset expression inside another one: a source and its `.op(...)` chain, up to the
    /// `,` or `)` that follows it.
    fn nested_dataset(&mut self) -> Result<Dataset, DatasetError> {
        let col = self.peek().col;
        if self.depth >= crate::limits::DEFAULT_MAX_PIPELINE_DEPTH {
            return Err(parse_error(
                col,
                format!(
                    "datasets nested deeper than {} levels",
                    crate::limits::DEFAULT_MAX_PIPELINE_DEPTH
                ),
            ));
        }
        self.depth += 1;
        // Each level takes a few frames holding definitions; a debug build's frames are large
        // enough that 64 levels overflowed a test thread's 2 MiB stack, so the stack grows here.
        let ds = stacker::maybe_grow(STACK_RED_ZONE, STACK_SEGMENT, || {
            let mut ds = self.source()?;
            while self.is_punct('.') {
                self.next();
                ds = ds.push_op(self.op()?);
            }
            Ok::<_, DatasetError>(ds)
        })?;
        self.depth -= 1;
        Ok(ds)
    }

    /// `[a, b, ...]`: a list of dataset expressions.
    fn dataset_list(&mut self) -> Result<Vec<Dataset>, DatasetError> {
        self.expect_punct('[', "'[' and a list of datasets")?;
        let mut out = Vec::new();
        while !self.is_punct(']') {
            out.push(self.nested_dataset()?);
            if self.is_punct(',') {
                self.next();
            } else if !self.is_punct(']') {
                return Err(self.unexpected("']' or ','"));
            }
        }
        self.next();
        Ok(out)
    }

    /// `key=` before a zip input (an identifier or a quoted string), if one comes next.
    fn zip_key(&mut self) -> Result<Option<String>, DatasetError> {
        let is_key = matches!(self.peek().tok, Tok::Ident(_) | Tok::Str(_))
            && self
                .tokens
                .get(self.pos + 1)
                .is_some_and(|t| t.tok == Tok::Punct('='));
        if !is_key {
            return Ok(None);
        }
        let key = self.string_arg("a key")?;
        self.next();
        Ok(Some(key))
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
                let dtype = self.optional_dtype()?;
                Ok(Dataset::from_slices(tensor_from_literal(&lit, dtype)?))
            }
            "from_tensors" => {
                self.expect_punct('(', "'('")?;
                let lit = self.literal()?;
                let dtype = self.optional_dtype()?;
                let value = sluice_element::Element::Tensor(tensor_from_literal(&lit, dtype)?);
                Ok(Dataset::from_tensors(&value))
            }
            "zip" => {
                self.expect_punct('(', "'('")?;
                let mut inputs = Vec::new();
                let mut keyed = Vec::new();
                loop {
                    let col = self.peek().col;
                    let key = self.zip_key()?;
                    let ds = self.nested_dataset()?;
                    match key {
                        Some(k) if inputs.is_empty() => keyed.push((k, ds)),
                        None if keyed.is_empty() => inputs.push(ds),
                        _ => {
                            return Err(parse_error(
                                col,
                                "zip takes datasets all with keys or all without",
                            ))
                        }
                    }
                    if !self.comma_or_close()? {
                        break;
                    }
                }
                if keyed.is_empty() {
                    Ok(Dataset::zip(inputs))
                } else {
                    let mut keys: Vec<&String> = keyed.iter().map(|(k, _)| k).collect();
                    keys.sort();
                    if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
                        return Err(parse_error(
                            t.col,
                            format!("zip has the key '{}' twice", w[0]),
                        ));
                    }
                    Ok(Dataset::zip_dict(keyed))
                }
            }
            "sample_from_datasets" => {
                self.expect_punct('(', "'('")?;
                let inputs = self.dataset_list()?;
                let (mut weights, mut seed, mut stop) = (None, None, false);
                while self.comma_or_close()? {
                    if self.keyword("weights") {
                        let lit = self.literal()?;
                        let t = tensor_from_literal(&lit, Some(DType::Float64))?;
                        weights = Some(t.to_values::<f64>().unwrap_or_default());
                    } else if self.keyword("seed") {
                        seed = Some(self.u64_arg("seed")?);
                    } else if self.keyword("stop_on_empty_dataset") {
                        stop = self.bool_arg("true or false")?;
                    } else {
                        return Err(
                            self.unexpected("'weights=', 'seed=' or 'stop_on_empty_dataset='")
                        );
                    }
                }
                Ok(Dataset::sample_from_datasets(inputs, weights, seed, stop))
            }
            "choose_from_datasets" => {
                self.expect_punct('(', "'('")?;
                let inputs = self.dataset_list()?;
                self.expect_punct(',', "',' and the choice dataset")?;
                self.keyword("choice_dataset");
                let choice = self.nested_dataset()?;
                let mut stop = true;
                if self.comma_or_close()? {
                    if !self.keyword("stop_on_empty_dataset") {
                        return Err(self.unexpected("'stop_on_empty_dataset='"));
                    }
                    stop = self.bool_arg("true or false")?;
                    self.close()?;
                }
                Ok(Dataset::choose_from_datasets(inputs, choice, stop))
            }
            "files" => {
                self.expect_punct('(', "'('")?;
                let t = self.peek().clone();
                let Tok::Str(_) = t.tok else {
                    return Err(self.unexpected("a quoted file pattern"));
                };
                let pattern = self.string_arg("a quoted file pattern")?;
                self.close()?;
                self.expect_punct('.', "'.lines()', '.tfrecord()' or '.names()'")?;
                let builder = Dataset::files(&pattern);
                let format = match &self.peek().tok {
                    Tok::Ident(f) if f == "lines" => pb::FileFormat::Lines,
                    Tok::Ident(f) if f == "tfrecord" => pb::FileFormat::Tfrecord,
                    Tok::Ident(f) if f == "names" => pb::FileFormat::Names,
                    _ => return Err(self.unexpected("'lines', 'tfrecord' or 'names'")),
                };
                self.next();
                self.expect_punct('(', "'('")?;
                match format {
                    pb::FileFormat::Lines | pb::FileFormat::Unspecified => {
                        self.close()?;
                        return Ok(builder.lines());
                    }
                    pb::FileFormat::Names => {
                        self.close()?;
                        return Ok(builder.names());
                    }
                    pb::FileFormat::Tfrecord => {}
                }
                let compression = if self.is_punct(')') {
                    pb::RecordCompression::None
                } else {
                    self.compression_arg()?
                };
                self.close()?;
                Ok(builder.tfrecord_compressed(compression))
            }
            "random" => {
                self.expect_punct('(', "'('")?;
                let mut seed = None;
                if !self.is_punct(')') {
                    self.keyword("seed");
                    seed = Some(self.u64_arg("seed")?);
                }
                self.close()?;
                Ok(Dataset::random(seed))
            }
            "element_lines" | "element_tfrecord" | "element_slices" | "element_window"
                if self.templates > 0 =>
            {
                self.expect_punct('(', "'('")?;
                let ds = match name.as_str() {
                    "element_lines" => Dataset::element_lines(),
                    "element_slices" => Dataset::element_slices(),
                    "element_window" => Dataset::element_window(),
                    _ if self.is_punct(')') => {
                        Dataset::element_tfrecord(pb::RecordCompression::None)
                    }
                    _ => Dataset::element_tfrecord(self.compression_arg()?),
                };
                self.close()?;
                Ok(ds)
            }
            "element_lines" | "element_tfrecord" | "element_slices" | "element_window" => {
                Err(parse_error(
                    t.col,
                    format!("{name}() is only valid as the source of a template"),
                ))
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

    /// An interleave's template: a source and its ops, up to the `,` or `)` that ends it.
    pub(super) fn template(&mut self) -> Result<Dataset, DatasetError> {
        if self.templates >= MAX_TEMPLATE_NESTING {
            return Err(parse_error(
                self.peek().col,
                format!("interleave templates nest more than {MAX_TEMPLATE_NESTING} deep"),
            ));
        }
        self.templates += 1;
        let result = (|| {
            let mut ds = self.source()?;
            while self.is_punct('.') {
                self.next();
                ds = ds.push_op(self.op()?);
            }
            Ok(ds)
        })();
        self.templates -= 1;
        result
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
}

#[path = "parser_features.rs"]
mod features;
#[path = "parser_literals.rs"]
mod literals;
#[path = "parser_ops.rs"]
mod ops;

fn dtype_names() -> String {
    DType::ALL
        .iter()
        .map(|d| d.name())
        .collect::<Vec<_>>()
        .join(", ")
}

#[path = "parser_image.rs"]
mod image;

#[cfg(test)]
#[path = "parser_tests.rs"]
mod tests;

//! The transformations of the expression syntax (`.map(f)`, `.batch(4, drop_remainder=true)`,
//! ...), kept beside the parser (a child module, so it shares the parser's token cursor): each
//! op's name and arguments, built through `Transform` exactly as the builder builds them.

use sluice_element::{pb, DType, DatasetError, Tensor};

use super::{parse_error, Parser, Tok, SHARD_HINT, TRANSFORMATIONS};
use crate::dataset::Transform;

impl Parser {
    /// One transformation: its name and arguments, built as the builder builds it.
    pub(super) fn op(&mut self) -> Result<pb::Op, DatasetError> {
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
                | "padded_batch"
                | "unbatch"
                | "ignore_errors"
                | "cache"
                | "snapshot"
                | "concatenate"
                | "interleave"
                | "take_while"
                | "group_by_window"
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
            "take_while" => builder.take_while(&self.string_arg("a predicate name")?),
            "group_by_window" => {
                let key = self.string_arg("a key function name")?;
                self.expect_punct(',', "','")?;
                if !self.keyword("window_size") {
                    return Err(self.unexpected("'window_size='"));
                }
                let window_size = self.positive_arg("window_size")?;
                self.expect_punct(',', "','")?;
                if !self.keyword("reduce") {
                    return Err(self.unexpected("'reduce='"));
                }
                let reduce = self.template()?;
                builder.group_by_window(&key, window_size, reduce)
            }
            "interleave" => {
                let template = self.template()?;
                let (mut cycle, mut block, mut parallel) = (0, 1, None);
                while self.more_args()? {
                    let col = self.peek().col;
                    if self.keyword("cycle_length") {
                        cycle = self.u64_arg("cycle_length")?;
                    } else if self.keyword("block_length") {
                        block = self.positive_arg("block_length")?;
                    } else if self.keyword("num_parallel_calls") {
                        parallel = Some(self.u64_arg("num_parallel_calls")?);
                    } else {
                        return Err(parse_error(
                            col,
                            "expected 'cycle_length=', 'block_length=' or 'num_parallel_calls='",
                        ));
                    }
                }
                match parallel {
                    Some(n) => builder.parallel_interleave(template, cycle, block, n),
                    None => builder.interleave(template, cycle, block),
                }
            }
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
            "concatenate" => builder.concatenate(self.nested_dataset()?.into_def()),
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
            "padded_batch" => {
                let n = self.positive_arg("batch size")?;
                let (mut drop, mut shapes, mut values) = (false, Vec::new(), Vec::new());
                while self.more_args()? {
                    if self.keyword("drop_remainder") {
                        drop = self.bool_arg("'drop_remainder=true' or 'drop_remainder=false'")?;
                    } else if self.keyword("padded_shapes") {
                        shapes = self.padded_shapes_arg()?;
                    } else if self.keyword("padding_values") {
                        values = self.padding_values_arg()?;
                    } else {
                        return Err(self.unexpected(
                            "'padded_shapes=', 'padding_values=' or 'drop_remainder='",
                        ));
                    }
                }
                builder.padded_batch(n, drop, shapes, values)
            }
            "unbatch" => builder.unbatch(),
            "ignore_errors" => {
                let mut log = false;
                if !self.is_punct(')') {
                    self.keyword("log_warning");
                    log = self.bool_arg("'log_warning=true' or 'log_warning=false'")?;
                }
                builder.ignore_errors(log)
            }
            "cache" => {
                if self.is_punct(')') {
                    builder.cache("")
                } else {
                    self.keyword("filename");
                    if !matches!(self.peek().tok, Tok::Str(_)) {
                        return Err(self.unexpected("a quoted cache file name"));
                    }
                    builder.cache(&self.string_arg("a quoted cache file name")?)
                }
            }
            "snapshot" => {
                if !matches!(self.peek().tok, Tok::Str(_)) {
                    return Err(self.unexpected("a quoted snapshot directory"));
                }
                builder.snapshot(&self.string_arg("a quoted snapshot directory")?)
            }
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
}

impl Parser {
    /// `[[-1, 5], []]`: one list of dimensions (a size or -1) per component.
    fn padded_shapes_arg(&mut self) -> Result<Vec<Vec<i64>>, DatasetError> {
        self.expect_punct('[', "'[' (a list of padded shapes)")?;
        let mut shapes = Vec::new();
        while !self.is_punct(']') {
            if shapes.len() >= crate::limits::DEFAULT_MAX_PIPELINE_OPS {
                return Err(self.unexpected("fewer padded shapes"));
            }
            self.expect_punct('[', "'[' (a padded shape)")?;
            let mut dims = Vec::new();
            while !self.is_punct(']') {
                if dims.len() >= crate::batching::MAX_PADDED_RANK {
                    return Err(parse_error(
                        self.peek().col,
                        format!(
                            "a padded shape has at most {} dimensions",
                            crate::batching::MAX_PADDED_RANK
                        ),
                    ));
                }
                let (d, col) = self.i64_arg("padded dimension")?;
                if d < -1 {
                    return Err(parse_error(
                        col,
                        format!("padded dimension must be -1 or a size, found {d}"),
                    ));
                }
                dims.push(d);
                if !self.is_punct(']') {
                    self.expect_punct(',', "',' or ']'")?;
                }
            }
            self.next();
            shapes.push(dims);
            if !self.is_punct(']') {
                self.expect_punct(',', "',' or ']'")?;
            }
        }
        self.next();
        Ok(shapes)
    }

    /// `[0, float32(0.5), "pad"]`: one scalar per component, its dtype implied by the literal
    /// or named around it.
    fn padding_values_arg(&mut self) -> Result<Vec<Tensor>, DatasetError> {
        self.expect_punct('[', "'[' (a list of padding values)")?;
        let mut values = Vec::new();
        while !self.is_punct(']') {
            if values.len() >= crate::limits::DEFAULT_MAX_PIPELINE_OPS {
                return Err(self.unexpected("fewer padding values"));
            }
            let t = self.peek().clone();
            let dtype = match &t.tok {
                Tok::Ident(name)
                    if self
                        .tokens
                        .get(self.pos + 1)
                        .is_some_and(|n| n.tok == Tok::Punct('(')) =>
                {
                    let dtype = name.parse::<DType>().map_err(|_| {
                        parse_error(t.col, format!("unknown dtype '{name}' for a padding value"))
                    })?;
                    self.next();
                    self.next();
                    Some(dtype)
                }
                _ => None,
            };
            if self.is_punct('[') {
                return Err(self.unexpected("a scalar padding value"));
            }
            let lit = self.literal()?;
            if dtype.is_some() {
                self.close()?;
            }
            values.push(super::literals::tensor_from_literal(&lit, dtype)?);
            if !self.is_punct(']') {
                self.expect_punct(',', "',' or ']'")?;
            }
        }
        self.next();
        Ok(values)
    }
}

/// Collects ops pushed through `Transform`, so the parser builds ops exactly as the builder does.
#[derive(Default)]
struct OpCollector(Vec<pb::Op>);

impl Transform for OpCollector {
    fn push_op(mut self, op: pb::Op) -> Self {
        self.0.push(op);
        self
    }
}

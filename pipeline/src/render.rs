//! Rendering definitions to the text syntax: `render_def`, `render_ops`, and `Display` for
//! `Dataset`.
//!
//! Invariant: `parse(&d.to_string()) == Ok(d)` for every definition the builder or the parser can
//! produce (a `files` source renders its pattern only: the expanded list is registration state),
//! except slices (and `from_tensors`) of a tuple or dict, which render as `from_slices(([1, 2], [3, 4]))` or
//! `from_slices({"a": [1, 2]})` for reading but which the text syntax does not parse.

use std::fmt::{self, Write as _};

use sluice_element::pb::op::Kind as OpKind;
use sluice_element::pb::source::Kind as SourceKind;
use sluice_element::{pb, DType, Element, Tensor};

use crate::dataset::Dataset;
use crate::python_op::syntax_name;
use crate::slices::Slices;

impl fmt::Display for Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&render_def(self.def()))
    }
}

/// The text syntax of a whole definition, e.g. `range(10).map(square)`.
pub fn render_def(def: &pb::DatasetDef) -> String {
    let mut out = String::new();
    match def.source.as_ref().and_then(|s| s.kind.as_ref()) {
        None => out.push_str("<no source>"),
        Some(SourceKind::Range(r)) => {
            if r.step != 1 {
                let _ = write!(out, "range({}, {}, {})", r.start, r.stop, r.step);
            } else if r.start != 0 {
                let _ = write!(out, "range({}, {})", r.start, r.stop);
            } else {
                let _ = write!(out, "range({})", r.stop);
            }
        }
        Some(SourceKind::Slices(s)) => {
            out.push_str("from_slices(");
            match Slices::from_proto(s) {
                Ok(slices) => render_columns(&mut out, slices.columns()),
                // Data kept apart from the definition (see `sluice_element::blob_tensors`).
                Err(_) if crate::slices::source_names_blobs(s) => {
                    out.push_str("<tensors kept as blobs>")
                }
                Err(_) => out.push_str("<invalid tensor>"),
            }
            out.push(')');
        }
        Some(SourceKind::Files(fs)) => {
            out.push_str("files(");
            quote(&mut out, fs.pattern.as_bytes());
            out.push_str(match (fs.format(), fs.compression()) {
                (pb::FileFormat::Tfrecord, pb::RecordCompression::None) => ").tfrecord()",
                (pb::FileFormat::Tfrecord, pb::RecordCompression::Gzip) => {
                    ").tfrecord(compression=\"GZIP\")"
                }
                (pb::FileFormat::Tfrecord, pb::RecordCompression::Zlib) => {
                    ").tfrecord(compression=\"ZLIB\")"
                }
                (pb::FileFormat::Lines | pb::FileFormat::Unspecified, _) => ").lines()",
                (pb::FileFormat::Names, _) => ").names()",
            });
        }
        Some(SourceKind::Random(r)) => match r.seed {
            Some(seed) => {
                let _ = write!(out, "random(seed={seed})");
            }
            None => out.push_str("random()"),
        },
        Some(SourceKind::Tensors(t)) => {
            out.push_str("from_tensors(");
            match crate::analysis::tensors_value(t) {
                Ok(value) => render_columns(&mut out, &value),
                Err(_) if t.value.as_ref().is_some_and(crate::slices::names_blobs) => {
                    out.push_str("<tensors kept as blobs>")
                }
                Err(_) => out.push_str("<invalid tensor>"),
            }
            out.push(')');
        }
        Some(SourceKind::Zip(z)) => {
            out.push_str("zip(");
            for (i, input) in z.inputs.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                if let Some(key) = z.keys.get(i) {
                    function_name(&mut out, key);
                    out.push('=');
                }
                out.push_str(&render_def(input));
            }
            out.push(')');
        }
        Some(SourceKind::Sample(s)) => {
            out.push_str("sample_from_datasets(");
            render_list(&mut out, &s.inputs);
            if !s.weights.is_empty() {
                let weights: Vec<String> = s.weights.iter().map(|w| format!("{w:?}")).collect();
                let _ = write!(out, ", weights=[{}]", weights.join(", "));
            }
            if let Some(seed) = s.seed {
                let _ = write!(out, ", seed={seed}");
            }
            if s.stop_on_empty_dataset {
                out.push_str(", stop_on_empty_dataset=true");
            }
            out.push(')');
        }
        Some(SourceKind::Choose(c)) => {
            out.push_str("choose_from_datasets(");
            render_list(&mut out, &c.inputs);
            out.push_str(", ");
            match crate::analysis::choice_of(c) {
                Ok(choice) => out.push_str(&render_def(choice)),
                Err(_) => out.push_str("<no choice dataset>"),
            }
            if !c.stop_on_empty_dataset {
                out.push_str(", stop_on_empty_dataset=false");
            }
            out.push(')');
        }
        Some(SourceKind::Element(e)) => out.push_str(match &e.kind {
            Some(pb::element_source::Kind::Files(f)) => match (f.format(), f.compression()) {
                (pb::FileFormat::Tfrecord, pb::RecordCompression::None) => "element_tfrecord()",
                (pb::FileFormat::Tfrecord, pb::RecordCompression::Gzip) => {
                    "element_tfrecord(compression=\"GZIP\")"
                }
                (pb::FileFormat::Tfrecord, pb::RecordCompression::Zlib) => {
                    "element_tfrecord(compression=\"ZLIB\")"
                }
                (pb::FileFormat::Lines | pb::FileFormat::Unspecified, _) => "element_lines()",
                (pb::FileFormat::Names, _) => "<element names>",
            },
            Some(pb::element_source::Kind::Slices(_)) => "element_slices()",
            Some(pb::element_source::Kind::Window(_)) => "element_window()",
            None => "<no element source>",
        }),
    }
    out.push_str(&render_ops(&def.ops));
    out
}

/// The text syntax of an op chain, each op with its leading `.`, e.g. `.map(square).batch(2)`.
pub fn render_ops(ops: &[pb::Op]) -> String {
    let mut out = String::new();
    for o in ops {
        let _ = match &o.kind {
            None => write!(out, ".<empty op>()"),
            Some(OpKind::Map(m)) => {
                out.push_str(".map(");
                function_name(&mut out, &m.function);
                write!(out, ")")
            }
            Some(OpKind::Filter(m)) => {
                out.push_str(".filter(");
                function_name(&mut out, &m.predicate);
                write!(out, ")")
            }
            Some(OpKind::Batch(b)) if b.drop_remainder => {
                write!(out, ".batch({}, drop_remainder=true)", b.batch_size)
            }
            Some(OpKind::Batch(b)) => write!(out, ".batch({})", b.batch_size),
            Some(OpKind::Shuffle(s)) => match s.seed {
                Some(seed) => write!(out, ".shuffle({}, seed={seed})", s.buffer_size),
                None => write!(out, ".shuffle({})", s.buffer_size),
            },
            Some(OpKind::Repeat(r)) => match r.count {
                Some(c) => write!(out, ".repeat({c})"),
                None => write!(out, ".repeat()"),
            },
            Some(OpKind::Take(t)) => write!(out, ".take({})", t.count),
            Some(OpKind::Skip(t)) => write!(out, ".skip({})", t.count),
            Some(OpKind::Shard(s)) if s.hint => write!(out, ".shard(SHARD_HINT, SHARD_HINT)"),
            Some(OpKind::Shard(s)) => write!(out, ".shard({}, {})", s.num_shards, s.index),
            Some(OpKind::Prefetch(p)) => write!(out, ".prefetch({})", p.buffer_size),
            Some(OpKind::Enumerate(e)) if e.start == 0 => write!(out, ".enumerate()"),
            Some(OpKind::Enumerate(e)) => write!(out, ".enumerate({})", e.start),
            Some(OpKind::DecodeImage(d)) => {
                out.push_str(".decode_image(");
                if let Some(key) = &d.key {
                    out.push_str("key=");
                    quote(&mut out, key.as_bytes());
                    out.push_str(", ");
                }
                write!(out, "channels={})", d.channels)
            }
            Some(OpKind::Resize(r)) => {
                let _ = write!(out, ".resize({}, {}", r.height, r.width);
                if let Some(key) = &r.key {
                    out.push_str(", key=");
                    quote(&mut out, key.as_bytes());
                }
                write!(out, ")")
            }
            Some(OpKind::ParseExample(p)) => {
                render_parse_example(&mut out, p);
                Ok(())
            }
            Some(OpKind::PaddedBatch(p)) => {
                render_padded_batch(&mut out, p);
                Ok(())
            }
            Some(OpKind::Unbatch(_)) => write!(out, ".unbatch()"),
            Some(OpKind::IgnoreErrors(i)) if i.log_warning => {
                write!(out, ".ignore_errors(log_warning=true)")
            }
            Some(OpKind::IgnoreErrors(_)) => write!(out, ".ignore_errors()"),
            Some(OpKind::Cache(c)) if c.snapshot => {
                out.push_str(".snapshot(");
                quote(&mut out, c.filename.as_bytes());
                write!(out, ")")
            }
            Some(OpKind::Cache(c)) if c.filename.is_empty() => write!(out, ".cache()"),
            Some(OpKind::Cache(c)) => {
                out.push_str(".cache(");
                quote(&mut out, c.filename.as_bytes());
                write!(out, ")")
            }
            Some(OpKind::Concatenate(c)) => match &c.other {
                Some(other) => write!(out, ".concatenate({})", render_def(other)),
                None => write!(out, ".concatenate(<no dataset>)"),
            },
            Some(OpKind::Interleave(i)) => {
                out.push_str(".interleave(");
                match (&i.template, &i.function) {
                    (Some(t), _) => out.push_str(&render_def(t)),
                    // Shown for reading only, as a Python op.
                    (None, Some(f)) => quote(&mut out, f.name.as_bytes()),
                    (None, None) => out.push_str("<no template>"),
                }
                let _ = write!(
                    out,
                    ", cycle_length={}, block_length={}",
                    i.cycle_length, i.block_length
                );
                if let Some(n) = i.num_parallel_calls {
                    let _ = write!(out, ", num_parallel_calls={n}");
                }
                write!(out, ")")
            }
            Some(OpKind::GroupByWindow(g)) => {
                out.push_str(".group_by_window(");
                match &g.key_function {
                    // Python functions are shown for reading only.
                    Some(f) => quote(&mut out, f.name.as_bytes()),
                    None => function_name(&mut out, &g.key),
                }
                match &g.window_size_function {
                    Some(f) => {
                        out.push_str(", window_size_func=");
                        quote(&mut out, f.name.as_bytes());
                    }
                    None => {
                        let _ = write!(out, ", window_size={}", g.window_size);
                    }
                }
                out.push_str(", reduce=");
                match (&g.reduce, &g.reduce_function) {
                    (Some(t), _) => out.push_str(&render_def(t)),
                    (None, Some(f)) => quote(&mut out, f.name.as_bytes()),
                    (None, None) => out.push_str("<no reduce>"),
                }
                write!(out, ")")
            }
            Some(OpKind::TakeWhile(t)) => {
                out.push_str(".take_while(");
                function_name(&mut out, &t.predicate);
                write!(out, ")")
            }
            // Shown for reading only: a Python function has no text form to parse back.
            Some(OpKind::PyFunction(f)) => {
                let _ = write!(out, ".{}(", syntax_name(f));
                quote(&mut out, f.name.as_bytes());
                write!(out, ")")
            }
        };
    }
    out
}

/// `.padded_batch(4, padded_shapes=[[-1, 5]], padding_values=[float32(0.5)],
/// drop_remainder=true)`, the defaults left out.
fn render_padded_batch(out: &mut String, p: &pb::PaddedBatchOp) {
    let _ = write!(out, ".padded_batch({}", p.batch_size);
    if !p.padded_shapes.is_empty() {
        out.push_str(", padded_shapes=[");
        for (i, s) in p.padded_shapes.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            let dims: Vec<String> = s.dims.iter().map(i64::to_string).collect();
            let _ = write!(out, "[{}]", dims.join(", "));
        }
        out.push(']');
    }
    if !p.padding_values.is_empty() {
        out.push_str(", padding_values=[");
        for (i, v) in p.padding_values.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            match Tensor::from_proto(v) {
                Ok(t) => {
                    let d = t.dtype();
                    let implied = implied_dtype(d == DType::String, d.is_float(), d == DType::Bool);
                    if implied == d {
                        render_values(out, &t);
                    } else {
                        let _ = write!(out, "{d}(");
                        render_values(out, &t);
                        out.push(')');
                    }
                }
                Err(_) => out.push_str("<invalid tensor>"),
            }
        }
        out.push(']');
    }
    if p.drop_remainder {
        out.push_str(", drop_remainder=true");
    }
    out.push(')');
}

/// `.parse_example(label=fixed(int64), v=fixed(float32, shape=[2], default=[0.0, 1.0]),
/// tags=var(bytes))`; a name that is not an identifier is quoted.
fn render_parse_example(out: &mut String, p: &pb::ParseExampleOp) {
    out.push_str(".parse_example(");
    for (i, f) in p.features.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        function_name(out, &f.name);
        let dtype = match DType::try_from(f.dtype()) {
            Ok(DType::String) => "bytes",
            Ok(d) => d.name(),
            Err(_) => "<invalid dtype>",
        };
        if f.var_len {
            let _ = write!(out, "=var({dtype})");
            continue;
        }
        let _ = write!(out, "=fixed({dtype}");
        if !f.shape.is_empty() {
            let dims: Vec<String> = f.shape.iter().map(u64::to_string).collect();
            let _ = write!(out, ", shape=[{}]", dims.join(", "));
        }
        if let Some(d) = &f.default_value {
            out.push_str(", default=");
            match Tensor::from_proto(d) {
                Ok(t) => render_values(out, &t),
                Err(_) => out.push_str("<invalid tensor>"),
            }
        }
        out.push(')');
    }
    out.push(')');
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn function_name(out: &mut String, name: &str) {
    if is_identifier(name) {
        out.push_str(name);
    } else {
        quote(out, name.as_bytes());
    }
}

/// A double-quoted literal; bytes outside printable ASCII become `\xNN` escapes.
pub(crate) fn quote(out: &mut String, s: &[u8]) {
    out.push('"');
    for &b in s {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\t' => out.push_str("\\t"),
            b'\r' => out.push_str("\\r"),
            0x20..=0x7e => out.push(b as char),
            _ => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    out.push('"');
}

/// The dtype a literal's values imply without a `dtype=` argument.
pub(crate) fn implied_dtype(has_string: bool, has_float: bool, has_bool: bool) -> DType {
    if has_string {
        DType::String
    } else if has_float {
        DType::Float64
    } else if has_bool {
        DType::Bool
    } else {
        DType::Int64
    }
}

/// `[a, b]`: a list of datasets.
fn render_list(out: &mut String, defs: &[pb::DatasetDef]) {
    out.push('[');
    for (i, d) in defs.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&render_def(d));
    }
    out.push(']');
}

/// A tensor as `render_tensor`; a tuple as `(a, b)` (`(a,)` for one item), a dict as
/// `{"k": v}` in key order.
fn render_columns(out: &mut String, e: &Element) {
    match e {
        Element::Tensor(t) => render_tensor(out, t),
        Element::Tuple(items) => {
            out.push('(');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                render_columns(out, item);
            }
            if items.len() == 1 {
                out.push(',');
            }
            out.push(')');
        }
        Element::Dict(fields) => {
            out.push('{');
            for (i, (k, v)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                quote(out, k.as_bytes());
                out.push_str(": ");
                render_columns(out, v);
            }
            out.push('}');
        }
    }
}

fn render_tensor(out: &mut String, t: &Tensor) {
    render_values(out, t);
    let d = t.dtype();
    let n = t.num_elements();
    if implied_dtype(
        d == DType::String && n > 0,
        d.is_float() && n > 0,
        d == DType::Bool && n > 0,
    ) != d
    {
        let _ = write!(out, ", dtype={}", t.dtype());
    }
}

/// The values nested as the shape is, without the dtype (where the context gives it).
fn render_values(out: &mut String, t: &Tensor) {
    let values: Vec<String> = match t.dtype() {
        DType::String => t
            .strings()
            .unwrap_or(&[])
            .iter()
            .map(|s| {
                let mut q = String::new();
                quote(&mut q, s);
                q
            })
            .collect(),
        DType::Bool => t
            .to_values::<bool>()
            .unwrap_or_default()
            .iter()
            .map(bool::to_string)
            .collect(),
        DType::Float32 => t
            .to_values::<f32>()
            .unwrap_or_default()
            .iter()
            .map(|v| float(*v as f64, format!("{v:?}")))
            .collect(),
        DType::Float64 => t
            .to_values::<f64>()
            .unwrap_or_default()
            .iter()
            .map(|v| float(*v, format!("{v:?}")))
            .collect(),
        DType::UInt64 => t
            .to_values::<u64>()
            .unwrap_or_default()
            .iter()
            .map(u64::to_string)
            .collect(),
        _ => t
            .to_i64s()
            .unwrap_or_default()
            .iter()
            .map(i64::to_string)
            .collect(),
    };
    let mut values = values.into_iter();
    nested(out, &mut values, t.shape());
}

fn float(v: f64, debug: String) -> String {
    if v.is_nan() {
        "nan".to_string()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        debug
    }
}

fn nested(out: &mut String, values: &mut impl Iterator<Item = String>, shape: &[usize]) {
    match shape.split_first() {
        None => out.push_str(&values.next().unwrap_or_default()),
        Some((&d, rest)) => {
            out.push('[');
            for i in 0..d {
                if i > 0 {
                    out.push_str(", ");
                }
                nested(out, values, rest);
            }
            out.push(']');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Transform;

    #[test]
    fn builder_renders_the_text_syntax() {
        let d = Dataset::range(10).map("square").batch_with(4, true);
        assert_eq!(
            d.to_string(),
            "range(10).map(square).batch(4, drop_remainder=true)"
        );
        let d = Dataset::range_with(0, 100, 3)
            .shuffle(10, Some(1))
            .repeat_forever()
            .take(5);
        assert_eq!(
            d.to_string(),
            "range(0, 100, 3).shuffle(10, seed=1).repeat().take(5)"
        );
        let d = Dataset::files("data/*.txt")
            .lines()
            .filter("my fn")
            .shard(3, 1)
            .prefetch(2)
            .enumerate();
        assert_eq!(
            d.to_string(),
            "files(\"data/*.txt\").lines().filter(\"my fn\").shard(3, 1).prefetch(2).enumerate()"
        );
        assert_eq!(
            Dataset::range(3).enumerate_from(-5).to_string(),
            "range(3).enumerate(-5)"
        );
        assert_eq!(
            Dataset::range(20).shard_hint().batch(2).to_string(),
            "range(20).shard(SHARD_HINT, SHARD_HINT).batch(2)"
        );
        let t = Tensor::from_i64s(vec![2, 2], &[1, 2, 3, 4]).unwrap();
        assert_eq!(
            Dataset::from_slices(t).to_string(),
            "from_slices([[1, 2], [3, 4]])"
        );
        let t = Tensor::from_values::<i32>(vec![2], &[1, 2]).unwrap();
        assert_eq!(
            Dataset::from_slices(t).to_string(),
            "from_slices([1, 2], dtype=int32)"
        );
        let t = Tensor::from_f64s(vec![3], &[1.0, f64::NAN, f64::NEG_INFINITY]).unwrap();
        assert_eq!(
            Dataset::from_slices(t).to_string(),
            "from_slices([1.0, nan, -inf])"
        );
    }
}

//! The fuzz target of this crate's decoder of outside input (see `sluice-fuzz`): the expression
//! parser. It checks that the parser returns a definition or a clean error, never panics, and
//! holds at most a bounded multiple of its input in memory at once; and that what parses renders
//! to text that parses to the same definition.
//!
//! A long session: `SLUICE_FUZZ_CASES=100000 cargo nextest run -p sluice-pipeline --profile fuzz
//! -E 'test(fuzz_)'`.

use prost::Message;
use sluice_fuzz::{within, AllocMeter, FuzzTarget};

use crate::render::{render_def, render_ops};
use crate::{parse, parse_ops};

#[global_allocator]
static METER: AllocMeter = AllocMeter;

/// Memory a decoder may hold per byte of its input, and regardless of it: an element tree takes
/// a few machine words per node, and every node takes at least two bytes of input.
const PER_BYTE: usize = 256;
const SLACK: usize = 256 << 10;

// ---------------------------------------------------------------- expression parser

const EXPRESSIONS: &[&str] = &[
    "range(10)",
    "range(0, 100, 3)",
    "range(-5, 5, -1).take(3)",
    "range(10).map(square)",
    "range(20).batch(4, drop_remainder=true)",
    "range(5).repeat(2).repeat()",
    "range(100).shuffle(10, seed=1).prefetch(2)",
    "range(10).filter(is_even).skip(3).shard(3, 1)",
    "range(20).shard(SHARD_HINT, SHARD_HINT).enumerate(-5)",
    "from_slices([1, 2, 3])",
    "from_slices([[1.5, -2e3], [nan, -inf]], dtype=float32)",
    "from_slices([\"a\\x00\", 'b\\n', \"\"])",
    "from_slices([true, False], dtype=bool)",
    "from_slices([[], []], dtype=uint16)",
    "files(\"data/*.txt\").lines().map(\"my fn\")",
    "files(\"d/*.tfrecord\").tfrecord(compression=\"GZIP\").parse_example(label=fixed(int64), \
     xy=fixed(float32, shape=[2], default=[0.0, 1.0]), tags=var(bytes), \"odd name\"=var(int64))",
    "files(\"d/*.tfrecord\").tfrecord(\"ZLIB\").decode_image(key=\"img\", channels=1)\
     .resize(32, 48, key=\"img\")",
    "random(seed=3).padded_batch(4, padded_shapes=[[-1, 2]], padding_values=[int8(-1)], \
     drop_remainder=true).unbatch()",
    "random().ignore_errors(log_warning=true).cache(\"c\").padded_batch(2, \
     padding_values=[\"p\", float32(nan), true])",
    "from_slices([\"a\", \"b\"]).interleave(element_lines().take_while(is_even), cycle_length=2, \
     block_length=3, num_parallel_calls=0)",
    "range(3).interleave(range(1).interleave(element_tfrecord(compression=\"GZIP\"), \
     cycle_length=1), block_length=2)",
    "from_slices([1, 2]).group_by_window(identity, window_size=2, \
     reduce=element_window().interleave(element_slices(), cycle_length=1).batch(2))",
];

const EXPRESSION_TOKENS: &[&str] = &[
    "random(",
    ".padded_batch(",
    "padded_shapes=",
    "padding_values=",
    ".unbatch()",
    ".ignore_errors(",
    ".cache(",
    "int32(",
    "range(",
    "from_slices(",
    "files(",
    ".lines()",
    ".tfrecord(",
    ".map(",
    ".filter(",
    ".batch(",
    ".shuffle(",
    ".repeat(",
    ".take(",
    ".skip(",
    ".shard(",
    ".prefetch(",
    ".enumerate(",
    ".decode_image(",
    ".resize(",
    ".parse_example(",
    ".interleave(",
    ".take_while(",
    ".group_by_window(",
    "element_lines()",
    "element_tfrecord(",
    "element_slices()",
    "element_window()",
    "cycle_length=",
    "block_length=",
    "num_parallel_calls=",
    "window_size=",
    "reduce=",
    "fixed(",
    "var(",
    "[",
    "]",
    "(",
    ")",
    ",",
    ".",
    "=",
    "\"",
    "'",
    "\\x",
    "\\",
    "-",
    "0",
    "1e308",
    "1e-400",
    "2.5",
    "nan",
    "inf",
    "SHARD_HINT",
    "dtype=",
    "seed=",
    "shape=",
    "default=",
    "key=",
    "channels=",
    "compression=",
    "drop_remainder=",
    "true",
    "int8",
    "uint64",
    "string",
    "float32",
    "99999999999999999999999999999999999999999",
    "-9223372036854775808",
    "é",
    "\u{feff}",
];

/// Parses `text` as an expression and as an op chain; what parses must render to text that
/// parses to the same definition.
fn check_expression(input: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(input);
    let (parsed, peak) = AllocMeter::peak_during(|| parse(&text));
    within("parse", peak, input.len(), PER_BYTE * 4, SLACK)?;
    if let Ok(ds) = parsed {
        let rendered = ds.to_string();
        let again = parse(&rendered)
            .map_err(|e| format!("{text:?} rendered as {rendered:?}, which does not parse: {e}"))?;
        if again.def().encode_to_vec() != ds.def().encode_to_vec() {
            return Err(format!(
                "{text:?} rendered as {rendered:?}, which parses to {}",
                render_def(again.def())
            ));
        }
    }
    if let Ok(ops) = parse_ops(&text) {
        let rendered = render_ops(&ops);
        let again = parse_ops(&rendered)
            .map_err(|e| format!("ops {text:?} rendered as {rendered:?}: {e}"))?;
        if again != ops {
            return Err(format!(
                "ops {text:?} rendered as {rendered:?} parse differently"
            ));
        }
    }
    Ok(())
}

#[test]
fn fuzz_expression_parser() {
    FuzzTarget::new("expression")
        .seeds(EXPRESSIONS.iter().map(|e| e.as_bytes().to_vec()).collect())
        .dictionary(EXPRESSION_TOKENS)
        .run(check_expression);
}

//! `Mutation`: one structured edit of an input, the kind that finds decoder bugs: flipped bits,
//! truncations, cut and repeated ranges, bytes of another corpus entry spliced in, the target's
//! own tokens inserted, and length fields overwritten or inserted with extreme values. Inputs
//! are corpus entries with a few mutations applied, or arbitrary bytes, or runs of tokens, as a
//! proptest strategy, so a failing input shrinks to few, small edits.
//!
//! Positions are drawn as any `usize` and taken modulo the input's length at the time the edit
//! applies, so every mutation applies to every input.

use std::sync::Arc;

use proptest::collection::vec;
use proptest::prelude::*;

/// How a length field is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LengthForm {
    U32Le,
    U64Le,
    /// LEB128, as protobuf, bincode and the element codec write lengths.
    Varint,
}

/// One edit of an input (see the module docs).
#[derive(Debug, Clone)]
pub enum Mutation {
    FlipBit {
        at: usize,
        bit: u8,
    },
    SetByte {
        at: usize,
        value: u8,
    },
    Truncate {
        at: usize,
    },
    Remove {
        at: usize,
        len: usize,
    },
    InsertBytes {
        at: usize,
        bytes: Vec<u8>,
    },
    /// One of the target's dictionary tokens (its magic, tags, keywords).
    InsertToken {
        at: usize,
        token: usize,
    },
    /// A range repeated: nesting, repeated sections.
    Repeat {
        at: usize,
        len: usize,
        times: u8,
    },
    /// A range of another corpus entry.
    Splice {
        at: usize,
        donor: usize,
        from: usize,
        len: usize,
    },
    /// An extreme length, written over the bytes at `at` or inserted there.
    Length {
        at: usize,
        value: u64,
        form: LengthForm,
        overwrite: bool,
    },
}

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}

impl Mutation {
    /// Applies the edit to `data`; `corpus` gives splices their donors, `dictionary` the tokens.
    pub fn apply(&self, data: &mut Vec<u8>, corpus: &[Vec<u8>], dictionary: &[Vec<u8>]) {
        let pos = |at: usize, data: &Vec<u8>| at % (data.len() + 1);
        match *self {
            Mutation::FlipBit { at, bit } => {
                if !data.is_empty() {
                    let i = at % data.len();
                    data[i] ^= 1 << (bit % 8);
                }
            }
            Mutation::SetByte { at, value } => {
                if !data.is_empty() {
                    let i = at % data.len();
                    data[i] = value;
                }
            }
            Mutation::Truncate { at } => {
                let i = pos(at, data);
                data.truncate(i);
            }
            Mutation::Remove { at, len } => {
                let i = pos(at, data);
                let end = i.saturating_add(len).min(data.len());
                data.drain(i..end);
            }
            Mutation::InsertBytes { at, ref bytes } => {
                let i = pos(at, data);
                data.splice(i..i, bytes.iter().copied());
            }
            Mutation::InsertToken { at, token } => {
                if let Some(token) =
                    (!dictionary.is_empty()).then(|| &dictionary[token % dictionary.len()])
                {
                    let i = pos(at, data);
                    data.splice(i..i, token.iter().copied());
                }
            }
            Mutation::Repeat { at, len, times } => {
                let i = pos(at, data);
                let end = i.saturating_add(len).min(data.len());
                let chunk = data[i..end].to_vec();
                for _ in 0..times {
                    data.splice(end..end, chunk.iter().copied());
                }
            }
            Mutation::Splice {
                at,
                donor,
                from,
                len,
            } => {
                if corpus.is_empty() {
                    return;
                }
                let donor = &corpus[donor % corpus.len()];
                let from = from % (donor.len() + 1);
                let end = from.saturating_add(len).min(donor.len());
                let i = pos(at, data);
                data.splice(i..i, donor[from..end].iter().copied());
            }
            Mutation::Length {
                at,
                value,
                form,
                overwrite,
            } => {
                let bytes = match form {
                    LengthForm::U32Le => (value as u32).to_le_bytes().to_vec(),
                    LengthForm::U64Le => value.to_le_bytes().to_vec(),
                    LengthForm::Varint => varint(value),
                };
                let i = pos(at, data);
                let end = if overwrite {
                    (i + bytes.len()).min(data.len())
                } else {
                    i
                };
                data.splice(i..end, bytes);
            }
        }
    }
}

/// Lengths at the edges: zero, type limits, and sizes no input could back.
fn length_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(0x7f),
        Just(0x80),
        Just(0xffff),
        Just(1 << 24),
        Just(1 << 31),
        Just(u64::from(u32::MAX)),
        Just(1 << 32),
        Just(1 << 40),
        Just(i64::MAX as u64),
        Just(u64::MAX),
        any::<u64>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let form = prop_oneof![
        Just(LengthForm::U32Le),
        Just(LengthForm::U64Le),
        Just(LengthForm::Varint)
    ];
    prop_oneof![
        3 => (any::<usize>(), any::<u8>()).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        2 => (any::<usize>(), prop_oneof![Just(0u8), Just(0xff), Just(0x7f), Just(0x80), any::<u8>()])
            .prop_map(|(at, value)| Mutation::SetByte { at, value }),
        1 => any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        1 => (any::<usize>(), 0usize..64).prop_map(|(at, len)| Mutation::Remove { at, len }),
        1 => (any::<usize>(), vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::InsertBytes { at, bytes }),
        2 => (any::<usize>(), any::<usize>())
            .prop_map(|(at, token)| Mutation::InsertToken { at, token }),
        1 => (any::<usize>(), 1usize..64, 1u8..16)
            .prop_map(|(at, len, times)| Mutation::Repeat { at, len, times }),
        1 => (any::<usize>(), any::<usize>(), any::<usize>(), 1usize..128)
            .prop_map(|(at, donor, from, len)| Mutation::Splice { at, donor, from, len }),
        2 => (any::<usize>(), length_value(), form, any::<bool>()).prop_map(
            |(at, value, form, overwrite)| Mutation::Length { at, value, form, overwrite }
        ),
    ]
}

/// Inputs for a target: mostly corpus entries with one to eight mutations, sometimes arbitrary
/// bytes or a run of dictionary tokens.
pub fn inputs(corpus: Vec<Vec<u8>>, dictionary: Vec<Vec<u8>>) -> BoxedStrategy<Vec<u8>> {
    let corpus = Arc::new(corpus);
    let dictionary = Arc::new(dictionary);
    let arbitrary = vec(any::<u8>(), 0..512);
    let tokens = {
        let dictionary = dictionary.clone();
        vec(any::<usize>(), 0..48).prop_map(move |picks| {
            if dictionary.is_empty() {
                return Vec::new();
            }
            picks
                .iter()
                .flat_map(|&i| dictionary[i % dictionary.len()].iter().copied())
                .collect()
        })
    };
    if corpus.is_empty() {
        return prop_oneof![arbitrary, tokens].boxed();
    }
    let mutated = (any::<usize>(), vec(mutation(), 1..8)).prop_map(move |(pick, edits)| {
        let mut data = corpus[pick % corpus.len()].clone();
        for edit in &edits {
            edit.apply(&mut data, &corpus, &dictionary);
        }
        data
    });
    prop_oneof![8 => mutated, 1 => arbitrary, 1 => tokens].boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(m: Mutation, data: &[u8]) -> Vec<u8> {
        let mut data = data.to_vec();
        m.apply(&mut data, &[b"donor".to_vec()], &[b"TOK".to_vec()]);
        data
    }

    #[test]
    fn every_mutation_applies_to_an_empty_input() {
        let all = [
            Mutation::FlipBit { at: 5, bit: 9 },
            Mutation::SetByte { at: 5, value: 1 },
            Mutation::Truncate { at: 5 },
            Mutation::Remove { at: 5, len: 3 },
            Mutation::Repeat {
                at: 5,
                len: 3,
                times: 2,
            },
        ];
        for m in all {
            assert_eq!(applied(m, b""), b"");
        }
        assert_eq!(
            applied(Mutation::InsertToken { at: 9, token: 4 }, b""),
            b"TOK"
        );
    }

    #[test]
    fn positions_wrap_around_the_input() {
        assert_eq!(applied(Mutation::FlipBit { at: 4, bit: 8 }, b"ab"), b"`b");
        assert_eq!(applied(Mutation::Truncate { at: 4 }, b"abcd"), b"abcd");
        assert_eq!(applied(Mutation::Truncate { at: 7 }, b"abcd"), b"ab");
        assert_eq!(
            applied(
                Mutation::Repeat {
                    at: 1,
                    len: 2,
                    times: 2
                },
                b"abcd"
            ),
            b"abcbcbcd"
        );
        assert_eq!(
            applied(
                Mutation::Splice {
                    at: 1,
                    donor: 3,
                    from: 1,
                    len: 2
                },
                b"xy"
            ),
            b"xony"
        );
    }

    #[test]
    fn lengths_are_written_in_their_form() {
        let length = |form, overwrite| Mutation::Length {
            at: 1,
            value: 300,
            form,
            overwrite,
        };
        assert_eq!(
            applied(length(LengthForm::Varint, false), b"ab"),
            b"a\xac\x02b"
        );
        assert_eq!(
            applied(length(LengthForm::U32Le, true), b"abcdef"),
            b"a\x2c\x01\x00\x00f"
        );
        assert_eq!(
            applied(length(LengthForm::U64Le, true), b"ab"),
            b"a\x2c\x01\x00\x00\x00\x00\x00\x00"
        );
    }
}

//! The versioned codec: every value the journal persists, and every Raft RPC payload the
//! dispatcher ships, is `[CODEC_VERSION] ++ bincode(serde, standard config)`.
//!
//! The leading byte lets a later build change the encoding (or replace bincode) and still
//! recognise old bytes; today a different byte is an error. Decoding checks the version,
//! rejects truncated input and trailing bytes, and caps what a length prefix may claim: at
//! [`MAX_DECODE_BYTES`] in all, and in proportion to the input's own size below that (bincode
//! allocates a string or byte buffer of the claimed length before it reads a byte of it, so a
//! corrupt 10-byte entry could otherwise claim a gigabyte). Format-level versioning of the data
//! dir lives in `journal.rs`, not here.

use bincode::config;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::JournalError;

/// Version byte prepended to every encoded value.
pub const CODEC_VERSION: u8 = 1;

/// Upper bound on what one decode may claim (strings, byte buffers, sequences). Snapshots of
/// the dispatcher state are far below this; anything larger is treated as corruption.
pub const MAX_DECODE_BYTES: usize = 1 << 30;

/// What an honest value claims at most per byte of its encoding: bincode counts every integer
/// at its full width (16 bytes for a `u128`) however few bytes its varint takes, and a string
/// or byte buffer at its length.
const CLAIM_PER_BYTE: usize = 16;

/// Encodes `v` as `[CODEC_VERSION] ++ bincode(v)`.
///
/// # Panics
///
/// If `v`'s `Serialize` impl cannot be expressed in bincode (a custom impl that fails, or serde
/// features bincode lacks such as `#[serde(flatten)]` or sequences of unknown length). That is
/// a programming error in the type, never a property of input data; use [`try_encode`] where a
/// caller wants it as an error.
pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    match try_encode(v) {
        Ok(buf) => buf,
        Err(e) => panic!("type cannot be encoded by the journal codec: {e}"),
    }
}

/// Like [`encode`], reporting an unencodable value as [`JournalError::Codec`].
pub fn try_encode<T: Serialize>(v: &T) -> Result<Vec<u8>, JournalError> {
    let mut buf = vec![CODEC_VERSION];
    bincode::serde::encode_into_std_write(v, &mut buf, config::standard()).map_err(|e| {
        JournalError::Codec {
            reason: format!("encode: {e}"),
        }
    })?;
    Ok(buf)
}

/// Decodes bytes produced by [`encode`]: checks the version byte, then requires the rest to be
/// exactly one bincode value.
pub fn decode<T: DeserializeOwned>(buf: &[u8]) -> Result<T, JournalError> {
    let Some((&version, body)) = buf.split_first() else {
        return Err(JournalError::Codec {
            reason: "empty input: missing version byte".to_string(),
        });
    };
    if version != CODEC_VERSION {
        return Err(JournalError::Codec {
            reason: format!(
                "unknown codec version {version} (this build reads version {CODEC_VERSION})"
            ),
        });
    }
    // The limit is a type parameter: the smallest of a few steps that the input's size allows.
    let claim = body.len().saturating_mul(CLAIM_PER_BYTE);
    let (value, used) = if claim <= 1 << 16 {
        decode_within::<T, { 1 << 16 }>(body)
    } else if claim <= 1 << 20 {
        decode_within::<T, { 1 << 20 }>(body)
    } else if claim <= 1 << 24 {
        decode_within::<T, { 1 << 24 }>(body)
    } else if claim <= 1 << 28 {
        decode_within::<T, { 1 << 28 }>(body)
    } else {
        decode_within::<T, MAX_DECODE_BYTES>(body)
    }?;
    if used != body.len() {
        return Err(JournalError::Codec {
            reason: format!("{} trailing bytes after the value", body.len() - used),
        });
    }
    Ok(value)
}

/// One bincode value from `body`, claiming at most `LIMIT` bytes; returns it and the bytes used.
fn decode_within<T: DeserializeOwned, const LIMIT: usize>(
    body: &[u8],
) -> Result<(T, usize), JournalError> {
    let cfg = config::standard().with_limit::<LIMIT>();
    bincode::serde::decode_from_slice(body, cfg).map_err(|e| JournalError::Codec {
        reason: format!("decode: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Sample {
        id: u64,
        name: String,
        tags: BTreeMap<String, Vec<u8>>,
        parent: Option<Box<Sample>>,
    }

    fn sample() -> Sample {
        let mut tags = BTreeMap::new();
        tags.insert("a".to_string(), vec![1, 2, 3]);
        tags.insert("b".to_string(), vec![]);
        Sample {
            id: 42,
            name: "split".to_string(),
            tags,
            parent: Some(Box::new(Sample {
                id: 1,
                name: String::new(),
                tags: BTreeMap::new(),
                parent: None,
            })),
        }
    }

    #[test]
    fn round_trip() {
        let v = sample();
        let buf = encode(&v);
        assert_eq!(buf[0], CODEC_VERSION);
        let back: Sample = decode(&buf).expect("decode");
        assert_eq!(back, v);
    }

    #[test]
    fn round_trip_openraft_entry() {
        use std::io::Cursor;

        use openraft::entry::RaftEntry;
        use openraft::testing::log_id;
        openraft::declare_raft_types!(Tc: D = String, R = String);
        let mut e = openraft::Entry::<Tc>::new_blank(log_id(3, 1, 7));
        e.payload = openraft::EntryPayload::Normal("set x".to_string());
        let back: openraft::Entry<Tc> = decode(&encode(&e)).expect("decode");
        assert_eq!(back.log_id, e.log_id);
        assert!(matches!(back.payload, openraft::EntryPayload::Normal(ref s) if s == "set x"));
    }

    #[test]
    fn wrong_version_is_an_error() {
        let mut buf = encode(&sample());
        buf[0] = CODEC_VERSION + 1;
        let err = decode::<Sample>(&buf).unwrap_err();
        assert!(err.to_string().contains("unknown codec version"), "{err}");
    }

    #[test]
    fn empty_input_is_an_error() {
        let err = decode::<u64>(&[]).unwrap_err();
        assert!(err.to_string().contains("missing version byte"), "{err}");
    }

    #[test]
    fn truncated_input_is_an_error() {
        let buf = encode(&sample());
        for len in 1..buf.len() {
            assert!(
                decode::<Sample>(&buf[..len]).is_err(),
                "prefix of {len} bytes decoded"
            );
        }
    }

    #[test]
    fn trailing_bytes_are_an_error() {
        let mut buf = encode(&7u64);
        buf.push(0);
        let err = decode::<u64>(&buf).unwrap_err();
        assert!(err.to_string().contains("trailing"), "{err}");
    }

    #[test]
    fn huge_length_prefix_is_an_error_not_an_allocation() {
        // version, then a varint u64 length of u64::MAX for a String.
        let mut buf = vec![CODEC_VERSION, 253];
        buf.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode::<String>(&buf).is_err());
    }
}

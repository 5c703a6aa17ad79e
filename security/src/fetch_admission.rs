//! Readers' admissions to iterations: who may take a task's elements from a worker.
//!
//! The dispatcher cluster holds one secret [`FetchKey`] (chosen by a leader, replicated in its
//! state). Admitting a client to an iteration, the dispatcher gives it an [`Admission`]:
//! HMAC-SHA256 under the key of the iteration id and the client id. Workers learn the key from
//! the dispatcher (in their heartbeat replies, as the worker role) and check a reader's
//! admission against the task's iteration and the client id the reader names, in constant time,
//! before they serve it anything. So a worker knows who the dispatcher admitted without asking
//! it, and a caller that holds a valid client credential but was not admitted to the iteration
//! (or names another client's id) gets nothing.
//!
//! Neither value prints: their `Debug` shows no byte of them, so a log line, an error or a
//! status page that formats them gives nothing away.

use ring::hmac;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Bytes of a fetch key, and of an admission (an HMAC-SHA256 tag).
pub const FETCH_KEY_LEN: usize = 32;

/// What an admission signs: a fixed prefix, then the iteration id and the client id, 8
/// big-endian bytes each (fixed widths, so no two pairs sign the same bytes).
const CONTEXT: &[u8] = b"sluice fetch admission v1\0";

/// The cluster's secret for admissions. 32 random bytes.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchKey([u8; FETCH_KEY_LEN]);

impl fmt::Debug for FetchKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FetchKey(..)")
    }
}

impl FetchKey {
    /// A fresh key from the operating system's random source.
    pub fn random() -> FetchKey {
        FetchKey(rand::random())
    }

    /// A key from its bytes, as a heartbeat reply carries it; `None` unless exactly
    /// [`FETCH_KEY_LEN`] bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<FetchKey> {
        bytes.try_into().ok().map(FetchKey)
    }

    /// The key's bytes, to send to a worker. A secret: never log them.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.to_vec()
    }

    fn hmac_key(&self) -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, &self.0)
    }

    /// The admission of client `client_id` to iteration `iteration_id`.
    pub fn admit(&self, iteration_id: u64, client_id: u64) -> Admission {
        let tag = hmac::sign(&self.hmac_key(), &message(iteration_id, client_id));
        let mut bytes = [0u8; FETCH_KEY_LEN];
        bytes.copy_from_slice(tag.as_ref());
        Admission(bytes)
    }

    /// Checks, in constant time, that `admission` (as a reader sent it) admits client
    /// `client_id` to iteration `iteration_id`.
    pub fn verify(
        &self,
        iteration_id: u64,
        client_id: u64,
        admission: &[u8],
    ) -> Result<(), AdmissionRefusal> {
        if admission.is_empty() {
            return Err(AdmissionRefusal::Missing);
        }
        hmac::verify(
            &self.hmac_key(),
            &message(iteration_id, client_id),
            admission,
        )
        .map_err(|_| AdmissionRefusal::Invalid)
    }
}

fn message(iteration_id: u64, client_id: u64) -> Vec<u8> {
    let mut message = Vec::with_capacity(CONTEXT.len() + 16);
    message.extend_from_slice(CONTEXT);
    message.extend_from_slice(&iteration_id.to_be_bytes());
    message.extend_from_slice(&client_id.to_be_bytes());
    message
}

/// Why [`FetchKey::verify`] refused an admission (neither says anything of the bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdmissionRefusal {
    /// The reader presented none.
    Missing,
    /// It is not the dispatcher's admission of this client to this iteration.
    Invalid,
}

/// A client's admission to an iteration, as the dispatcher gave it: what the reader presents
/// to workers. Only the worker's check gives it meaning; the reader passes it on as is.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Admission([u8; FETCH_KEY_LEN]);

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Admission(..)")
    }
}

impl Admission {
    /// An admission from its bytes, as the dispatcher's reply carries it; `None` unless
    /// exactly [`FETCH_KEY_LEN`] bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<Admission> {
        bytes.try_into().ok().map(Admission)
    }

    /// The bytes, to send.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_admission_admits_its_client_to_its_iteration_only() {
        let key = FetchKey::random();
        let admission = key.admit(2000, 3000).to_bytes();
        assert_eq!(key.verify(2000, 3000, &admission), Ok(()));
        let refused = [
            ("another client", key.verify(2000, 3001, &admission)),
            ("another iteration", key.verify(2001, 3000, &admission)),
            ("ids swapped", key.verify(3000, 2000, &admission)),
            (
                "another key",
                FetchKey::random().verify(2000, 3000, &admission),
            ),
            ("truncated", key.verify(2000, 3000, &admission[..31])),
            ("one bit off", {
                let mut forged = admission.clone();
                forged[7] ^= 1;
                key.verify(2000, 3000, &forged)
            }),
            ("all zeros", key.verify(2000, 3000, &[0; 32])),
        ];
        for (case, outcome) in refused {
            assert_eq!(outcome, Err(AdmissionRefusal::Invalid), "{case}");
        }
        assert_eq!(key.verify(2000, 3000, &[]), Err(AdmissionRefusal::Missing));
    }

    #[test]
    fn the_same_key_gives_the_same_admission() {
        let key = FetchKey::random();
        let again = FetchKey::from_bytes(&key.to_bytes()).expect("32 bytes");
        assert_eq!(key.admit(5, 6), again.admit(5, 6));
        assert_eq!(FetchKey::from_bytes(&[1; 31]), None);
        assert_eq!(Admission::from_bytes(&[1; 33]), None);
    }

    #[test]
    fn neither_prints_its_bytes() {
        let key = FetchKey::from_bytes(&[0xab; 32]).expect("32 bytes");
        let admission = key.admit(1, 2);
        assert_eq!(format!("{key:?}"), "FetchKey(..)");
        assert_eq!(format!("{admission:?}"), "Admission(..)");
        assert!(!format!("{:?}", Some(&key)).contains("171"));
    }
}

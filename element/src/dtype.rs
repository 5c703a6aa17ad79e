//! `DType`, the element type of a tensor, and its conversions to and from `pb::DType`.
//!
//! `pb::DType::DtypeUnspecified` has no domain counterpart: converting it is an error, so a
//! half-filled proto never turns into a silently wrong tensor.

use std::fmt;
use std::str::FromStr;

use crate::error::DatasetError;
use crate::pb;

/// The element type of a tensor. Numeric dtypes are stored little-endian; `String` tensors hold
/// one byte string per element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    Bool,
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    Float32,
    Float64,
    String,
}

impl DType {
    /// Every dtype, in proto order.
    pub const ALL: [DType; 12] = [
        DType::Bool,
        DType::Int8,
        DType::Int16,
        DType::Int32,
        DType::Int64,
        DType::UInt8,
        DType::UInt16,
        DType::UInt32,
        DType::UInt64,
        DType::Float32,
        DType::Float64,
        DType::String,
    ];

    /// The dtype whose proto number is `code` (how the element codec writes it); a table lookup,
    /// for decoding tiny elements.
    pub fn from_code(code: u8) -> Option<DType> {
        // `ALL` is in proto order, numbered from 1 (checked by the tests).
        DType::ALL.get(usize::from(code).checked_sub(1)?).copied()
    }

    /// Bytes per element, `None` for `String` (variable length).
    pub fn size(self) -> Option<usize> {
        match self {
            DType::Bool | DType::Int8 | DType::UInt8 => Some(1),
            DType::Int16 | DType::UInt16 => Some(2),
            DType::Int32 | DType::UInt32 | DType::Float32 => Some(4),
            DType::Int64 | DType::UInt64 | DType::Float64 => Some(8),
            DType::String => None,
        }
    }

    /// The lowercase name used in specs and the text syntax ("int64").
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::Int8 => "int8",
            DType::Int16 => "int16",
            DType::Int32 => "int32",
            DType::Int64 => "int64",
            DType::UInt8 => "uint8",
            DType::UInt16 => "uint16",
            DType::UInt32 => "uint32",
            DType::UInt64 => "uint64",
            DType::Float32 => "float32",
            DType::Float64 => "float64",
            DType::String => "string",
        }
    }

    pub fn is_integer(self) -> bool {
        matches!(
            self,
            DType::Int8
                | DType::Int16
                | DType::Int32
                | DType::Int64
                | DType::UInt8
                | DType::UInt16
                | DType::UInt32
                | DType::UInt64
        )
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::Float32 | DType::Float64)
    }

    /// Integer or floating point (not bool, not string).
    pub fn is_numeric(self) -> bool {
        self.is_integer() || self.is_float()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = DatasetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| DatasetError::invalid(format!("unknown dtype '{s}'")))
    }
}

impl From<DType> for pb::DType {
    fn from(d: DType) -> Self {
        match d {
            DType::Bool => pb::DType::Bool,
            DType::Int8 => pb::DType::Int8,
            DType::Int16 => pb::DType::Int16,
            DType::Int32 => pb::DType::Int32,
            DType::Int64 => pb::DType::Int64,
            DType::UInt8 => pb::DType::Uint8,
            DType::UInt16 => pb::DType::Uint16,
            DType::UInt32 => pb::DType::Uint32,
            DType::UInt64 => pb::DType::Uint64,
            DType::Float32 => pb::DType::Float32,
            DType::Float64 => pb::DType::Float64,
            DType::String => pb::DType::String,
        }
    }
}

impl TryFrom<pb::DType> for DType {
    type Error = DatasetError;

    fn try_from(d: pb::DType) -> Result<Self, Self::Error> {
        Ok(match d {
            pb::DType::DtypeUnspecified => {
                return Err(DatasetError::invalid("dtype is unspecified"))
            }
            pb::DType::Bool => DType::Bool,
            pb::DType::Int8 => DType::Int8,
            pb::DType::Int16 => DType::Int16,
            pb::DType::Int32 => DType::Int32,
            pb::DType::Int64 => DType::Int64,
            pb::DType::Uint8 => DType::UInt8,
            pb::DType::Uint16 => DType::UInt16,
            pb::DType::Uint32 => DType::UInt32,
            pb::DType::Uint64 => DType::UInt64,
            pb::DType::Float32 => DType::Float32,
            pb::DType::Float64 => DType::Float64,
            pb::DType::String => DType::String,
        })
    }
}

/// From the raw `i32` of a proto field; unknown numbers are errors.
impl TryFrom<i32> for DType {
    type Error = DatasetError;

    fn try_from(v: i32) -> Result<Self, Self::Error> {
        let d = pb::DType::try_from(v)
            .map_err(|_| DatasetError::invalid(format!("unknown dtype number {v}")))?;
        DType::try_from(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_proto_and_name() {
        for d in DType::ALL {
            assert_eq!(DType::try_from(pb::DType::from(d)).unwrap(), d);
            assert_eq!(DType::try_from(pb::DType::from(d) as i32).unwrap(), d);
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert_eq!(DType::Int64.to_string(), "int64");
        assert!(DType::try_from(pb::DType::DtypeUnspecified).is_err());
        assert!(DType::try_from(99).is_err());
    }

    #[test]
    fn from_code_agrees_with_the_proto_numbers() {
        for code in 0..=u8::MAX {
            assert_eq!(
                DType::from_code(code),
                DType::try_from(i32::from(code)).ok()
            );
        }
    }
}

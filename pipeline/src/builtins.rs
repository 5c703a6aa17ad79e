//! The built-in functions every registry starts with, and the registries that hold them
//! (`FunctionRegistry::with_builtins`, the process-wide `FunctionRegistry::global`).
//!
//! Maps (`identity`, `square`, `negate`, `add_one`, `to_float`) apply elementwise to every tensor
//! component of an element, so they work on scalars, batches, tuples and dicts alike. Integer
//! arithmetic wraps, as TensorFlow's does. Filters (`is_even`, `is_odd`) accept integer tensors
//! and keep an element when every value qualifies.

use std::sync::{Arc, OnceLock};

use sluice_element::{DType, DatasetError, Element, ElementSpec, Tensor, TensorValue};

use crate::registry::FunctionRegistry;

impl FunctionRegistry {
    /// A registry holding the built-in functions (see this module).
    pub fn with_builtins() -> Self {
        let r = Self::new();
        register_all(&r);
        r
    }

    /// The process-wide registry, built with the built-ins on first use.
    pub fn global() -> Arc<FunctionRegistry> {
        static GLOBAL: OnceLock<Arc<FunctionRegistry>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| Arc::new(FunctionRegistry::with_builtins()))
            .clone()
    }
}

fn register_all(r: &FunctionRegistry) {
    r.register_map(
        "identity",
        Arc::new(|s: &ElementSpec| Ok(s.clone())),
        Arc::new(Ok),
    );
    for op in [Unary::Square, Unary::Negate, Unary::AddOne] {
        let name = op.name();
        r.register_map(
            name,
            Arc::new(move |s: &ElementSpec| {
                require(name, s, DType::is_numeric, "numeric").map(|()| s.clone())
            }),
            Arc::new(move |e: Element| map_tensors(e, &|t| unary(name, op, t))),
        );
    }
    r.register_map(
        "to_float",
        Arc::new(|s: &ElementSpec| {
            require("to_float", s, |d| d != DType::String, "numeric or bool")?;
            Ok(s.with_dtype(DType::Float64))
        }),
        Arc::new(|e: Element| map_tensors(e, &to_float)),
    );
    r.register_filter(
        "is_even",
        Arc::new(|e: &Element| all_parity("is_even", e, true)),
    );
    r.register_filter(
        "is_odd",
        Arc::new(|e: &Element| all_parity("is_odd", e, false)),
    );
}

#[derive(Clone, Copy)]
enum Unary {
    Square,
    Negate,
    AddOne,
}

impl Unary {
    fn name(self) -> &'static str {
        match self {
            Unary::Square => "square",
            Unary::Negate => "negate",
            Unary::AddOne => "add_one",
        }
    }
}

/// Arithmetic the unary built-ins need, wrapping for integers.
trait Arith: TensorValue {
    fn apply(self, op: Unary) -> Self;
}

macro_rules! arith_int {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn apply(self, op: Unary) -> Self {
                match op {
                    Unary::Square => self.wrapping_mul(self),
                    Unary::Negate => self.wrapping_neg(),
                    Unary::AddOne => self.wrapping_add(1),
                }
            }
        }
    )*};
}
arith_int!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! arith_float {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn apply(self, op: Unary) -> Self {
                match op {
                    Unary::Square => self * self,
                    Unary::Negate => -self,
                    Unary::AddOne => self + 1.0,
                }
            }
        }
    )*};
}
arith_float!(f32, f64);

fn fn_error(name: &str, message: String) -> DatasetError {
    DatasetError::Function {
        name: name.to_string(),
        message,
    }
}

fn require(
    name: &str,
    s: &ElementSpec,
    ok: fn(DType) -> bool,
    what: &str,
) -> Result<(), DatasetError> {
    match s.dtypes().into_iter().find(|d| !ok(*d)) {
        Some(d) => Err(fn_error(name, format!("expects {what} tensors, got {d}"))),
        None => Ok(()),
    }
}

/// Applies `f` to every tensor of the element, keeping the structure.
fn map_tensors(
    e: Element,
    f: &dyn Fn(&Tensor) -> Result<Tensor, DatasetError>,
) -> Result<Element, DatasetError> {
    Ok(match e {
        Element::Tensor(t) => Element::Tensor(f(&t)?),
        Element::Tuple(items) => Element::Tuple(
            items
                .into_iter()
                .map(|i| map_tensors(i, f))
                .collect::<Result<_, _>>()?,
        ),
        Element::Dict(fields) => Element::Dict(
            fields
                .into_iter()
                .map(|(k, v)| Ok((k, map_tensors(v, f)?)))
                .collect::<Result<_, DatasetError>>()?,
        ),
    })
}

fn apply_typed<T: Arith>(t: &Tensor, op: Unary) -> Result<Tensor, DatasetError> {
    let values = t.to_values::<T>().unwrap_or_default();
    let out: Vec<T> = values.into_iter().map(|v| v.apply(op)).collect();
    Tensor::from_values(t.shape().to_vec(), &out)
}

fn unary(name: &str, op: Unary, t: &Tensor) -> Result<Tensor, DatasetError> {
    match t.dtype() {
        DType::Int8 => apply_typed::<i8>(t, op),
        DType::Int16 => apply_typed::<i16>(t, op),
        DType::Int32 => apply_typed::<i32>(t, op),
        DType::Int64 => apply_typed::<i64>(t, op),
        DType::UInt8 => apply_typed::<u8>(t, op),
        DType::UInt16 => apply_typed::<u16>(t, op),
        DType::UInt32 => apply_typed::<u32>(t, op),
        DType::UInt64 => apply_typed::<u64>(t, op),
        DType::Float32 => apply_typed::<f32>(t, op),
        DType::Float64 => apply_typed::<f64>(t, op),
        d @ (DType::Bool | DType::String) => {
            Err(fn_error(name, format!("expects numeric tensors, got {d}")))
        }
    }
}

fn to_float(t: &Tensor) -> Result<Tensor, DatasetError> {
    let values = t.to_f64s().ok_or_else(|| {
        fn_error(
            "to_float",
            format!("expects numeric or bool tensors, got {}", t.dtype()),
        )
    })?;
    Tensor::from_f64s(t.shape().to_vec(), &values)
}

/// True when every integer value of every tensor has the wanted parity.
fn all_parity(name: &str, e: &Element, even: bool) -> Result<bool, DatasetError> {
    match e {
        Element::Tensor(t) => {
            let evens: Vec<bool> = match t.dtype() {
                DType::UInt64 => t
                    .to_values::<u64>()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|v| v % 2 == 0)
                    .collect(),
                d if d.is_integer() => t
                    .to_i64s()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|v| v % 2 == 0)
                    .collect(),
                d => return Err(fn_error(name, format!("expects integer tensors, got {d}"))),
            };
            Ok(evens.into_iter().all(|is_even| is_even == even))
        }
        Element::Tuple(items) => {
            for i in items {
                if !all_parity(name, i, even)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Element::Dict(fields) => {
            for v in fields.values() {
                if !all_parity(name, v, even)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(name: &str, e: Element) -> Result<Element, DatasetError> {
        let (f, _) = FunctionRegistry::with_builtins().map_fn(name).unwrap();
        f(e)
    }

    fn keep(name: &str, e: &Element) -> Result<bool, DatasetError> {
        FunctionRegistry::with_builtins().filter_fn(name).unwrap()(e)
    }

    #[test]
    fn maps_are_elementwise_and_keep_dtype() {
        assert_eq!(
            map("square", Tensor::scalar_i64(-3).into()).unwrap(),
            Tensor::scalar_i64(9).into()
        );
        assert_eq!(
            map("square", Tensor::scalar(2.5f32).into()).unwrap(),
            Tensor::scalar(6.25f32).into()
        );
        assert_eq!(
            map("square", Tensor::scalar(20u8).into()).unwrap(),
            Tensor::scalar(144u8).into()
        );
        assert_eq!(
            map("negate", Tensor::scalar(5i32).into()).unwrap(),
            Tensor::scalar(-5i32).into()
        );
        assert_eq!(
            map("add_one", Tensor::scalar(i64::MAX).into()).unwrap(),
            Tensor::scalar(i64::MIN).into()
        );
        let v = Tensor::from_i64s(vec![3], &[1, 2, 3]).unwrap();
        let want = Tensor::from_f64s(vec![3], &[1.0, 2.0, 3.0]).unwrap();
        assert_eq!(map("to_float", v.into()).unwrap(), want.into());
        let pair = Element::Tuple(vec![
            Tensor::scalar_i64(2).into(),
            Tensor::scalar_f64(3.0).into(),
        ]);
        let want = Element::Tuple(vec![
            Tensor::scalar_i64(4).into(),
            Tensor::scalar_f64(9.0).into(),
        ]);
        assert_eq!(map("square", pair).unwrap(), want);
        let err = map("square", Tensor::scalar_string("x").into()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "function 'square' failed: expects numeric tensors, got string"
        );
    }

    #[test]
    fn spec_functions_check_dtypes() {
        let r = FunctionRegistry::with_builtins();
        let (_, spec) = r.map_fn("to_float").unwrap();
        assert_eq!(
            spec(&ElementSpec::scalar(DType::Int32)).unwrap(),
            ElementSpec::scalar(DType::Float64)
        );
        let (_, spec) = r.map_fn("square").unwrap();
        assert!(spec(&ElementSpec::scalar(DType::String)).is_err());
        assert!(spec(&ElementSpec::scalar(DType::Bool)).is_err());
    }

    #[test]
    fn parity_filters() {
        assert!(keep("is_even", &Tensor::scalar_i64(4).into()).unwrap());
        assert!(!keep("is_even", &Tensor::scalar_i64(-3).into()).unwrap());
        assert!(keep("is_odd", &Tensor::scalar_i64(-3).into()).unwrap());
        assert!(keep("is_even", &Tensor::scalar(u64::MAX - 1).into()).unwrap());
        assert!(!keep(
            "is_even",
            &Tensor::from_i64s(vec![2], &[2, 3]).unwrap().into()
        )
        .unwrap());
        assert!(keep("is_even", &Tensor::scalar_f64(2.0).into()).is_err());
    }
}

//! `FunctionRegistry`: named map and filter functions that definitions refer to.
//!
//! Definitions carry only function *names* (they travel through the dispatcher's log and over
//! the network); every process resolves them in its own registry. The process-wide registry
//! (`global`, in `builtins`) is built lazily with the built-ins and stays writable behind an `RwLock`, so an
//! embedding program may register functions after workers have started. Lookups clone the
//! `Arc`s out, so the lock is never held while a function runs.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use sluice_element::{DatasetError, Element, ElementSpec};

/// A map function: one element in, one element out.
pub type MapFn = Arc<dyn Fn(Element) -> Result<Element, DatasetError> + Send + Sync>;
/// A map function's output spec from its input spec (errors if the input is not accepted).
pub type SpecFn = Arc<dyn Fn(&ElementSpec) -> Result<ElementSpec, DatasetError> + Send + Sync>;
/// A filter predicate: keep the element when it returns `true`.
pub type PredicateFn = Arc<dyn Fn(&Element) -> Result<bool, DatasetError> + Send + Sync>;

/// Named map and filter functions.
#[derive(Default)]
pub struct FunctionRegistry {
    /// std `RwLock`: held only to clone an `Arc` in or out, never across a call or `.await`.
    maps: RwLock<BTreeMap<String, (MapFn, SpecFn)>>,
    filters: RwLock<BTreeMap<String, PredicateFn>>,
}

impl std::fmt::Debug for FunctionRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FunctionRegistry")
            .field("maps", &self.map_names())
            .field("filters", &self.filter_names())
            .finish()
    }
}

impl FunctionRegistry {
    /// An empty registry (no built-ins).
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) a map function.
    pub fn register_map(&self, name: &str, spec: SpecFn, f: MapFn) {
        self.maps
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), (f, spec));
    }

    /// Registers (or replaces) a filter predicate.
    pub fn register_filter(&self, name: &str, f: PredicateFn) {
        self.filters
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), f);
    }

    pub fn map_fn(&self, name: &str) -> Result<(MapFn, SpecFn), DatasetError> {
        let maps = self.maps.read().unwrap_or_else(|e| e.into_inner());
        maps.get(name)
            .cloned()
            .ok_or_else(|| DatasetError::UnknownFunction {
                name: name.to_string(),
                kind: "map".to_string(),
                known: maps.keys().cloned().collect(),
            })
    }

    pub fn filter_fn(&self, name: &str) -> Result<PredicateFn, DatasetError> {
        let filters = self.filters.read().unwrap_or_else(|e| e.into_inner());
        filters
            .get(name)
            .cloned()
            .ok_or_else(|| DatasetError::UnknownFunction {
                name: name.to_string(),
                kind: "filter".to_string(),
                known: filters.keys().cloned().collect(),
            })
    }

    /// Registered map function names, sorted.
    pub fn map_names(&self) -> Vec<String> {
        self.maps
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Registered filter names, sorted.
    pub fn filter_names(&self) -> Vec<String> {
        self.filters
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_element::Tensor;

    #[test]
    fn registration_after_start_is_visible() {
        let r = FunctionRegistry::with_builtins();
        assert!(r.map_fn("double").is_err());
        r.register_map(
            "double",
            Arc::new(|s: &ElementSpec| Ok(s.clone())),
            Arc::new(|e: Element| {
                let v = e
                    .as_i64()
                    .ok_or_else(|| DatasetError::invalid("not an int"))?;
                Ok(Tensor::scalar_i64(v * 2).into())
            }),
        );
        let (f, _) = r.map_fn("double").unwrap();
        assert_eq!(f(Tensor::scalar_i64(4).into()).unwrap().as_i64(), Some(8));
        r.register_filter("never", Arc::new(|_: &Element| Ok(false)));
        assert!(r.filter_names().contains(&"never".to_string()));
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let r = FunctionRegistry::with_builtins();
        let err = r.map_fn("foo").err().unwrap().to_string();
        assert_eq!(err, "unknown function 'foo' in map; registered map functions: add_one, identity, negate, square, to_float");
        let err = r.filter_fn("foo").err().unwrap().to_string();
        assert_eq!(
            err,
            "unknown function 'foo' in filter; registered filter functions: is_even, is_odd"
        );
    }
}

//! `PerReplica`: one step of a distributed dataset, a value for each local replica, as
//! tf.distribute's `PerReplica`.

use serde_json::Value;
use sluice_element::Element;

/// The values of one step, in replica order: `values()[i]` is local replica i's batch.
#[derive(Debug, Clone, PartialEq)]
pub struct PerReplica {
    values: Vec<Element>,
}

impl PerReplica {
    pub(crate) fn new(values: Vec<Element>) -> PerReplica {
        PerReplica { values }
    }

    pub fn values(&self) -> &[Element] {
        &self.values
    }

    pub fn into_values(self) -> Vec<Element> {
        self.values
    }

    pub fn num_replicas(&self) -> usize {
        self.values.len()
    }

    /// A JSON array with each replica's value in `Element::to_json` form.
    pub fn to_json(&self) -> Value {
        Value::Array(self.values.iter().map(Element::to_json).collect())
    }
}

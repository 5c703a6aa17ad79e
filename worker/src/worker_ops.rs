//! `WorkerOps`: what a worker serves on its metrics listener (`--metrics-listen`): its metrics
//! and its readiness. A worker has no status page (the dispatcher's shows every worker).
//!
//! Readiness ("serving"): the worker has registered with the dispatcher (its first heartbeat
//! was answered). The listener opens before registration, so `/live` answers while a worker
//! waits for its dispatcher, and `/ready` says why it does not serve yet.
//!
//! The worker's values are read from its state when scraped (a collector): tasks held, the
//! buffers' fill, the memory budget's use, and the running totals of `WorkerStats`. Nothing is kept per task, so no
//! series outlives its task.

use crate::worker_state::WorkerState;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use sluice_executor::MemoryBudget;
use sluice_ops::{BoxFuture, OpsNode, RpcMetrics};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub struct WorkerOps {
    registry: Registry,
    registered: Arc<AtomicBool>,
}

impl WorkerOps {
    /// A worker's metrics over `state`; returns the RPC metrics for its gRPC server too.
    /// `registered` is set once the dispatcher answered the first heartbeat.
    pub fn new(
        state: Arc<WorkerState>,
        memory: Arc<MemoryBudget>,
        registered: Arc<AtomicBool>,
    ) -> (WorkerOps, Arc<RpcMetrics>) {
        let mut registry = Registry::default();
        let rpc = RpcMetrics::register(&mut registry);
        state.stats.time_pipelines();
        registry.register_collector(Box::new(WorkerCollector { state, memory }));
        (
            WorkerOps {
                registry,
                registered,
            },
            rpc,
        )
    }
}

impl OpsNode for WorkerOps {
    fn registry(&self) -> &Registry {
        &self.registry
    }

    fn refresh(&self) -> BoxFuture<'_, ()> {
        // Everything is read by the collector as it encodes.
        Box::pin(async {})
    }

    fn readiness(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            match self.registered.load(Ordering::Relaxed) {
                true => Ok(()),
                false => Err("not registered with the dispatcher yet".into()),
            }
        })
    }
}

struct WorkerCollector {
    state: Arc<WorkerState>,
    memory: Arc<MemoryBudget>,
}

impl std::fmt::Debug for WorkerCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerCollector")
            .field("worker", &self.state.address)
            .finish()
    }
}

fn counter<V>(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: V) -> std::fmt::Result
where
    ConstCounter<V>: EncodeMetric,
{
    let metric = ConstCounter::new(value);
    let descriptor = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(descriptor)
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: i64) -> std::fmt::Result {
    let metric = ConstGauge::new(value);
    let descriptor = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(descriptor)
}

impl Collector for WorkerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let state = &self.state;
        let stats = &state.stats;
        let task_ids = state.task_ids();
        let (mut elements, mut bytes) = (0usize, 0usize);
        for id in &task_ids {
            if let Some(buffer) = state.get(*id).and_then(|task| task.started_buffer()) {
                let (e, b) = buffer.sealed_fill();
                elements += e;
                bytes += b;
            }
        }
        let e = &mut encoder;
        gauge(
            e,
            "sluice_worker_tasks",
            "Tasks this worker holds",
            task_ids.len() as i64,
        )?;
        gauge(
            e,
            "sluice_worker_buffered_elements",
            "Elements ready in the tasks' buffers, summed over tasks",
            elements as i64,
        )?;
        gauge(
            e,
            "sluice_worker_buffered_bytes",
            "Bytes ready in the tasks' buffers, summed over tasks",
            bytes as i64,
        )?;
        gauge(
            e,
            "sluice_worker_memory_budget_used_bytes",
            "Bytes the tasks' buffers hold against the memory budget (--memory-budget)",
            i64::try_from(self.memory.used()).unwrap_or(i64::MAX),
        )?;
        counter(
            e,
            "sluice_worker_elements_served",
            "Elements sent to readers (a resend after a reconnect counts again)",
            stats.elements_served(),
        )?;
        counter(
            e,
            "sluice_worker_bytes_served",
            "Bytes of element payload sent to readers",
            stats.bytes_served(),
        )?;
        counter(
            e,
            "sluice_worker_shared_memory_bytes",
            "Bytes of element payload handed to readers on this machine through shared memory \
             (counted in sluice_worker_bytes_served too)",
            stats.shared_memory_bytes(),
        )?;
        counter(
            e,
            "sluice_worker_pipeline_seconds",
            "Time the tasks' pipelines spent producing elements",
            stats.pipeline_time().as_secs_f64(),
        )?;
        counter(
            e,
            "sluice_worker_elements_produced",
            "Elements the tasks' pipelines produced",
            stats.elements_produced(),
        )?;
        Ok(())
    }
}

//! `WorkerStats`: the worker's running totals that only the data path can count (elements and
//! bytes sent to readers, time spent in pipelines), as plain atomics so the data path pays one
//! relaxed add per message. `worker_ops` reads them when `/metrics` is scraped.
//!
//! Pipeline time is measured only while `timed` is set (a metrics listener is open), and
//! sampled (`PipelineClock`): a worker without metrics pays no clock reads at all.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Elements a pipeline thread counts before adding its count and time to the totals.
const PIPELINE_FLUSH_EVERY: u64 = 4096;
/// One element in this many is timed (see `PipelineClock`).
const SAMPLE_EVERY: u64 = 64;

#[derive(Debug, Default)]
pub struct WorkerStats {
    elements_served: AtomicU64,
    bytes_served: AtomicU64,
    shared_memory_bytes: AtomicU64,
    pipeline_nanos: AtomicU64,
    elements_produced: AtomicU64,
    timed: AtomicBool,
}

impl WorkerStats {
    /// One message of `elements` (`bytes` of payload) sent to a reader.
    pub fn record_served(&self, elements: u64, bytes: u64) {
        self.elements_served.fetch_add(elements, Ordering::Relaxed);
        self.bytes_served.fetch_add(bytes, Ordering::Relaxed);
    }

    /// `bytes` of payload handed to a reader on this machine through shared memory.
    pub fn record_shared(&self, bytes: u64) {
        self.shared_memory_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn shared_memory_bytes(&self) -> u64 {
        self.shared_memory_bytes.load(Ordering::Relaxed)
    }

    /// Turns pipeline timing on (a metrics listener is open).
    pub fn time_pipelines(&self) {
        self.timed.store(true, Ordering::Relaxed);
    }

    pub fn elements_served(&self) -> u64 {
        self.elements_served.load(Ordering::Relaxed)
    }

    pub fn bytes_served(&self) -> u64 {
        self.bytes_served.load(Ordering::Relaxed)
    }

    /// Time pipelines spent producing elements, summed over tasks.
    pub fn pipeline_time(&self) -> Duration {
        Duration::from_nanos(self.pipeline_nanos.load(Ordering::Relaxed))
    }

    /// Elements pipelines produced (while timing was on).
    pub fn elements_produced(&self) -> u64 {
        self.elements_produced.load(Ordering::Relaxed)
    }

    /// A clock for one pipeline thread; `None` while timing is off.
    pub fn pipeline_clock(&self) -> Option<PipelineClock<'_>> {
        self.timed.load(Ordering::Relaxed).then_some(PipelineClock {
            stats: self,
            nanos: 0,
            elements: 0,
        })
    }
}

/// One pipeline thread's share, added to the totals every few thousand elements and at its end.
/// Time is sampled: one element in `SAMPLE_EVERY` is timed and counts for all of them, so a
/// pipeline of tiny elements pays a clock read per many elements, not two per element.
pub struct PipelineClock<'a> {
    stats: &'a WorkerStats,
    nanos: u64,
    elements: u64,
}

impl PipelineClock<'_> {
    /// Counts one element about to be produced; whether to time it.
    pub fn due(&mut self) -> bool {
        self.elements += 1;
        if self.elements >= PIPELINE_FLUSH_EVERY {
            self.flush();
        }
        self.elements % SAMPLE_EVERY == 1
    }

    /// A timed element took `elapsed` to produce.
    pub fn add(&mut self, elapsed: Duration) {
        self.nanos += elapsed.as_nanos() as u64 * SAMPLE_EVERY;
    }

    fn flush(&mut self) {
        self.stats
            .pipeline_nanos
            .fetch_add(self.nanos, Ordering::Relaxed);
        self.stats
            .elements_produced
            .fetch_add(self.elements, Ordering::Relaxed);
        self.nanos = 0;
        self.elements = 0;
    }
}

impl Drop for PipelineClock<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipeline_time_is_sampled_and_counted_for_every_element_once_timing_is_on() {
        let stats = WorkerStats::default();
        assert!(
            stats.pipeline_clock().is_none(),
            "off until a metrics listener opens"
        );
        stats.time_pipelines();
        {
            let mut clock = stats.pipeline_clock().expect("timing is on");
            let timed = (0..640).filter(|_| clock.due()).count();
            assert_eq!(timed, 10, "one element in {SAMPLE_EVERY}");
            for _ in 0..timed {
                clock.add(Duration::from_micros(1));
            }
        }
        assert_eq!(stats.elements_produced(), 640);
        assert_eq!(stats.pipeline_time(), Duration::from_micros(640));
        stats.record_served(3, 30);
        assert_eq!((stats.elements_served(), stats.bytes_served()), (3, 30));
    }
}

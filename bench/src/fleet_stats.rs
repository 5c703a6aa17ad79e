//! `FleetStats`: what the simulated workers and clients of the scale workload record, shared by
//! all of them.
//!
//! A heartbeat is a long poll, so its wall time is mostly the wait the caller asked for. Its
//! latency is what came on top: the whole call for a heartbeat that may not wait (poll 0, each
//! client's first), and the time past the poll for one that waited it out with nothing new
//! (the dispatcher started the poll's clock when the request reached it, so queueing before the
//! handler, the linearizable read beyond the poll and the reply count). A reply that brought
//! news before the poll ended says nothing about latency (the wait for news is not the
//! service's cost) and is only counted. Latencies are kept only inside the measured window,
//! each with the second of the window it was taken in (a p99 over the window cannot tell a
//! steady tail from a few bad seconds; the p99 of each second can); errors are counted from
//! the start.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Which kind of caller a heartbeat came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Caller {
    Worker,
    Client,
}

/// One heartbeat's latency, and the second of the window it ended in.
#[derive(Clone, Copy)]
struct Sample {
    second: u32,
    ms: f64,
}

#[derive(Default)]
pub(crate) struct FleetStats {
    measuring: AtomicBool,
    /// When the window opened (one window per run).
    opened: OnceLock<Instant>,
    /// Latencies; std mutexes: a push, never held across `.await`.
    worker_ms: Mutex<Vec<Sample>>,
    client_ms: Mutex<Vec<Sample>>,
    /// Leases from asked for to answered, in ms.
    lease_ms: Mutex<Vec<f64>>,
    /// Tasks' waits for their next lease once theirs was used up, in ms.
    task_wait_ms: Mutex<Vec<f64>>,
    /// Heartbeats answered early with news (not latencies).
    news: AtomicU64,
    leases: AtomicU64,
    splits: AtomicU64,
    tasks_finished: AtomicU64,
    errors: AtomicU64,
    /// The first error seen, for the report.
    first_error: Mutex<Option<String>>,
    /// Tasks whose lease loop runs now (not finished, failed or deleted yet).
    pub(crate) working_tasks: AtomicI64,
    /// Setup progress: workers and clients that got a first heartbeat reply.
    pub(crate) workers_up: AtomicU64,
    pub(crate) clients_up: AtomicU64,
}

impl FleetStats {
    /// Starts or ends the measured window.
    pub(crate) fn set_measuring(&self, on: bool) {
        if on {
            let _ = self.opened.set(Instant::now());
        }
        self.measuring.store(on, Ordering::SeqCst);
    }

    fn measuring(&self) -> bool {
        self.measuring.load(Ordering::Relaxed)
    }

    /// Records one heartbeat sent at `started` with `poll` allowed, and whether it brought
    /// news. Only heartbeats sent inside the window count: a long poll sent before it opened
    /// waited, in part, through the setup.
    pub(crate) fn heartbeat(&self, caller: Caller, started: Instant, poll: Duration, news: bool) {
        let Some(opened) = self.opened.get().filter(|_| self.measuring()) else {
            return;
        };
        if started < *opened {
            return;
        }
        let elapsed = started.elapsed();
        let latency = if poll.is_zero() {
            elapsed
        } else if news {
            self.news.fetch_add(1, Ordering::Relaxed);
            return;
        } else {
            elapsed.saturating_sub(poll)
        };
        let ms = latency.as_secs_f64() * 1000.0;
        let second = opened.elapsed().as_secs() as u32;
        let list = match caller {
            Caller::Worker => &self.worker_ms,
            Caller::Client => &self.client_ms,
        };
        list.lock()
            .expect("latency lock poisoned")
            .push(Sample { second, ms });
    }

    /// Records one lease of `splits` splits.
    pub(crate) fn lease(&self, splits: u64) {
        if self.measuring() {
            self.leases.fetch_add(1, Ordering::Relaxed);
            self.splits.fetch_add(splits, Ordering::Relaxed);
        }
    }

    /// Records a lease answered `elapsed` after it was asked for (its slack included).
    pub(crate) fn lease_answered(&self, elapsed: Duration) {
        if self.measuring() {
            push_ms(&self.lease_ms, elapsed);
        }
    }

    /// Records how long a task that had used up its lease waited for the next one (zero when
    /// the lease asked for ahead had arrived).
    pub(crate) fn task_waited(&self, waited: Duration) {
        if self.measuring() {
            push_ms(&self.task_wait_ms, waited);
        }
    }

    /// The leases' times from asked for to answered, sorted.
    pub(crate) fn lease_latencies(&self) -> Vec<f64> {
        sorted(self.lease_ms.lock().expect("latency lock poisoned").clone())
    }

    /// The tasks' waits for their next lease, sorted.
    pub(crate) fn task_waits(&self) -> Vec<f64> {
        sorted(
            self.task_wait_ms
                .lock()
                .expect("latency lock poisoned")
                .clone(),
        )
    }

    pub(crate) fn task_finished(&self) {
        self.tasks_finished.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failed RPC (whatever its code) and keeps the first message.
    pub(crate) fn error(&self, what: &str, error: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_error.lock().expect("error lock poisoned");
        if first.is_none() {
            *first = Some(format!("{what}: {error}"));
        }
    }

    pub(crate) fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    pub(crate) fn first_error(&self) -> Option<String> {
        self.first_error
            .lock()
            .expect("error lock poisoned")
            .clone()
    }

    pub(crate) fn leases(&self) -> u64 {
        self.leases.load(Ordering::Relaxed)
    }

    pub(crate) fn splits(&self) -> u64 {
        self.splits.load(Ordering::Relaxed)
    }

    pub(crate) fn tasks_finished_count(&self) -> u64 {
        self.tasks_finished.load(Ordering::Relaxed)
    }

    pub(crate) fn news(&self) -> u64 {
        self.news.load(Ordering::Relaxed)
    }

    /// The latencies of one kind of caller, or of both (`None`), sorted.
    pub(crate) fn latencies(&self, caller: Option<Caller>) -> Vec<f64> {
        sorted(self.samples(caller).iter().map(|s| s.ms).collect())
    }

    /// The p99 of every heartbeat latency of each second of the window, in the order of the
    /// seconds (a second without any is left out).
    pub(crate) fn p99_per_second(&self) -> Vec<f64> {
        let mut seconds: Vec<Vec<f64>> = Vec::new();
        for sample in self.samples(None) {
            let second = sample.second as usize;
            if seconds.len() <= second {
                seconds.resize_with(second + 1, Vec::new);
            }
            seconds[second].push(sample.ms);
        }
        seconds
            .into_iter()
            .filter(|latencies| !latencies.is_empty())
            .map(|latencies| quantile(&sorted(latencies), 0.99))
            .collect()
    }

    fn samples(&self, caller: Option<Caller>) -> Vec<Sample> {
        let mut all = Vec::new();
        if caller != Some(Caller::Client) {
            all.extend(self.worker_ms.lock().expect("latency lock poisoned").iter());
        }
        if caller != Some(Caller::Worker) {
            all.extend(self.client_ms.lock().expect("latency lock poisoned").iter());
        }
        all
    }
}

/// `values` in ascending order, as [`quantile`] takes them.
pub(crate) fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(|a, b| a.total_cmp(b));
    values
}

/// The `q` quantile (0..=1) of sorted values; 0 when there are none.
pub(crate) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn push_ms(list: &Mutex<Vec<f64>>, elapsed: Duration) {
    list.lock()
        .expect("latency lock poisoned")
        .push(elapsed.as_secs_f64() * 1000.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_second_has_its_own_p99_and_empty_seconds_are_left_out() {
        let stats = FleetStats::default();
        let push = |list: &Mutex<Vec<Sample>>, second: u32, ms: f64| {
            list.lock().unwrap().push(Sample { second, ms });
        };
        // Second 0: 100 fast heartbeats and one slow one (its p99 is the 99th of 101).
        for _ in 0..100 {
            push(&stats.worker_ms, 0, 5.0);
        }
        push(&stats.client_ms, 0, 900.0);
        // Second 1: none. Second 2: workers and clients together.
        push(&stats.worker_ms, 2, 40.0);
        push(&stats.client_ms, 2, 250.0);
        assert_eq!(stats.p99_per_second(), vec![5.0, 250.0]);
        assert_eq!(stats.latencies(Some(Caller::Client)), vec![250.0, 900.0]);
    }
}

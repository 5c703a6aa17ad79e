//! Waiting on a condition with a deadline, the one way Sluice's tests wait: never a fixed sleep,
//! and never a deadline that a working system could miss on a loaded machine (a deadline is
//! there to end a hang, not to time anything).
//!
//! - [`wait_until`]: async; the condition is a closure returning `bool` or a future of one.
//! - [`wait_until_blocking`]: the same on the calling thread, for synchronous tests.
//!
//! Both poll the condition, pausing between checks [`POLL`] or as long as the last check took,
//! whichever is longer (a check that runs a program or asks a server then takes at most half
//! of a busy machine's time), and return [`TimedOut`] (which names the condition and the
//! timeout) when `timeout` passes first. The condition is checked once more at the deadline,
//! so a slow poll never fails a condition that holds.

use std::fmt;
use std::future::{ready, Future, Ready};
use std::time::{Duration, Instant};

/// The bound a test puts on anything that, working, takes milliseconds to a few seconds even on a
/// loaded machine (a failover, a poll cut short, a cancelled pipeline stopping): only a hang
/// crosses it. How long such things take is a benchmark's figure (`sluice bench`), never a
/// test's.
pub const HANG: Duration = Duration::from_secs(20);

/// The pause between two checks of a condition.
pub const POLL: Duration = Duration::from_millis(5);

/// A wait whose condition did not hold within its timeout.
#[derive(Clone, PartialEq, Eq)]
pub struct TimedOut {
    /// What was waited for.
    pub what: String,
    pub timeout: Duration,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "timed out after {:?} waiting for {}",
            self.timeout, self.what
        )
    }
}

// As the message, so that `.unwrap()` and `.expect()` print it readably.
impl fmt::Debug for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for TimedOut {}

/// Marks a condition that answers at once (a closure returning `bool`).
pub enum Now {}
/// Marks a condition that answers with a future (a closure returning `impl Future<Output =
/// bool>`, e.g. `|| async { ... }`).
pub enum Later {}

/// A condition [`wait_until`] can poll: `FnMut() -> bool` or `FnMut() -> impl Future<Output =
/// bool>`. `M` ([`Now`] or [`Later`]) only keeps the two apart; it is inferred.
pub trait Condition<M> {
    type Check: Future<Output = bool>;
    fn check(&mut self) -> Self::Check;
}

impl<F: FnMut() -> bool> Condition<Now> for F {
    type Check = Ready<bool>;
    fn check(&mut self) -> Ready<bool> {
        ready(self())
    }
}

impl<F, Fut> Condition<Later> for F
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    type Check = Fut;
    fn check(&mut self) -> Fut {
        self()
    }
}

/// Waits until `condition` holds, checking it every [`POLL`] (on tokio's clock); fails naming
/// `what` and `timeout` once `timeout` has passed and a last check still fails.
pub async fn wait_until<M>(
    what: &str,
    timeout: Duration,
    mut condition: impl Condition<M>,
) -> Result<(), TimedOut> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let checked = tokio::time::Instant::now();
        let late = checked >= deadline;
        if condition.check().await {
            return Ok(());
        }
        if late {
            return Err(TimedOut {
                what: what.to_string(),
                timeout,
            });
        }
        let pause = POLL.max(checked.elapsed());
        tokio::time::sleep(
            pause.min(deadline.saturating_duration_since(tokio::time::Instant::now())),
        )
        .await;
    }
}

/// Waits on this thread until `condition` holds, checking it every [`POLL`]; fails naming `what`
/// and `timeout` once `timeout` has passed and a last check still fails.
pub fn wait_until_blocking(
    what: &str,
    timeout: Duration,
    mut condition: impl FnMut() -> bool,
) -> Result<(), TimedOut> {
    let deadline = Instant::now() + timeout;
    loop {
        let checked = Instant::now();
        let late = checked >= deadline;
        if condition() {
            return Ok(());
        }
        if late {
            return Err(TimedOut {
                what: what.to_string(),
                timeout,
            });
        }
        let pause = POLL.max(checked.elapsed());
        std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn a_condition_that_comes_to_hold_ends_the_wait() {
        let checks = AtomicU32::new(0);
        let now = || checks.fetch_add(1, Ordering::Relaxed) >= 3;
        wait_until("three checks", Duration::from_secs(60), now)
            .await
            .unwrap();
        let later = || async { checks.fetch_add(1, Ordering::Relaxed) >= 6 };
        wait_until("six checks", Duration::from_secs(60), later)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_condition_that_never_holds_fails_naming_it_and_the_timeout() {
        let err = wait_until("never", Duration::from_millis(30), || false)
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "timed out after 30ms waiting for never");
        assert_eq!(format!("{err:?}"), err.to_string());
    }

    #[test]
    fn blocking_waits_end_when_the_condition_holds_or_fail_naming_it() {
        let mut checks = 0;
        wait_until_blocking("three checks", Duration::from_secs(60), || {
            checks += 1;
            checks >= 3
        })
        .unwrap();
        assert_eq!(checks, 3);
        let err = wait_until_blocking("never", Duration::from_millis(20), || false).unwrap_err();
        assert_eq!(err.to_string(), "timed out after 20ms waiting for never");
    }
}

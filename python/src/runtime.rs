//! The module's one tokio runtime, and `wait`: run a future on it with the GIL released,
//! waking every `SIGNAL_CHECK` to let Python handle signals (Ctrl-C raises `KeyboardInterrupt`
//! in the waiting thread, and the future is cancelled); `wait_borrowed` the same for a future
//! that borrows its caller's state.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::runtime::Runtime;

/// How often a waiting call returns to Python to check for signals.
pub const SIGNAL_CHECK: Duration = Duration::from_millis(50);

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

pub fn runtime() -> &'static Runtime {
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("sluice-runtime")
            .build()
            .expect("the tokio runtime starts")
    })
}

/// Awaits `future` on the runtime without holding the GIL; a signal handler that raises (Ctrl-C)
/// cancels the future and returns its exception.
pub fn wait<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let rt = runtime();
    let mut task = rt.spawn(future);
    loop {
        let done = py
            .detach(|| rt.block_on(async { tokio::time::timeout(SIGNAL_CHECK, &mut task).await }));
        match done {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => return Err(PyRuntimeError::new_err(format!("sluice task failed: {e}"))),
            Err(_elapsed) => {
                if let Err(e) = py.check_signals() {
                    task.abort();
                    return Err(e);
                }
            }
        }
    }
}

/// The value of `$next`, a cancel-safe future that borrows the caller's state (so it cannot be
/// spawned, as `wait` does): polled once at once, so a value already there costs no wait and no
/// release of the GIL; otherwise awaited without the GIL in slices of `SIGNAL_CHECK`, `$next`
/// made anew for each, checking for signals between them. A macro: a closure cannot return a
/// future that borrows what it captured.
macro_rules! wait_borrowed {
    ($py:expr, $next:expr) => {{
        use futures::FutureExt as _;
        match $next.now_or_never() {
            Some(ready) => Ok(ready),
            None => {
                let rt = $crate::runtime::runtime();
                loop {
                    // The timer is made inside the runtime (`timeout` needs its clock).
                    let waited = $py.detach(|| {
                        rt.block_on(async {
                            tokio::time::timeout($crate::runtime::SIGNAL_CHECK, $next).await
                        })
                    });
                    match waited {
                        Ok(value) => break Ok(value),
                        Err(_elapsed) => {
                            if let Err(e) = $py.check_signals() {
                                break Err(e);
                            }
                        }
                    }
                }
            }
        }
    }};
}
pub(crate) use wait_borrowed;

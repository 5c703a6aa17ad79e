//! Waiting on a condition with a deadline. Polls with a short pause; fails with the condition's
//! description when the deadline passes.

use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

pub async fn wait_until<F, Fut>(
    what: &str,
    timeout: Duration,
    mut condition: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if condition().await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

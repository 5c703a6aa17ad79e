//! `DispatcherClient`: calls the dispatcher quorum, following the leader.
//!
//! Every call goes to the replica believed to be the leader. A replica that is not the leader
//! answers `Unavailable` with the leader's address in `x-sluice-leader`; the client switches to
//! it at once. Without a hint (no leader yet, connection refused, timeout) it tries the next
//! address after an exponential backoff, until `retry_timeout` has passed. One `Channel` per
//! address, built once and cloned; every attempt has a deadline.
//!
//! Mutating calls carry a `RequestId` (this client's random requester id, a sequence number and
//! the watermark, see `request_ids`) that stays the same across retries of one call, so a retry
//! after a lost reply returns the outcome the dispatcher recorded instead of acting twice.
//!
//! The generic retry loop (`call`) is private to this crate: callers use the typed methods in
//! `dispatcher_rpcs`, one per dispatcher RPC, which fill in request ids and deadlines.

use crate::error::{is_retryable_status, RpcError};
use crate::request_ids::{InFlight, RequestIds};
use sluice_proto::dispatcher::dispatcher_client::DispatcherClient as RpcClient;
use sluice_proto::LEADER_METADATA_KEY;
use sluice_security::{AuthChannel, ClientSecurity};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tonic::transport::Channel;
use tracing::{debug, warn};

/// How calls are retried.
#[derive(Clone, Debug)]
pub struct RetryConfig {
    /// Deadline of one attempt (a long poll adds its own wait on top).
    pub rpc_timeout: Duration,
    /// First backoff; doubles per failed attempt up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Give up after this long without success.
    pub retry_timeout: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            rpc_timeout: Duration::from_secs(5),
            initial_backoff: Duration::from_millis(5),
            // Short: after a failover the new leader is found within one backoff of its election.
            max_backoff: Duration::from_millis(100),
            retry_timeout: Duration::from_secs(3600),
        }
    }
}

/// A clone-able client of the dispatcher quorum.
#[derive(Clone)]
pub struct DispatcherClient {
    inner: Arc<Inner>,
}

struct Inner {
    addrs: Vec<String>,
    retry: RetryConfig,
    request_ids: Arc<RequestIds>,
    /// TLS and the token every call presents.
    security: ClientSecurity,
    /// Std mutexes: held only to read or update, never across `.await`. Shared with the
    /// clients made by [`DispatcherClient::sharing_connections`].
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// The address to try first: the last known leader.
    current: Mutex<String>,
}

/// The `host:port` of one `[protocol://]host:port` entry; only gRPC (`grpc`, `http`) is spoken.
fn service_address(entry: &str) -> Result<String, RpcError> {
    let parts: Vec<&str> = entry.split("://").collect();
    match parts.as_slice() {
        [address] => Ok(address.to_string()),
        ["grpc" | "http", address] => Ok(address.to_string()),
        [protocol, _] => Err(RpcError::NotFound(format!(
            "No credentials factory has been registered for protocol {protocol}"
        ))),
        _ => Err(RpcError::InvalidArgument(format!(
            "Malformed `service` string has multiple '://': {entry}."
        ))),
    }
}

impl DispatcherClient {
    /// A client of the replicas at `addrs` (`host:port`, comma-separated lists accepted).
    pub fn new(addrs: &str) -> Result<DispatcherClient, RpcError> {
        Self::with_retry(addrs, RetryConfig::default())
    }

    pub fn with_retry(addrs: &str, retry: RetryConfig) -> Result<DispatcherClient, RpcError> {
        Self::connect(addrs, retry, ClientSecurity::default())
    }

    /// A client presenting `security` (TLS settings and token) on every call.
    pub fn connect(
        addrs: &str,
        retry: RetryConfig,
        security: ClientSecurity,
    ) -> Result<DispatcherClient, RpcError> {
        // tf.data's `service` argument: `[protocol://]address`, the protocol `grpc` by default.
        if addrs.trim().is_empty() {
            return Err(RpcError::InvalidArgument(
                "`service` must not be empty".into(),
            ));
        }
        let addrs: Vec<String> = addrs
            .split(',')
            .map(|a| service_address(a.trim()))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .filter(|a| !a.is_empty())
            .collect();
        if addrs.is_empty() {
            return Err(RpcError::InvalidArgument(
                "`service` must not be empty".into(),
            ));
        }
        for addr in &addrs {
            if addr
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse::<u16>().ok())
                .is_none()
            {
                return Err(RpcError::InvalidArgument(format!(
                    "invalid dispatcher address '{addr}': expected HOST:PORT"
                )));
            }
        }
        Ok(DispatcherClient {
            inner: Arc::new(Inner {
                current: Mutex::new(addrs[0].clone()),
                addrs,
                retry,
                request_ids: RequestIds::new(rand::random()),
                security,
                channels: Arc::new(Mutex::new(HashMap::new())),
            }),
        })
    }

    /// A client of the same replicas over this one's connections, with a requester id (and
    /// request sequence) of its own, as a caller in another process would have. For harnesses that simulate many
    /// callers in one process without opening a connection per caller.
    pub fn sharing_connections(&self) -> DispatcherClient {
        let inner = &self.inner;
        DispatcherClient {
            inner: Arc::new(Inner {
                current: Mutex::new(self.current()),
                addrs: inner.addrs.clone(),
                retry: inner.retry.clone(),
                request_ids: RequestIds::new(rand::random()),
                security: inner.security.clone(),
                channels: inner.channels.clone(),
            }),
        }
    }

    /// The addresses this client was given.
    pub fn addrs(&self) -> &[String] {
        &self.inner.addrs
    }

    /// What this client presents; readers present the same to workers.
    pub fn security(&self) -> &ClientSecurity {
        &self.inner.security
    }

    /// A fresh id for one mutating call; reuse it for every retry of that call, and keep the
    /// guard until the call is over.
    pub(crate) fn begin_request(&self) -> InFlight {
        self.inner.request_ids.begin()
    }

    fn channel(&self, addr: &str) -> Result<Channel, RpcError> {
        let mut channels = self
            .inner
            .channels
            .lock()
            .expect("channel map lock poisoned");
        if let Some(channel) = channels.get(addr) {
            return Ok(channel.clone());
        }
        let channel = self
            .inner
            .security
            .endpoint(addr)
            .map_err(|e| RpcError::InvalidArgument(format!("dispatcher address '{addr}': {e}")))?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .connect_lazy();
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    fn current(&self) -> String {
        self.inner
            .current
            .lock()
            .expect("leader lock poisoned")
            .clone()
    }

    fn set_current(&self, addr: String) {
        *self.inner.current.lock().expect("leader lock poisoned") = addr;
    }

    fn rotate(&self, from: &str) {
        let addrs = &self.inner.addrs;
        let next = match addrs.iter().position(|a| a == from) {
            Some(i) => addrs[(i + 1) % addrs.len()].clone(),
            None => addrs[0].clone(),
        };
        self.set_current(next);
    }

    /// Calls `rpc` on the leader, retrying retryable failures until the retry deadline.
    /// `extra_timeout` extends the per-attempt deadline (long polls).
    pub(crate) async fn call<T, F, Fut>(
        &self,
        name: &str,
        extra_timeout: Duration,
        mut rpc: F,
    ) -> Result<T, RpcError>
    where
        F: FnMut(RpcClient<AuthChannel>, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let retry = &self.inner.retry;
        let deadline = Instant::now() + retry.retry_timeout;
        let mut backoff = retry.initial_backoff;
        let mut attempts = 0u32;
        let mut hints_in_a_row = 0u32;
        loop {
            attempts += 1;
            let addr = self.current();
            let timeout = retry.rpc_timeout + extra_timeout;
            let client = RpcClient::new(self.inner.security.authed(self.channel(&addr)?))
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX);
            let status = match tokio::time::timeout(timeout, rpc(client, timeout)).await {
                Ok(Ok(response)) => return Ok(response.into_inner()),
                Ok(Err(status)) => status,
                Err(_) => {
                    tonic::Status::deadline_exceeded(format!("{name} timed out after {timeout:?}"))
                }
            };
            if !is_retryable_status(&status) {
                return Err(RpcError::from_status(&status));
            }
            let hint = status
                .metadata()
                .get(LEADER_METADATA_KEY)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
                .filter(|leader| *leader != addr);
            if Instant::now() + backoff > deadline {
                return Err(RpcError::Unavailable {
                    attempts,
                    message: status.message().to_string(),
                });
            }
            match hint {
                Some(leader) => {
                    debug!(rpc = name, from = %addr, to = %leader, "following the leader");
                    self.set_current(leader);
                    // A fresh hint deserves an immediate try, but stale hints during an
                    // election must not make a busy loop.
                    hints_in_a_row += 1;
                    if hints_in_a_row <= 2 {
                        continue;
                    }
                }
                None => {
                    if attempts.is_multiple_of(20) {
                        warn!(rpc = name, %addr, attempts, error = %status.message(), "dispatcher not answering; retrying");
                    }
                    self.rotate(&addr);
                }
            }
            hints_in_a_row = 0;
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(retry.max_backoff);
        }
    }
}

#[cfg(test)]
#[path = "dispatcher_client_tests.rs"]
mod tests;

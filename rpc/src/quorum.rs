//! `Quorum`: the replicas a `DispatcherClient` calls, and how a call reaches the leader.
//!
//! Every call goes to the replica believed to be the leader. A replica that is not the leader
//! answers `Unavailable` with the leader's address in `x-sluice-leader`; the call switches to
//! it at once. Without a hint (no leader yet, connection refused, timeout) it tries the next
//! address after an exponential backoff, until `retry_timeout` has passed. One `Channel` per
//! address, built once and cloned; every attempt has a deadline.
//!
//! A caller never waits on one replica much longer than the quorum takes to elect another
//! (`RetryConfig::election_timeout`): a leader that is frozen or cut off still accepts
//! connections and answers nothing, so waiting for its answer would last as long as the fault.
//! - Hedging: every replica tells this client who it believes leads, at once and at every change
//!   (`LeaderView`, fed by one `WatchLeader` stream per replica, silent while nothing changes).
//!   An attempt waiting on a replica other than the newest leader named is abandoned and the
//!   call sent to that leader, with the same request id; a long poll is abandoned the same way.
//!   So a caller moves on as soon as the other replicas have elected a new leader.
//! - Deadlines: an attempt of a small call the dispatcher answers at once ends after twice the
//!   election timeout (doubling after each attempt that timed out), unless the replicas name
//!   its replica the leader (or name none yet): then there is nowhere better to send it, and a
//!   slow but live leader gets up to `rpc_timeout` (re-sending to it would only add load). A
//!   long poll adds its wait.
//! - HTTP/2 keepalive pings while a call is in flight, so a connection that went silent is
//!   noticed and closed (its calls then fail and are retried) within one and a half election
//!   timeouts.
//!
//! The retry loop (`call`) is private to this crate: callers use `DispatcherClient`'s typed
//! methods, one per dispatcher RPC, which fill in request ids and deadlines.

use crate::error::{is_retryable_status, RpcError};
use crate::leader_view::LeaderView;
use crate::leader_watcher;
use sluice_proto::dispatcher::dispatcher_client::DispatcherClient as RpcClient;
use sluice_proto::LEADER_METADATA_KEY;
use sluice_security::{AuthChannel, ClientSecurity, ServerRole};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, warn};

/// How calls are retried.
#[derive(Clone, Debug)]
pub struct RetryConfig {
    /// The quorum's election timeout (the upper bound of its range): how long the replicas take
    /// to notice a silent leader and elect another. Hedging, attempt deadlines and keepalive
    /// pings derive from it.
    pub election_timeout: Duration,
    /// The longest deadline of one attempt (a long poll adds its own wait on top).
    pub rpc_timeout: Duration,
    /// First backoff; doubles per failed attempt up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Give up after this long without success.
    pub retry_timeout: Duration,
    /// Whether this client hears from every replica who leads and moves a waiting call to a
    /// newer leader at once (hedging; on by default). Off, a call waits on its replica until
    /// its deadline: only for tests of what a caller slower to move on sees.
    pub follow_newer_leaders: bool,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            // The dispatcher's default election timeout range is 200-400 ms.
            election_timeout: Duration::from_millis(400),
            rpc_timeout: Duration::from_secs(5),
            initial_backoff: Duration::from_millis(5),
            // Short: after a failover the new leader is found within one backoff of its election.
            max_backoff: Duration::from_millis(100),
            retry_timeout: Duration::from_secs(3600),
            follow_newer_leaders: true,
        }
    }
}

impl RetryConfig {
    /// The deadline of an attempt after `timeouts` attempts in a row timed out.
    fn attempt_timeout(&self, timeouts: u32) -> Duration {
        (self.election_timeout * 2)
            .saturating_mul(1 << timeouts.min(16))
            .min(self.rpc_timeout)
    }

    /// HTTP/2 keepalive: a ping after this long without a frame from the replica...
    fn keepalive_interval(&self) -> Duration {
        self.election_timeout / 2
    }

    /// ...and the connection is closed when the ping is not answered within this long. Not
    /// shorter: a live replica busy with a large request on a loaded machine must not lose its
    /// connections.
    fn keepalive_timeout(&self) -> Duration {
        self.election_timeout
    }
}

/// How long the dispatcher may take to answer a call, which sets its attempts' deadlines.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Wait {
    /// A live leader answers at once (writes, current reads): deadlines from the election
    /// timeout.
    Brief,
    /// The dispatcher may hold the call this long (long polls, membership changes).
    Poll(Duration),
    /// The request or its reply may be large (a definition of up to 16 MiB, the status of a
    /// large state): `rpc_timeout`, since sending it again sooner would only add load.
    Slow,
}

/// How one attempt ended.
enum Race<R> {
    Answered(R),
    /// Past its deadline, with no replica naming the one it waits on the leader.
    TimedOut,
    /// Another replica leads in a newer term than the one the attempt waits on.
    NewerLeader(String),
}

/// The replicas of one quorum, their connections, and who leads as far as this caller knows.
pub(crate) struct Quorum {
    addrs: Vec<String>,
    retry: RetryConfig,
    /// TLS and the token every call presents.
    security: ClientSecurity,
    /// Std mutexes: held only to read or update, never across `.await`. Shared with the
    /// quorums made by [`Quorum::sharing_connections`].
    pub(crate) channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// The address to try first: the last known leader.
    current: Mutex<String>,
    /// The newest leader the replicas named; shared like `channels`.
    leaders: Arc<LeaderView>,
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

impl Quorum {
    /// The replicas at `addrs` (`host:port`, comma-separated lists accepted), called presenting
    /// `security`.
    pub(crate) fn new(
        addrs: &str,
        retry: RetryConfig,
        security: ClientSecurity,
    ) -> Result<Quorum, RpcError> {
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
        Ok(Quorum {
            current: Mutex::new(addrs[0].clone()),
            addrs,
            retry,
            security,
            channels: Arc::new(Mutex::new(HashMap::new())),
            leaders: Arc::new(LeaderView::new()),
        })
    }

    /// The same replicas over this quorum's connections and leader view, starting from the
    /// leader it knows.
    pub(crate) fn sharing_connections(&self) -> Quorum {
        Quorum {
            current: Mutex::new(self.current()),
            addrs: self.addrs.clone(),
            retry: self.retry.clone(),
            security: self.security.clone(),
            channels: self.channels.clone(),
            leaders: self.leaders.clone(),
        }
    }

    pub(crate) fn addrs(&self) -> &[String] {
        &self.addrs
    }

    pub(crate) fn security(&self) -> &ClientSecurity {
        &self.security
    }

    fn channel(&self, addr: &str) -> Result<Channel, RpcError> {
        let mut channels = self.channels.lock().expect("channel map lock poisoned");
        if let Some(channel) = channels.get(addr) {
            return Ok(channel.clone());
        }
        let endpoint = replica_endpoint(&self.security, addr)?
            .http2_keep_alive_interval(self.retry.keepalive_interval())
            .keep_alive_timeout(self.retry.keepalive_timeout())
            .keep_alive_while_idle(false);
        let channel = self
            .security
            .connect_lazy(&endpoint, ServerRole::Dispatcher);
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    fn current(&self) -> String {
        self.current.lock().expect("leader lock poisoned").clone()
    }

    fn set_current(&self, addr: String) {
        *self.current.lock().expect("leader lock poisoned") = addr;
    }

    fn rotate(&self, from: &str) {
        let addrs = &self.addrs;
        let next = match addrs.iter().position(|a| a == from) {
            Some(i) => addrs[(i + 1) % addrs.len()].clone(),
            None => addrs[0].clone(),
        };
        self.set_current(next);
    }

    fn stub(&self, addr: &str) -> Result<RpcClient<AuthChannel>, RpcError> {
        Ok(RpcClient::new(self.security.authed(self.channel(addr)?))
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX))
    }

    /// Calls `rpc` on the leader, retrying retryable failures until the retry deadline; `wait`
    /// says how long the dispatcher may take to answer.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        name: &str,
        wait: Wait,
        mut rpc: F,
    ) -> Result<T, RpcError>
    where
        F: FnMut(RpcClient<AuthChannel>, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.watch_leaders();
        let retry = &self.retry;
        let deadline = Instant::now() + retry.retry_timeout;
        let mut backoff = retry.initial_backoff;
        let mut attempts = 0u32;
        let mut hints_in_a_row = 0u32;
        let mut timeouts_in_a_row = 0u32;
        // Replicas this caller cannot speak to as configured, and why (see below).
        let mut refused: HashMap<String, String> = HashMap::new();
        loop {
            attempts += 1;
            let addr = self.current();
            // The attempt's deadline, and how long it may be extended while the other replicas
            // name `addr` the leader (nowhere better to send it).
            let (timeout, cap) = match wait {
                Wait::Brief => {
                    let timeout = retry.attempt_timeout(timeouts_in_a_row);
                    (timeout, timeout.max(retry.rpc_timeout))
                }
                Wait::Poll(poll) => {
                    let timeout = retry.attempt_timeout(timeouts_in_a_row);
                    (timeout + poll, timeout.max(retry.rpc_timeout) + poll)
                }
                Wait::Slow => (retry.rpc_timeout, retry.rpc_timeout),
            };
            let started = Instant::now();
            let attempt = rpc(self.stub(&addr)?, cap);
            let race = self.race(&addr, started + timeout, started + cap, attempt);
            let status = match race.await {
                Race::Answered(Ok(response)) => return Ok(response.into_inner()),
                Race::Answered(Err(status)) => {
                    timeouts_in_a_row = 0;
                    status
                }
                Race::TimedOut => {
                    timeouts_in_a_row += 1;
                    let waited = started.elapsed();
                    tonic::Status::deadline_exceeded(format!("{name} timed out after {waited:?}"))
                }
                Race::NewerLeader(leader) => {
                    debug!(rpc = name, from = %addr, to = %leader, "a newer leader was named; sending there");
                    self.set_current(leader);
                    timeouts_in_a_row = 0;
                    if Instant::now() > deadline {
                        return Err(RpcError::Unavailable {
                            attempts,
                            message: format!("{name}: the retry deadline passed"),
                        });
                    }
                    continue;
                }
            };
            // Before the retry rule: a replica this caller cannot speak to as it is configured
            // (TLS on one side only, a certificate refused either way, a server of the wrong
            // role) is not retried. The others are tried at once; when every replica refused,
            // the call fails, naming why, instead of retrying until its deadline.
            let cause = sluice_security::permanent_failure(&status)
                .or_else(|| self.security.refusal(&addr));
            if let Some(why) = cause {
                refused.insert(addr.clone(), why);
                match self.addrs.iter().find(|a| !refused.contains_key(*a)) {
                    Some(next) => {
                        self.set_current(next.clone());
                        continue;
                    }
                    None => {
                        let why = &refused[&addr];
                        return Err(RpcError::FailedPrecondition(format!(
                            "cannot call the dispatcher at {addr}: {why}"
                        )));
                    }
                }
            }
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
                // The leader is a replica this caller cannot speak to: no retry will reach it.
                Some(leader) if refused.contains_key(&leader) => {
                    let why = &refused[&leader];
                    return Err(RpcError::FailedPrecondition(format!(
                        "cannot call the dispatcher at {leader}, the leader: {why}"
                    )));
                }
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

    /// Waits for `attempt` on `addr`; ends early when the view names a leader other than
    /// `addr` in a newer term. At `deadline` it gives `addr` up, unless the view names it the
    /// leader (or names none): then it waits on until `cap`.
    async fn race<R>(
        &self,
        addr: &str,
        mut deadline: Instant,
        cap: Instant,
        attempt: impl Future<Output = R>,
    ) -> Race<R> {
        let mut newest = self.leaders.subscribe();
        // A leader named before the attempt started counts too: the attempt may have been sent
        // to a stale `current`.
        newest.mark_changed();
        tokio::pin!(attempt);
        loop {
            tokio::select! {
                biased;
                answer = &mut attempt => return Race::Answered(answer),
                changed = newest.changed() => {
                    if changed.is_err() {
                        // The view lives as long as this client: never.
                        return Race::Answered(attempt.await);
                    }
                    let leader = newest.borrow_and_update().clone();
                    if let Some(leader) = leader.filter(|l| l.addr != addr) {
                        return Race::NewerLeader(leader.addr);
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    if deadline >= cap || !self.named_leader(addr) {
                        return Race::TimedOut;
                    }
                    deadline = cap;
                }
            }
        }
    }

    /// Whether the view names `addr` the leader, or names none (nothing better known), or
    /// there is no other replica.
    fn named_leader(&self, addr: &str) -> bool {
        self.addrs.len() == 1
            || self
                .leaders
                .newest()
                .is_none_or(|leader| leader.addr == addr)
    }

    /// Starts the view's streams on the first call (which runs inside a runtime).
    fn watch_leaders(&self) {
        if self.retry.follow_newer_leaders && self.addrs.len() > 1 && self.leaders.claim_watching()
        {
            leader_watcher::watch_every_replica(&self.leaders, &self.addrs, &self.security);
        }
    }
}

/// A replica's endpoint as every connection to the quorum dials it: TLS as `security` says, a
/// short connect timeout, no Nagle delay.
pub(crate) fn replica_endpoint(
    security: &ClientSecurity,
    addr: &str,
) -> Result<Endpoint, RpcError> {
    Ok(security
        .endpoint(addr)
        .map_err(|e| RpcError::InvalidArgument(format!("dispatcher address '{addr}': {e}")))?
        .connect_timeout(Duration::from_millis(500))
        .tcp_nodelay(true))
}

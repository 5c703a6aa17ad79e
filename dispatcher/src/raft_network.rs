//! Raft traffic to the other replicas' peer listeners (`NodeInfo::peer_addr`, never their client
//! API) over tonic: one lazily connected `Channel` per peer address, built once and cloned for
//! every replication stream, and a deadline on every call (openraft's `hard_ttl`), so a hung
//! peer can never block the Raft core. The replica's own `Announce` to the leader takes the same
//! channels, routes and cut links.
//!
//! Payloads are openraft's own request and response types in the journal codec; the remote
//! `Result` travels whole, so a remote Raft error reaches openraft as `RPCError::RemoteError`.
//!
//! Every replica assumes the others decode peer messages up to its own `max_payload_bytes`
//! (the same `--max-definition-size` on every replica gives the same bound). An append whose
//! encoding is larger is never sent: openraft hears `RPCError::PayloadTooLarge` with the number
//! of entries that fit, and sends the batch in parts. A peer that still refuses an append as too
//! large (it runs with a smaller bound) gets half the entries next time. One entry alone over
//! the bound cannot be split: that is a network error, which openraft retries after a backoff,
//! never in a busy loop. The limit is above the largest entry the proposer makes (one
//! definition of the largest size and a margin), so that stays hypothetical.

use crate::network_faults::NetworkFaults;
use crate::raft_types::{NodeInfo, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Timeout,
    Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use sluice_journal::codec;
use sluice_proto::raft::raft_peer_client::RaftPeerClient;
use sluice_proto::raft::{AnnounceRequest, ProbeRequest, ProbeResponse, RaftPayload};
use sluice_security::{AuthChannel, ClientSecurity, ServerRole};
use sluice_types::NodeId;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::Channel;

/// Connect timeout of a peer channel; RPC deadlines come from openraft per call.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Deadline of an `Announce`: the leader answers once its membership change commits, which may
/// first wait for another change in progress.
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(15);

/// Builds one [`PeerClient`] per replication stream, sharing channels per peer address.
#[derive(Clone)]
pub struct PeerNetwork {
    local: NodeId,
    /// A std mutex: only held to look up or insert a channel, never across `.await`.
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// Links cut by a test harness; `None` in production.
    faults: Option<Arc<NetworkFaults>>,
    /// Addresses that override the membership's for some peers (proxies of a chaos harness).
    routes: Arc<BTreeMap<NodeId, String>>,
    /// TLS (this replica's certificate as a client certificate) and the peer token.
    security: ClientSecurity,
    /// The largest message a peer decodes (its peer listener's bound).
    max_payload_bytes: usize,
}

impl PeerNetwork {
    pub fn new(
        local: NodeId,
        faults: Option<Arc<NetworkFaults>>,
        routes: BTreeMap<NodeId, String>,
        security: ClientSecurity,
        max_payload_bytes: usize,
    ) -> Self {
        PeerNetwork {
            local,
            channels: Arc::default(),
            faults,
            routes: Arc::new(routes),
            security,
            max_payload_bytes,
        }
    }

    fn channel(&self, addr: &str) -> Result<AuthChannel, String> {
        let mut channels = self
            .channels
            .lock()
            .expect("peer channel map lock poisoned");
        if let Some(channel) = channels.get(addr) {
            return Ok(self.security.authed(channel.clone()));
        }
        let target = addr.strip_prefix(BLOB_CHANNEL_PREFIX).unwrap_or(addr);
        let endpoint = self
            .security
            .endpoint(target)
            .map_err(|e| e.to_string())?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let channel = self
            .security
            .connect_lazy(&endpoint, ServerRole::Dispatcher);
        channels.insert(addr.to_string(), channel.clone());
        Ok(self.security.authed(channel))
    }

    /// Where this replica sends traffic for `target`: a harness route, else its peer address.
    fn peer_addr<'a>(&'a self, target: NodeId, node: &'a NodeInfo) -> &'a str {
        self.routes.get(&target).unwrap_or(&node.peer_addr)
    }

    /// Tells `leader` (at `node`) this replica's client address `addr`.
    pub async fn announce(
        &self,
        leader: NodeId,
        node: &NodeInfo,
        addr: String,
    ) -> Result<(), String> {
        if self
            .faults
            .as_ref()
            .is_some_and(|f| f.is_cut(self.local, leader))
        {
            return Err(format!("link {} -> {leader} is cut", self.local));
        }
        let channel = self
            .channel(self.peer_addr(leader, node))
            .map_err(|e| e.to_string())?;
        let mut request = tonic::Request::new(AnnounceRequest {
            node_id: self.local,
            addr,
        });
        request.set_timeout(ANNOUNCE_TIMEOUT);
        let mut client = RaftPeerClient::new(channel);
        match tokio::time::timeout(ANNOUNCE_TIMEOUT, client.announce(request)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(format!("{}: {}", status.code(), status.message())),
            Err(_) => Err(format!("no answer within {ANNOUNCE_TIMEOUT:?}")),
        }
    }
}

impl PeerNetwork {
    /// A channel to `target` (at `node`) for blob transfers (see `blobs`): a connection of its
    /// own per peer, so a blob's bulk never waits in front of Raft's appends and votes on one
    /// HTTP/2 connection. Refused while a test harness has cut the link.
    pub(crate) fn blob_channel(
        &self,
        target: NodeId,
        node: &NodeInfo,
    ) -> Result<AuthChannel, String> {
        if self
            .faults
            .as_ref()
            .is_some_and(|f| f.is_cut(self.local, target))
        {
            return Err(format!("link {} -> {target} is cut", self.local));
        }
        self.channel(&format!(
            "{BLOB_CHANNEL_PREFIX}{}",
            self.peer_addr(target, node)
        ))
    }

    /// This replica's id.
    pub(crate) fn local(&self) -> NodeId {
        self.local
    }
}

/// Marks a channel-map key as a blob transfer channel (the address follows it).
const BLOB_CHANNEL_PREFIX: &str = "blobs|";

impl PeerNetwork {
    /// Asks `peer` (at `peer_addr`, or its harness route) what it knows of its cluster and of
    /// this replica, within `timeout`.
    pub async fn probe(
        &self,
        peer: NodeId,
        peer_addr: &str,
        timeout: Duration,
    ) -> Result<ProbeResponse, String> {
        if self
            .faults
            .as_ref()
            .is_some_and(|f| f.is_cut(self.local, peer))
        {
            return Err(format!("link {} -> {peer} is cut", self.local));
        }
        let addr = self.routes.get(&peer).map_or(peer_addr, String::as_str);
        let channel = self.channel(addr)?;
        let mut request = tonic::Request::new(ProbeRequest {
            node_id: self.local,
        });
        request.set_timeout(timeout);
        let mut client = RaftPeerClient::new(channel);
        match tokio::time::timeout(timeout, client.probe(request)).await {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => Err(format!("{}: {}", status.code(), status.message())),
            Err(_) => Err(format!("no answer within {timeout:?}")),
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> PeerClient {
        let max = self.max_payload_bytes;
        let client = self
            .channel(self.peer_addr(target, node))
            .map(|channel| RaftPeerClient::new(channel).max_encoding_message_size(max));
        PeerClient {
            local: self.local,
            target,
            client,
            faults: self.faults.clone(),
            max_payload_bytes: max,
        }
    }
}

/// One replication stream's connection to a peer.
pub struct PeerClient {
    local: NodeId,
    target: NodeId,
    faults: Option<Arc<NetworkFaults>>,
    /// `Err` when the peer's address is not a valid URI: every call fails as unreachable.
    client: Result<RaftPeerClient<AuthChannel>, String>,
    /// The largest message the peer decodes.
    max_payload_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

impl PeerClient {
    /// Sends one request; `entries` is the number of log entries in it (appends only), so a
    /// peer refusing it as too large can be asked for fewer.
    async fn call<Resp, E>(
        &mut self,
        action: RPCTypes,
        payload: Vec<u8>,
        entries: usize,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, NodeInfo, RaftError<NodeId, E>>>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        if self
            .faults
            .as_ref()
            .is_some_and(|f| f.is_cut(self.local, self.target))
        {
            let cut = TransportError(format!("link {} -> {} is cut", self.local, self.target));
            return Err(RPCError::Unreachable(Unreachable::new(&cut)));
        }
        let client = match &mut self.client {
            Ok(client) => client,
            Err(e) => {
                return Err(RPCError::Unreachable(Unreachable::new(&TransportError(
                    e.clone(),
                ))))
            }
        };
        let transfer = self
            .faults
            .as_ref()
            .map_or(Duration::ZERO, |f| f.transfer_time(payload.len()));
        let request = RaftPayload { payload };
        let ttl = option.hard_ttl();
        let call = async {
            if !transfer.is_zero() {
                tokio::time::sleep(transfer).await;
            }
            match action {
                RPCTypes::AppendEntries => client.append_entries(request).await,
                RPCTypes::Vote => client.vote(request).await,
                RPCTypes::InstallSnapshot => client.install_snapshot(request).await,
            }
        };
        let reply = match tokio::time::timeout(ttl, call).await {
            Err(_) => {
                return Err(RPCError::Timeout(Timeout {
                    action,
                    id: self.local,
                    target: self.target,
                    timeout: ttl,
                }))
            }
            Ok(Err(status)) => {
                let err = TransportError(format!("{}: {}", status.code(), status.message()));
                return Err(match status.code() {
                    tonic::Code::Unavailable => RPCError::Unreachable(Unreachable::new(&err)),
                    // tonic's answer to a message over the peer's decode limit.
                    tonic::Code::OutOfRange if entries > 1 => RPCError::PayloadTooLarge(
                        PayloadTooLarge::new_entries_hint(entries as u64 / 2)
                            .with_source_error(&err),
                    ),
                    _ => RPCError::Network(NetworkError::new(&err)),
                });
            }
            Ok(Ok(reply)) => reply.into_inner(),
        };
        let result: Result<Resp, RaftError<NodeId, E>> = codec::decode(&reply.payload)
            .map_err(|e| RPCError::Network(NetworkError::new(&TransportError(e.to_string()))))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, NodeInfo, RaftError<NodeId>>> {
        let payload =
            append_payload(&rpc, self.max_payload_bytes).map_err(AppendRefusal::into_rpc_error)?;
        self.call(RPCTypes::AppendEntries, payload, rpc.entries.len(), &option)
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, NodeInfo, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(RPCTypes::InstallSnapshot, codec::encode(&rpc), 0, &option)
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, NodeInfo, RaftError<NodeId>>> {
        self.call(RPCTypes::Vote, codec::encode(&rpc), 0, &option)
            .await
    }
}

/// Why an append was not sent: too large for the peer as a whole (with the number of leading
/// entries that fit, at least one), or too large even for its first entry alone.
#[derive(Debug, thiserror::Error)]
pub enum AppendRefusal {
    #[error("{message}")]
    TooLarge { entries_hint: u64, message: String },
    #[error("{0}")]
    Unsplittable(String),
}

impl AppendRefusal {
    /// What openraft hears: `PayloadTooLarge` makes it send fewer entries at once; a network
    /// error makes it retry after a backoff.
    pub fn into_rpc_error(self) -> RPCError<NodeId, NodeInfo, RaftError<NodeId>> {
        match self {
            AppendRefusal::TooLarge {
                entries_hint,
                message,
            } => RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(entries_hint)
                    .with_source_error(&TransportError(message)),
            ),
            AppendRefusal::Unsplittable(message) => {
                RPCError::Network(NetworkError::new(&TransportError(message)))
            }
        }
    }
}

/// The encoding of an append, if it is at most `max_bytes`; otherwise why not, naming both
/// sizes.
pub fn append_payload(
    rpc: &AppendEntriesRequest<TypeConfig>,
    max_bytes: usize,
) -> Result<Vec<u8>, AppendRefusal> {
    let payload = codec::encode(rpc);
    if payload.len() <= max_bytes {
        return Ok(payload);
    }
    // What the request costs beside its entries (vote, ids, the list's length), measured.
    let empty = AppendEntriesRequest::<TypeConfig> {
        vote: rpc.vote,
        prev_log_id: rpc.prev_log_id,
        leader_commit: rpc.leader_commit,
        entries: Vec::new(),
    };
    // Slack for the entry count, whose varint grows with it.
    let mut size = codec::encode(&empty).len() + 16;
    let mut fit = 0u64;
    for entry in &rpc.entries {
        size = size.saturating_add(codec::encode(entry).len());
        if size > max_bytes {
            break;
        }
        fit += 1;
    }
    let message = format!(
        "append of {} entries is {} bytes, over the peers' limit of {max_bytes} bytes",
        rpc.entries.len(),
        payload.len()
    );
    if fit == 0 {
        let first = rpc.entries.first().map(|e| e.log_id.to_string());
        return Err(AppendRefusal::Unsplittable(format!(
            "{message}, and its first entry {} does not fit alone",
            first.as_deref().unwrap_or("(none)"),
        )));
    }
    Err(AppendRefusal::TooLarge {
        entries_hint: fit,
        message,
    })
}

#[cfg(test)]
#[path = "raft_network_tests.rs"]
mod tests;

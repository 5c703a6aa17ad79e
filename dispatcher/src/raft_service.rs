//! The Raft peer service: decodes openraft requests from other replicas, hands them to the local
//! `Raft`, and returns the whole `Result` encoded (see `raft_network`). An undecodable request is
//! the one error of its own; it leaves through `DispatcherError`'s map like every other.
//!
//! Only peers may call it: a forged `Vote` could depose the leader and a forged append or
//! snapshot move split cursors back. Every request is authorized as `Role::Peer` before it is
//! decoded (the caller was authenticated by the interceptor in front of the service).
//! `Announce` and `Probe` are Sluice's own: a replica's client address, recorded in the
//! membership by the leader, and what this replica knows of its cluster, for a replica started
//! with `--init` (see `init_check`). While this replica checks its own peers (its
//! [`PeerGate`] is closed), it answers `Probe` only: Raft's calls are refused, so it votes for
//! nobody and accepts no entries.

use crate::blobs::{Blobs, Chunks};
use crate::error::DispatcherError;
use crate::init_check::PeerGate;
use crate::membership;
use crate::raft_types::Raft;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use sluice_element::blob_tensors::digest_from;
use sluice_journal::codec;
use sluice_proto::raft::raft_peer_server::RaftPeer;
use sluice_proto::raft::{
    AnnounceRequest, AnnounceResponse, BlobPart, FetchBlobRequest, ProbeRequest, ProbeResponse,
    PushBlobResponse, RaftPayload,
};
use sluice_security::{authorize, Role};
use std::pin::Pin;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

pub struct RaftPeerService {
    raft: Raft,
    gate: PeerGate,
    /// This replica's blob store: `PushBlob` writes to it, `FetchBlob` reads from it.
    blobs: Blobs,
}

/// The parts of a `FetchBlob` reply.
pub type BlobParts = Pin<Box<dyn Stream<Item = Result<BlobPart, Status>> + Send>>;

impl RaftPeerService {
    pub fn new(raft: Raft, gate: PeerGate, blobs: Blobs) -> Self {
        RaftPeerService { raft, gate, blobs }
    }

    /// Refuses Raft's calls while this replica checks its peers (`--init`).
    fn check_gate(&self) -> Result<(), Status> {
        match self.gate.is_open() {
            true => Ok(()),
            false => Err(DispatcherError::QuorumUnavailable(format!(
                "replica {} takes no part in Raft until its peers have answered its --init check",
                self.raft.metrics().borrow().id
            ))
            .into()),
        }
    }
}

/// The request's payload, once its caller is known to be a peer.
fn decode<T: DeserializeOwned>(request: Request<RaftPayload>, rpc: &str) -> Result<T, Status> {
    authorize(&request, rpc, &[Role::Peer])?;
    codec::decode(&request.into_inner().payload).map_err(|e| {
        DispatcherError::InvalidArgument(format!("undecodable raft payload: {e}")).into()
    })
}

fn reply<T: serde::Serialize>(result: T) -> Result<Response<RaftPayload>, Status> {
    Ok(Response::new(RaftPayload {
        payload: codec::encode(&result),
    }))
}

#[tonic::async_trait]
impl RaftPeer for RaftPeerService {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let request = decode(request, "AppendEntries")?;
        self.check_gate()?;
        reply(self.raft.append_entries(request).await)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let request = decode(request, "Vote")?;
        self.check_gate()?;
        reply(self.raft.vote(request).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let request = decode(request, "InstallSnapshot")?;
        self.check_gate()?;
        reply(self.raft.install_snapshot(request).await)
    }

    async fn announce(
        &self,
        request: Request<AnnounceRequest>,
    ) -> Result<Response<AnnounceResponse>, Status> {
        authorize(&request, "Announce", &[Role::Peer])?;
        let req = request.into_inner();
        membership::set_client_addr(&self.raft, req.node_id, req.addr).await?;
        Ok(Response::new(AnnounceResponse {}))
    }

    async fn probe(
        &self,
        request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        authorize(&request, "Probe", &[Role::Peer])?;
        let asker = request.into_inner().node_id;
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let member = membership.get_node(&asker);
        Ok(Response::new(ProbeResponse {
            initialized: metrics.last_log_index.is_some()
                || metrics.vote != openraft::Vote::default(),
            voters: membership.voter_ids().collect(),
            learners: membership.learner_ids().collect(),
            leader: metrics.current_leader.unwrap_or(0),
            member: member.is_some(),
            member_addr: member.map(|n| n.addr.clone()).unwrap_or_default(),
            has_log: metrics.last_log_index.is_some(),
            last_log_index: metrics.last_log_index.unwrap_or(0),
        }))
    }

    /// A blob the leader pushes (see `blobs`): written and verified here, or answered at once
    /// when this replica holds it already.
    async fn push_blob(
        &self,
        request: Request<tonic::Streaming<BlobPart>>,
    ) -> Result<Response<PushBlobResponse>, Status> {
        authorize(&request, "PushBlob", &[Role::Peer])?;
        let mut parts = request.into_inner();
        let first = parts.message().await?.ok_or_else(|| {
            Status::from(DispatcherError::InvalidArgument(
                "a blob push with no part".into(),
            ))
        })?;
        let digest = digest_from(&first.digest)
            .map_err(|e| Status::from(DispatcherError::InvalidArgument(e.to_string())))?;
        if self.blobs.holds_fresh(&digest, first.total_len) {
            return Ok(Response::new(PushBlobResponse {
                already_present: true,
            }));
        }
        let rest: Chunks = Box::pin(parts.map(|p| p.map(|p| p.data)));
        self.blobs
            .write(digest, first.total_len, first.data, rest)
            .await?;
        Ok(Response::new(PushBlobResponse {
            already_present: false,
        }))
    }

    type FetchBlobStream = BlobParts;

    /// A blob this replica holds, for a peer that lacks it; `NotFound` otherwise.
    async fn fetch_blob(
        &self,
        request: Request<FetchBlobRequest>,
    ) -> Result<Response<BlobParts>, Status> {
        authorize(&request, "FetchBlob", &[Role::Peer])?;
        let req = request.into_inner();
        let digest = digest_from(&req.digest)
            .map_err(|e| Status::from(DispatcherError::InvalidArgument(e.to_string())))?;
        let (len, rx) = self.blobs.read(&digest, req.offset)?;
        let part = move |data| BlobPart {
            digest: digest.to_vec(),
            total_len: len,
            data,
        };
        let parts = tokio_stream::wrappers::ReceiverStream::new(rx).map(move |chunk| {
            chunk
                .map(part)
                .map_err(|e| Status::internal(format!("reading the blob: {e}")))
        });
        Ok(Response::new(Box::pin(parts)))
    }
}

//! The Raft peer service: decodes openraft requests from other replicas, hands them to the local
//! `Raft`, and returns the whole `Result` encoded (see `raft_network`). An undecodable request is
//! the one error of its own; it leaves through `DispatcherError`'s map like every other.
//!
//! Only peers may call it: a forged `Vote` could depose the leader and a forged append or
//! snapshot move split cursors back. Every request is authorized as `Role::Peer` before it is
//! decoded (the caller was authenticated by the interceptor in front of the service).
//! `Announce` is the one request of Sluice's own: a replica's client address, recorded in the
//! membership by the leader.

use crate::error::DispatcherError;
use crate::membership;
use crate::raft_types::Raft;
use serde::de::DeserializeOwned;
use sluice_journal::codec;
use sluice_proto::raft::raft_peer_server::RaftPeer;
use sluice_proto::raft::{AnnounceRequest, AnnounceResponse, RaftPayload};
use sluice_security::{authorize, Role};
use tonic::{Request, Response, Status};

pub struct RaftPeerService {
    raft: Raft,
}

impl RaftPeerService {
    pub fn new(raft: Raft) -> Self {
        RaftPeerService { raft }
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
        reply(
            self.raft
                .append_entries(decode(request, "AppendEntries")?)
                .await,
        )
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        reply(self.raft.vote(decode(request, "Vote")?).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        reply(
            self.raft
                .install_snapshot(decode(request, "InstallSnapshot")?)
                .await,
        )
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
}

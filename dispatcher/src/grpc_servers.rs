//! The replica's two gRPC listeners, each serving exactly one service: the client API
//! (`Dispatcher`, for clients, workers and admins) and the peer listener (`RaftPeer`, for the
//! other replicas only). Raft never shares a port with the client API, so whatever guards the
//! peer port (a firewall rule, peer authentication) guards every Raft RPC, and a client that
//! reaches the client port cannot vote, append or install a snapshot.
//!
//! Each listener is set up in one function that takes the bound `TcpListener` and the service,
//! the one place where transport security is added.

use crate::dispatcher_handle::MAX_MESSAGE_BYTES;
use crate::raft_service::RaftPeerService;
use crate::service::DispatcherService;
use sluice_proto::dispatcher::dispatcher_server::DispatcherServer;
use sluice_proto::raft::raft_peer_server::RaftPeerServer;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

/// A running listener; ends when the shutdown token is cancelled or the server fails.
pub type ServerTask = JoinHandle<Result<(), tonic::transport::Error>>;

/// Serves the client API (the `Dispatcher` service only) on `listener`.
pub fn serve_client_api(
    listener: TcpListener,
    service: DispatcherService,
    shutdown: CancellationToken,
) -> ServerTask {
    let service = DispatcherServer::new(service)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let router = Server::builder().tcp_nodelay(true).add_service(service);
    tokio::spawn(
        router.serve_with_incoming_shutdown(incoming(listener), shutdown.cancelled_owned()),
    )
}

/// Serves the Raft peer service (only) on `listener`.
pub fn serve_peers(
    listener: TcpListener,
    service: RaftPeerService,
    shutdown: CancellationToken,
) -> ServerTask {
    let service = RaftPeerServer::new(service)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let router = Server::builder().tcp_nodelay(true).add_service(service);
    tokio::spawn(
        router.serve_with_incoming_shutdown(incoming(listener), shutdown.cancelled_owned()),
    )
}

/// Accepted sockets need TCP_NODELAY set here: the builder's `tcp_nodelay` only reaches sockets
/// tonic binds itself. Without it, Nagle held the tail of each message until the peer's delayed
/// ACK (~40 ms a message).
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

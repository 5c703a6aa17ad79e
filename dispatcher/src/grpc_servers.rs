//! The replica's two gRPC listeners, each serving exactly one service: the client API
//! (`Dispatcher`, for clients, workers and admins) and the peer listener (`RaftPeer`, for the
//! other replicas only). Raft never shares a port with the client API, so whatever guards the
//! peer port (a firewall rule, peer authentication) guards every Raft RPC, and a client that
//! reaches the client port cannot vote, append or install a snapshot.
//!
//! Each listener is set up in one function that takes the bound `TcpListener`, the service, its
//! TLS configuration and the authenticator: every connection goes through
//! `sluice_security::incoming` (TLS handshakes off the accept loop, TCP_NODELAY set, since the
//! builder's `tcp_nodelay` only reaches sockets tonic binds itself and Nagle otherwise held the
//! tail of each message until the peer's delayed ACK, ~40 ms a message), and every request
//! through the authenticator's interceptor before the handler authorizes it.

use crate::raft_service::RaftPeerService;
use crate::service::DispatcherService;
use sluice_proto::dispatcher::dispatcher_server::DispatcherServer;
use sluice_proto::raft::raft_peer_server::RaftPeerServer;
use sluice_security::{incoming, Authenticator};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;

/// Largest gRPC message accepted (Raft batches and snapshot chunks can be large).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

/// A running listener; ends when the shutdown token is cancelled or the server fails.
pub type ServerTask = JoinHandle<Result<(), tonic::transport::Error>>;

/// Serves the client API (the `Dispatcher` service only) on `listener`.
pub fn serve_client_api(
    listener: TcpListener,
    service: DispatcherService,
    tls: Option<Arc<rustls::ServerConfig>>,
    authenticator: Authenticator,
    shutdown: CancellationToken,
) -> ServerTask {
    let service = DispatcherServer::new(service)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let service = InterceptedService::new(service, authenticator.interceptor());
    let router = Server::builder().add_service(service);
    tokio::spawn(
        router.serve_with_incoming_shutdown(incoming(listener, tls), shutdown.cancelled_owned()),
    )
}

/// Serves the Raft peer service (only) on `listener`.
pub fn serve_peers(
    listener: TcpListener,
    service: RaftPeerService,
    tls: Option<Arc<rustls::ServerConfig>>,
    authenticator: Authenticator,
    shutdown: CancellationToken,
) -> ServerTask {
    let service = RaftPeerServer::new(service)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let service = InterceptedService::new(service, authenticator.interceptor());
    let router = Server::builder().add_service(service);
    tokio::spawn(
        router.serve_with_incoming_shutdown(incoming(listener, tls), shutdown.cancelled_owned()),
    )
}

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
//!
//! Each listener decodes messages up to its own bound (see `DispatcherConfig`): the client API
//! up to the largest definition plus a margin, so an oversized registration is refused before
//! a byte of it is proposed; the peer listener up to more than the largest log entry, so an
//! append too large for it holds several entries and openraft can split it.

use crate::raft_service::RaftPeerService;
use crate::service::DispatcherService;
use sluice_ops::RpcMetricsLayer;
use sluice_proto::dispatcher::dispatcher_server::DispatcherServer;
use sluice_proto::raft::raft_peer_server::RaftPeerServer;
use sluice_security::{incoming, Authenticator};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;

/// HTTP/2 keepalive of the client API: a ping this often, and a connection whose ping is not
/// answered within `KEEPALIVE_TIMEOUT` is closed, so what a caller that vanished without
/// closing its connection (a crashed host, a dropped route) left open ends: its long polls, and
/// its `WatchLeader` stream, which would otherwise stay forever. Slow on purpose: a replica
/// holds a connection per worker and reader process, and callers notice a silent replica on
/// their own.
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The smallest encode limit of the client API: a status reply may outgrow the decode limit
/// of small requests.
const MIN_REPLY_BYTES: usize = 256 * 1024 * 1024;

/// A running listener; ends when the shutdown token is cancelled or the server fails.
pub type ServerTask = JoinHandle<Result<(), tonic::transport::Error>>;

/// Serves the client API (the `Dispatcher` service only) on `listener`, decoding requests of
/// up to `max_message_bytes`, each call measured by `rpc`.
#[allow(clippy::too_many_arguments)]
pub fn serve_client_api(
    listener: TcpListener,
    service: DispatcherService,
    max_message_bytes: usize,
    tls: Option<Arc<rustls::ServerConfig>>,
    authenticator: Authenticator,
    rpc: RpcMetricsLayer,
    shutdown: CancellationToken,
) -> ServerTask {
    let service = DispatcherServer::new(service)
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes.max(MIN_REPLY_BYTES));
    let service = InterceptedService::new(service, authenticator.interceptor());
    let router = Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .layer(rpc)
        .add_service(service);
    tokio::spawn(
        router.serve_with_incoming_shutdown(incoming(listener, tls), shutdown.cancelled_owned()),
    )
}

/// Serves the Raft peer service (only) on `listener`, decoding requests of up to
/// `max_message_bytes`, each call measured by `rpc`.
#[allow(clippy::too_many_arguments)]
pub fn serve_peers(
    listener: TcpListener,
    service: RaftPeerService,
    max_message_bytes: usize,
    tls: Option<Arc<rustls::ServerConfig>>,
    authenticator: Authenticator,
    rpc: RpcMetricsLayer,
    shutdown: CancellationToken,
) -> ServerTask {
    let service = RaftPeerServer::new(service)
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes);
    let service = InterceptedService::new(service, authenticator.interceptor());
    // openraft gives an append one heartbeat interval (50 ms by default) to reach a follower
    // and be answered, largest definition included: a window that takes the whole message lets
    // the leader send it without waiting for window updates on the way.
    // (HTTP/2 caps a window at 2^31 - 1 bytes.)
    let window = u32::try_from(max_message_bytes.min((1 << 31) - 1)).unwrap_or(u32::MAX >> 1);
    let router = Server::builder()
        .initial_stream_window_size(window)
        .initial_connection_window_size(window)
        .layer(rpc)
        .add_service(service);
    tokio::spawn(
        router.serve_with_incoming_shutdown(incoming(listener, tls), shutdown.cancelled_owned()),
    )
}

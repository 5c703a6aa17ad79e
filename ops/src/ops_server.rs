//! `OpsServer`: the node's operations listener, plain HTTP/1 on its own port.
//!
//! Routes: `GET /metrics` (the registry in the OpenMetrics text format, which Prometheus reads
//! and asks for), `GET /live` (200 while the process answers at all), `GET /ready` (200
//! `serving`, or 503 with the node's one-line reason), and on nodes that have one the status
//! page `GET /` and its data `GET /status.json`. Anything else is 404, another method 405.
//!
//! It runs on a task of its own and ends when the node's shutdown token is cancelled; each
//! connection is served on its own task and cut at the same moment. Everything it serves is
//! read-only: there is no route that changes the node.

use crate::error::OpsError;
use crate::ops_node::OpsNode;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// What Prometheus is told the body of `/metrics` is.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A running listener.
pub struct OpsServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl OpsServer {
    /// Binds `addr` (port 0: any free port).
    pub async fn bind(addr: &str) -> Result<TcpListener, OpsError> {
        TcpListener::bind(addr).await.map_err(|e| OpsError::Bind {
            addr: addr.to_string(),
            message: e.to_string(),
        })
    }

    /// Serves `node` on `listener` until `shutdown` is cancelled.
    pub fn serve(
        listener: TcpListener,
        node: Arc<dyn OpsNode>,
        shutdown: CancellationToken,
    ) -> Result<OpsServer, OpsError> {
        let addr = listener.local_addr().map_err(|e| OpsError::Bind {
            addr: "the metrics listener".into(),
            message: e.to_string(),
        })?;
        let task = tokio::spawn(accept(listener, node, shutdown));
        Ok(OpsServer { addr, task })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits for the listener to end (after its shutdown token was cancelled).
    pub async fn join(self) {
        let _ = self.task.await;
    }
}

async fn accept(listener: TcpListener, node: Arc<dyn OpsNode>, shutdown: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                debug!(error = %e, "metrics listener: accept failed");
                continue;
            }
        };
        let node = node.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let node = node.clone();
                async move { Ok::<_, Infallible>(route(node.as_ref(), request).await) }
            });
            let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = shutdown.cancelled() => {}
                served = connection => if let Err(e) = served {
                    debug!(error = %e, "metrics listener: connection ended");
                },
            }
        });
    }
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    if let Ok(value) = header::HeaderValue::from_str(content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

const TEXT: &str = "text/plain; charset=utf-8";

async fn route(node: &dyn OpsNode, request: Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET\n");
    }
    match request.uri().path() {
        "/metrics" => {
            node.refresh().await;
            let mut text = String::new();
            match prometheus_client::encoding::text::encode(&mut text, node.registry()) {
                Ok(()) => reply(StatusCode::OK, METRICS_CONTENT_TYPE, text),
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    TEXT,
                    format!("encode metrics: {e}\n"),
                ),
            }
        }
        "/live" => reply(StatusCode::OK, TEXT, "live\n"),
        "/ready" => match node.readiness().await {
            Ok(()) => reply(StatusCode::OK, TEXT, "serving\n"),
            Err(reason) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                TEXT,
                format!("{}\n", reason.replace('\n', " ")),
            ),
        },
        "/" | "/index.html" => match node.status_page() {
            Some(page) => reply(StatusCode::OK, "text/html; charset=utf-8", page),
            None => reply(StatusCode::NOT_FOUND, TEXT, "no status page on this node\n"),
        },
        "/status.json" => match node.status_json() {
            Some(status) => {
                node.refresh().await;
                reply(StatusCode::OK, "application/json", status.await.to_string())
            }
            None => reply(StatusCode::NOT_FOUND, TEXT, "no status on this node\n"),
        },
        other => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            format!("no route {other}; try /metrics, /live, /ready\n"),
        ),
    }
}

#[cfg(test)]
#[path = "ops_server_tests.rs"]
mod tests;

use super::*;
use crate::ops_node::BoxFuture;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct FakeNode {
    registry: Registry,
    gauge: Gauge,
    ready: AtomicBool,
}

impl OpsNode for FakeNode {
    fn registry(&self) -> &Registry {
        &self.registry
    }
    fn refresh(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.gauge.set(7);
        })
    }
    fn readiness(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            match self.ready.load(Ordering::Relaxed) {
                true => Ok(()),
                false => Err("not registered with the dispatcher yet".into()),
            }
        })
    }
}

/// One `GET path` over a fresh connection; (status code, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("writes");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("reads");
    let status = response[9..12].parse().expect("a status code");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn each_route_answers_and_the_listener_ends_with_its_token() {
    let mut registry = Registry::default();
    let gauge = Gauge::default();
    registry.register("sluice_test_things", "Things", gauge.clone());
    let node = Arc::new(FakeNode {
        registry,
        gauge,
        ready: AtomicBool::new(false),
    });
    let shutdown = CancellationToken::new();
    let listener = OpsServer::bind("127.0.0.1:0").await.expect("binds");
    let server = OpsServer::serve(listener, node.clone(), shutdown.clone()).expect("serves");
    let addr = server.addr();

    let (status, body) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    let samples = crate::exposition::parse(&body).expect("parses");
    assert!(
        samples
            .iter()
            .any(|s| s.name == "sluice_test_things" && s.value == 7.0),
        "{body}"
    );
    assert_eq!(get(addr, "/live").await, (200, "live\n".into()));
    assert_eq!(
        get(addr, "/ready").await,
        (503, "not registered with the dispatcher yet\n".into())
    );
    node.ready.store(true, Ordering::Relaxed);
    assert_eq!(get(addr, "/ready").await, (200, "serving\n".into()));
    assert_eq!(get(addr, "/").await.0, 404, "a worker has no status page");
    assert_eq!(get(addr, "/status.json").await.0, 404);
    assert_eq!(get(addr, "/nothing").await.0, 404);

    shutdown.cancel();
    server.join().await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "closed"
    );
}

//! `RpcMetrics`: per-RPC counts, errors by gRPC code and latency, measured by a tower layer
//! (`RpcMetricsLayer`) wrapped around a whole tonic server, so no handler knows of it.
//!
//! What is measured: a call from its request reaching the server (before authentication) to
//! its response headers. A unary call's error travels in those headers (a trailers-only
//! response), so it is counted with its code; a unary success and every server stream carry
//! their status in trailers, which the layer does not wait for: they count as `OK`, and a
//! stream's latency is its time to first response. That keeps the layer off the body path.
//!
//! Cardinality stays bounded whatever callers send: the `service` and `method` labels come
//! from the request path, and a path the server does not implement (it answers
//! `Unimplemented`) is counted as `unknown/unknown`, never under a name a caller made up.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tower_layer::Layer;
use tower_service::Service;

/// gRPC's `Unimplemented` status code.
const UNIMPLEMENTED: &str = "12";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub service: String,
    pub method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    pub service: String,
    pub method: String,
    pub code: String,
}

#[derive(Clone)]
struct LatencyHistogram;

impl MetricConstructor<Histogram> for LatencyHistogram {
    fn new_metric(&self) -> Histogram {
        Histogram::new(crate::latency_buckets())
    }
}

/// The RPC metrics of one server (or of both of a dispatcher's listeners).
#[derive(Debug)]
pub struct RpcMetrics {
    requests: Family<MethodLabels, Counter>,
    errors: Family<CodeLabels, Counter>,
    latency: Family<MethodLabels, Histogram, LatencyHistogram>,
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LatencyHistogram")
    }
}

impl RpcMetrics {
    /// Registers `sluice_rpc_requests_total`, `sluice_rpc_errors_total` and
    /// `sluice_rpc_duration_seconds` in `registry`.
    pub fn register(registry: &mut Registry) -> Arc<RpcMetrics> {
        let metrics = RpcMetrics {
            requests: Family::default(),
            errors: Family::default(),
            latency: Family::new_with_constructor(LatencyHistogram),
        };
        registry.register(
            "sluice_rpc_requests",
            "gRPC calls received, by service and method",
            metrics.requests.clone(),
        );
        registry.register(
            "sluice_rpc_errors",
            "gRPC calls answered with an error status, by service, method and gRPC code",
            metrics.errors.clone(),
        );
        registry.register(
            "sluice_rpc_duration_seconds",
            "Time from a gRPC call's arrival to its response headers",
            metrics.latency.clone(),
        );
        Arc::new(metrics)
    }

    /// Records one call to `path` answered with `code` (gRPC's number, `"0"` for OK) after
    /// `elapsed`.
    pub fn observe(&self, path: &str, code: &str, elapsed: Duration) {
        let (service, method) = match code {
            UNIMPLEMENTED => ("unknown", "unknown"),
            _ => split_path(path),
        };
        let labels = MethodLabels {
            service: service.to_string(),
            method: method.to_string(),
        };
        self.requests.get_or_create(&labels).inc();
        self.latency
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        if code != "0" {
            self.errors
                .get_or_create(&CodeLabels {
                    service: labels.service,
                    method: labels.method,
                    code: code_name(code).to_string(),
                })
                .inc();
        }
    }
}

/// `/pkg.Service/Method` as (`pkg.Service`, `Method`); anything else is unknown.
fn split_path(path: &str) -> (&str, &str) {
    path.strip_prefix('/')
        .and_then(|p| p.split_once('/'))
        .filter(|(service, method)| !service.is_empty() && !method.is_empty())
        .unwrap_or(("unknown", "unknown"))
}

/// gRPC's name for a status code number (as `grpc-status` carries it).
fn code_name(code: &str) -> &'static str {
    match code {
        "0" => "OK",
        "1" => "CANCELLED",
        "2" => "UNKNOWN",
        "3" => "INVALID_ARGUMENT",
        "4" => "DEADLINE_EXCEEDED",
        "5" => "NOT_FOUND",
        "6" => "ALREADY_EXISTS",
        "7" => "PERMISSION_DENIED",
        "8" => "RESOURCE_EXHAUSTED",
        "9" => "FAILED_PRECONDITION",
        "10" => "ABORTED",
        "11" => "OUT_OF_RANGE",
        "12" => "UNIMPLEMENTED",
        "13" => "INTERNAL",
        "14" => "UNAVAILABLE",
        "15" => "DATA_LOSS",
        "16" => "UNAUTHENTICATED",
        _ => "UNKNOWN",
    }
}

/// The layer: with `None` (metrics off) calls pass through unmeasured (no clock, no labels).
#[derive(Clone, Default)]
pub struct RpcMetricsLayer(Option<Arc<RpcMetrics>>);

impl RpcMetricsLayer {
    pub fn new(metrics: Option<Arc<RpcMetrics>>) -> Self {
        RpcMetricsLayer(metrics)
    }
}

impl<S> Layer<S> for RpcMetricsLayer {
    type Service = RpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcMetricsService {
            inner,
            metrics: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RpcMetricsService<S> {
    inner: S,
    metrics: Option<Arc<RpcMetrics>>,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for RpcMetricsService<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let Some(metrics) = self.metrics.clone() else {
            return Box::pin(self.inner.call(request));
        };
        let path = request.uri().path().to_string();
        let start = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(response) => response
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("0")
                    .to_string(),
                // The transport failed the call: no status reached the caller.
                Err(_) => "2".to_string(),
            };
            metrics.observe(&path, &code, start.elapsed());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_by_method_and_errors_by_code_with_unknown_paths_folded() {
        let mut registry = Registry::default();
        let metrics = RpcMetrics::register(&mut registry);
        let ms = Duration::from_millis(1);
        metrics.observe("/sluice.Dispatcher/GetStatus", "0", ms);
        metrics.observe("/sluice.Dispatcher/GetStatus", "14", ms);
        metrics.observe("/made.Up/Name", UNIMPLEMENTED, ms);
        metrics.observe("garbage", "0", ms);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        let want = [
            "sluice_rpc_requests_total{service=\"sluice.Dispatcher\",method=\"GetStatus\"} 2",
            "sluice_rpc_errors_total{service=\"sluice.Dispatcher\",method=\"GetStatus\",code=\"UNAVAILABLE\"} 1",
            "sluice_rpc_requests_total{service=\"unknown\",method=\"unknown\"} 2",
            "sluice_rpc_errors_total{service=\"unknown\",method=\"unknown\",code=\"UNIMPLEMENTED\"} 1",
            "sluice_rpc_duration_seconds_count{service=\"sluice.Dispatcher\",method=\"GetStatus\"} 2",
        ];
        for line in want {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert!(!text.contains("made.Up"), "{text}");
    }
}

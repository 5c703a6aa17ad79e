"""Prometheus metrics of this process's readers: what they received and how long they waited.

Every epoch read through ``sluice`` in this process counts into three metrics, labelled by
``dataset`` (the dataset id) and ``job`` (the job name, empty for an anonymous job):

- ``sluice_client_received_elements_total``: elements handed to the reader;
- ``sluice_client_received_bytes_total``: their size (encoded as workers sent them);
- ``sluice_client_stall_seconds``: a histogram of the reader's waits for an element when none
  was buffered; its ``_sum`` is the total time the input pipeline held the trainer up.

At most 64 ``(dataset, job)`` pairs get series of their own; reads of later ones count under
``dataset="_other", job="_other"``. :func:`text` returns the metrics in the OpenMetrics text
format, which Prometheus scrapes; :func:`start_http_server` serves them. A metric appears once
some epoch has counted into it::

    >>> import sluice
    >>> from sluice.data import Dataset
    >>> dispatcher = sluice.DispatchServer()
    >>> worker = sluice.WorkerServer(sluice.WorkerConfig(dispatcher.target))
    >>> ds = Dataset.range(3).apply(sluice.distribute("parallel_epochs", dispatcher.target, job_name="docs"))
    >>> len(list(ds))
    3
    >>> lines = sluice.metrics.text().splitlines()
    >>> [l for l in lines if l.startswith("sluice_client_received_elements") and "docs" in l]  # doctest: +ELLIPSIS
    ['sluice_client_received_elements_total{dataset="...",job="docs"} 3']
    >>> server = sluice.metrics.start_http_server(0, addr="127.0.0.1")   # port 0: a free port
    >>> server.port > 0
    True
    >>> server.stop()
    >>> worker.stop(); dispatcher.stop()
"""

from __future__ import annotations

import http.server
import threading
from typing import Optional

from sluice import _native

__all__ = ["CONTENT_TYPE", "MetricsServer", "start_http_server", "text"]

#: The content type of :func:`text`, as an HTTP server should declare it.
CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def text() -> str:
    """The client metrics of this process, in the OpenMetrics text format.

    Serve it from a web framework the application already runs, or use
    :func:`start_http_server`::

        >>> import sluice
        >>> sluice.metrics.text().endswith("# EOF\\n")
        True
    """
    return _native.client_metrics_text()


class _Handler(http.server.BaseHTTPRequestHandler):
    """``GET /metrics`` (or ``/``): the metrics; anything else: 404."""

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        if self.path.split("?", 1)[0] not in ("/", "/metrics"):
            self.send_error(404, "the metrics are at /metrics")
            return
        body = text().encode()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Scrapes are not logged (a scrape every few seconds would fill stderr)."""


class MetricsServer:
    """An HTTP server of :func:`text` on a daemon thread; see :func:`start_http_server`."""

    def __init__(self, port: int, addr: str) -> None:
        self._server = http.server.ThreadingHTTPServer((addr, port), _Handler)
        self._server.daemon_threads = True
        self._thread: Optional[threading.Thread] = threading.Thread(
            target=self._server.serve_forever, name="sluice-metrics", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        """The port it listens on (the one chosen when started with port 0)."""
        return int(self._server.server_address[1])

    @property
    def addr(self) -> str:
        """The address it listens on."""
        return str(self._server.server_address[0])

    def stop(self) -> None:
        """Stops serving and closes the socket; a second call does nothing."""
        if self._thread is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._thread = None

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_http_server(port: int, addr: str = "0.0.0.0") -> MetricsServer:
    """Serves :func:`text` at ``http://addr:port/metrics`` from a daemon thread, as
    ``prometheus_client.start_http_server`` does, until :meth:`MetricsServer.stop`.

    ``port`` 0 picks a free port (:attr:`MetricsServer.port` tells which). The default ``addr``
    listens on every interface, for a Prometheus server on another host; the page holds the
    metrics only (dataset ids and job names among them), and no credentials. An address or port
    that cannot be bound raises ``OSError``::

        >>> import sluice, urllib.request
        >>> with sluice.metrics.start_http_server(0, addr="127.0.0.1") as server:
        ...     page = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics").read()
        >>> page.endswith(b"# EOF\\n")
        True
    """
    return MetricsServer(port, addr)

"""A Python executor: the process a worker runs users' functions in (``python -m sluice._executor``).

A worker starts a pool of these and speaks to each over its stdin and stdout with the framed
protocol of the ``sluice-pyexec`` crate (``pyexec/src/protocol.rs``): a frame is a 4-byte
little-endian length, a kind byte and a body. The executor says HELLO (its Python and
cloudpickle versions and pid), then answers each LOAD (unpickle a function, kept by id),
CALL (run a loaded function on one element) and BATCH (run it on each of a list of elements,
with one RESULTS frame back: a result per element and the nanoseconds the batch took, by which
the worker sizes the next batches) in order; UNLOAD forgets a function. Elements travel in
Sluice's element encoding, decoded to numpy and encoded back by the native module, never
pickled.

A worker also shares a memory region with each executor (named in ``SLUICE_EXECUTOR_REGION``):
a BATCH_SHARED's elements lie in one of its request slots, and the executor encodes each
result into the matching reply slot right after the call that made it, then answers with a
RESULTS_SHARED that says where. Results that do not fit go through the pipe in a RESULTS, as
does everything from an executor that could not map its region (its HELLO says which).

The protocol owns file descriptors 0 and 1: ``sys.stdin`` reads nothing and ``sys.stdout`` (and
fd 1, for C extensions) is the worker's stderr, so a user's ``print`` cannot corrupt a frame.
The executor ends when its stdin closes.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import time
import traceback
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Tuple


LOAD = 0x01
CALL = 0x02
UNLOAD = 0x03
BATCH = 0x04
BATCH_SHARED = 0x05
HELLO = 0x80
OUTPUTS = 0x81
KEEP = 0x82
ERROR = 0x83
LOADED = 0x84
RESULTS = 0x85
RESULTS_SHARED = 0x86

_HEADER = struct.Struct("<IB")
_ID = struct.Struct("<Q")
_RESULTS_HEAD = struct.Struct("<IQ")
_RESULT_HEAD = struct.Struct("<BI")
_SHARED_REF = struct.Struct("<BI")
_REGION_ENV = "SLUICE_EXECUTOR_REGION"
_KEEP_YES = b"\x01"
_KEEP_NO = b"\x00"


def _take_protocol_fds() -> Tuple[BinaryIO, BinaryIO]:
    """The protocol's input and output, with fds 0 and 1 given back to the user's code as
    /dev/null and stderr."""
    proto_in = os.fdopen(os.dup(0), "rb", buffering=1 << 16)
    proto_out = os.fdopen(os.dup(1), "wb", buffering=1 << 16)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdin = open(os.devnull)
    sys.stdout = sys.stderr
    return proto_in, proto_out


def _read_frame(inp: BinaryIO) -> Optional[Tuple[int, bytes]]:
    head = inp.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    length, kind = _HEADER.unpack(head)
    body = inp.read(length - 1)
    if len(body) < length - 1:
        return None
    return kind, body


def _write_frame(out: BinaryIO, kind: int, body: bytes = b"") -> None:
    out.write(_HEADER.pack(len(body) + 1, kind))
    out.write(body)
    out.flush()


def _write_frame_parts(out: BinaryIO, kind: int, parts: List[bytes]) -> None:
    out.write(_HEADER.pack(sum(len(p) for p in parts) + 1, kind))
    for part in parts:
        out.write(part)
    out.flush()


def _exception_report(e: BaseException) -> bytes:
    kind = type(e)
    return json.dumps(
        {
            "type_module": getattr(kind, "__module__", "") or "",
            "type_name": getattr(kind, "__qualname__", kind.__name__),
            "message": str(e),
            "traceback": traceback.format_exc(),
        }
    ).encode()


def _shared_region(native: Any) -> Any:
    """The region the worker shares with this executor, mapped; ``None`` without one. The
    variable is removed either way, so processes the user's code starts do not see it."""
    try:
        return native.ExecutorRegion.from_env()
    except Exception as e:  # noqa: BLE001 - the pipes still work; the worker is told in HELLO
        print(f"sluice executor: no shared region ({e}); batches go through the pipes", file=sys.stderr)
        return None
    finally:
        os.environ.pop(_REGION_ENV, None)


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    from sluice import _functions, _native

    functions: Dict[int, Tuple[int, Callable[..., Any]]] = {}
    predicates = (_functions.KIND_FILTER, _functions.KIND_TAKE_WHILE)
    region = _shared_region(_native)

    def call_one(op_kind: int, fn: Callable[..., Any], element: Any) -> Tuple[int, Any]:
        """One element's result: OUTPUTS with its outputs' parts (as ``encode_elements`` takes
        them), KEEP with a filter's verdict, or ERROR with what the function raised."""
        try:
            outputs = _functions.call(op_kind, fn, element)
            if op_kind in predicates:
                return KEEP, _KEEP_YES if outputs else _KEEP_NO
            return OUTPUTS, [_functions.output_parts(o) for o in outputs]
        except Exception as e:  # noqa: BLE001 - every exception of user code is reported
            return ERROR, _exception_report(e)

    def encoded(reply: int, payload: Any) -> Tuple[int, bytes]:
        """A result as its kind and body; outputs that cannot be encoded are its ERROR."""
        if reply != OUTPUTS:
            return reply, payload
        try:
            return OUTPUTS, _native.encode_elements(payload)
        except Exception as e:  # noqa: BLE001 - an output of a type the codec refuses
            return ERROR, _exception_report(e)

    def put(reply: int, payload: Any) -> bool:
        """Writes a result into the reply slot; ``False`` when it does not fit."""
        try:
            return region.put(reply, payload)
        except Exception as e:  # noqa: BLE001 - an output of a type the codec refuses
            return region.put(ERROR, _exception_report(e))

    def batch_shared(op_kind: int, fn: Callable[..., Any], slot: int, length: int) -> None:
        start = time.perf_counter_ns()
        try:
            elements = region.decode_batch(slot, length)
        except Exception as e:  # noqa: BLE001 - reported, the worker fails the batch
            _write_frame(out, ERROR, _exception_report(e))
            return
        region.begin(slot)
        # Once a result does not fit, it and the rest go through the pipe.
        piped: Optional[List[bytes]] = None
        for element in elements:
            reply, payload = call_one(op_kind, fn, element)
            if piped is None:
                if put(reply, payload):
                    continue
                piped = [region.written()]
            reply, body = encoded(reply, payload)
            piped.append(_RESULT_HEAD.pack(reply, len(body)))
            piped.append(body)
        nanos = time.perf_counter_ns() - start
        if piped is None:
            length = region.finish(nanos)
            _write_frame(out, RESULTS_SHARED, _SHARED_REF.pack(slot, length))
        else:
            region.finish(nanos)
            head = _RESULTS_HEAD.pack(len(elements), nanos)
            _write_frame_parts(out, RESULTS, [head, *piped])

    hello = {
        "python": _functions.python_version(),
        "cloudpickle": _functions.cloudpickle_version(),
        "pid": os.getpid(),
        "shared": region is not None,
    }
    _write_frame(out, HELLO, json.dumps(hello).encode())
    while True:
        frame = _read_frame(inp)
        if frame is None:
            return
        kind, body = frame
        (fid,) = _ID.unpack_from(body)
        if kind == BATCH_SHARED:
            op_kind, fn = functions[fid]
            slot, length = _SHARED_REF.unpack_from(body, _ID.size)
            batch_shared(op_kind, fn, slot, length)
        elif kind == BATCH:
            op_kind, fn = functions[fid]
            start = time.perf_counter_ns()
            try:
                elements = _native.decode_elements(body, _ID.size)
            except Exception as e:  # noqa: BLE001 - reported, the worker fails the batch
                _write_frame(out, ERROR, _exception_report(e))
                continue
            parts: List[bytes] = [b""]
            for element in elements:
                reply, payload = encoded(*call_one(op_kind, fn, element))
                parts.append(_RESULT_HEAD.pack(reply, len(payload)))
                parts.append(payload)
            parts[0] = _RESULTS_HEAD.pack(len(elements), time.perf_counter_ns() - start)
            _write_frame_parts(out, RESULTS, parts)
        elif kind == CALL:
            op_kind, fn = functions[fid]
            try:
                element = _native.decode_element(body, _ID.size)
            except Exception as e:  # noqa: BLE001 - reported as the call's error
                _write_frame(out, ERROR, _exception_report(e))
                continue
            _write_frame(out, *encoded(*call_one(op_kind, fn, element)))
        elif kind == LOAD:
            try:
                fn = _functions.load_function(body[_ID.size + 1 :])
                functions[fid] = (body[_ID.size], fn)
                _write_frame(out, LOADED)
            except Exception as e:  # noqa: BLE001 - unpickling runs user code
                _write_frame(out, ERROR, _exception_report(e))
        elif kind == UNLOAD:
            functions.pop(fid, None)
        else:
            raise SystemExit(f"sluice executor: unknown request kind {kind:#x}")


def main() -> None:
    # Ctrl-C at a terminal reaches the whole process group: the worker decides when its
    # executors stop (by closing their stdin or killing them).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    inp, out = _take_protocol_fds()
    serve(inp, out)


if __name__ == "__main__":
    main()

"""Prints the table of the ported tf.data tests that do not pass, from their marks, and the
tally by the class of the reason (missing, bug, not applicable, deliberate difference).

From python/tests, with the package under test installed::

    python -m tfdata_conformance.report            # the markdown section of docs/tfdata.md
    python -m tfdata_conformance.report --tally    # only the counts

It collects the cases (nothing runs), so the table is what the marks say; the pytest summary of
a run (conftest.py) gives the outcomes.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import re
import sys
from typing import Any, List, Optional, Tuple

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

#: The reason classes, in the order the report gives them.
CLASSES = ("missing", "bug", "not applicable", "deliberate difference")


class _Collector:
    def __init__(self) -> None:
        self.items: List[Any] = []

    def pytest_collection_modifyitems(self, items: List[Any]) -> None:
        self.items.extend(items)


def _mark(item: Any) -> Optional[Tuple[str, str]]:
    """``(class, reason)`` of the case's xfail or skip mark, or ``None``."""
    for name in ("skip", "xfail"):
        for marker in item.iter_markers(name=name):
            reason = str(marker.kwargs.get("reason", ""))
            kind = reason.split(":", 1)[0] if ":" in reason else "unclassified"
            return kind, reason.split(":", 1)[1].strip() if ":" in reason else reason
    return None


def _ported(item: Any) -> str:
    """The tf.data test a case ports, from its docstring (``Ports Class.testName``)."""
    doc = getattr(item.function, "__doc__", "") or ""
    match = re.search(r"Ports (\w+\.\w+)", doc)
    return match.group(1) if match else item.originalname


def collect() -> List[Any]:
    collector = _Collector()
    with contextlib.redirect_stdout(io.StringIO()):
        code = pytest.main(
            ["--collect-only", "-p", "no:cacheprovider", "-p", "no:terminal", HERE],
            plugins=[collector],
        )
    if code not in (0, 5):
        raise SystemExit(f"collecting {HERE} failed (pytest exit code {code})")
    return collector.items


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tally", action="store_true", help="print only the counts")
    args = parser.parse_args(argv)
    items = collect()
    rows = []
    counts: "collections.Counter[str]" = collections.Counter()
    for item in items:
        mark = _mark(item)
        if mark is None:
            counts["expected to pass"] += 1
            continue
        kind, reason = mark
        counts[kind] += 1
        case = item.nodeid.split("::", 1)[1]
        module = os.path.basename(item.nodeid.split("::", 1)[0])
        rows.append((kind, module, _ported(item), case, reason))
    out = sys.stdout
    tally = ", ".join(f"{counts[c]} {c}" for c in ("expected to pass",) + CLASSES)
    if args.tally:
        print(f"{len(items)} cases: {tally}", file=out)
        return 0
    print(f"{len(items)} cases: {tally}.", file=out)
    print(file=out)
    print("| class | file | tf.data test | case | reason |", file=out)
    print("|---|---|---|---|---|", file=out)
    order = {c: i for i, c in enumerate(CLASSES)}
    for kind, module, ported, case, reason in sorted(
        rows, key=lambda r: (order.get(r[0], 99), r[1], r[3])
    ):
        reason = reason.replace("|", "\\|")
        print(f"| {kind} | {module} | `{ported}` | `{case}` | {reason} |", file=out)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    raise SystemExit(main())

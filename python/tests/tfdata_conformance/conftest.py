"""The ported suite's fixtures and its tally: every cluster a case made is stopped when the case
ends, and the summary counts the cases by outcome and by the class of their marks' reasons."""

from __future__ import annotations

import collections
from typing import Any, Iterator

import pytest

from tfdata_conformance import _cluster


@pytest.fixture(autouse=True)
def _stop_clusters() -> Iterator[None]:
    yield
    _cluster.stop_live_clusters()


def _reason(report: Any) -> str:
    if hasattr(report, "wasxfail"):
        return str(report.wasxfail)
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _class(reason: str) -> str:
    return reason.split(":", 1)[0].strip() if ":" in reason else reason


def pytest_terminal_summary(terminalreporter: Any) -> None:
    def ours(report: Any) -> bool:
        return "tfdata_conformance" in report.nodeid and report.when in ("call", "setup")

    stats = terminalreporter.stats
    passed = [r for r in stats.get("passed", []) if ours(r) and r.when == "call"]
    xfailed = [r for r in stats.get("xfailed", []) if ours(r)]
    skipped = [r for r in stats.get("skipped", []) if ours(r)]
    failed = [r for r in stats.get("failed", []) if ours(r)]
    xpassed = [r for r in stats.get("xpassed", []) if ours(r)]
    if not (passed or xfailed or skipped or failed or xpassed):
        return
    total = len(passed) + len(xfailed) + len(skipped) + len(failed) + len(xpassed)
    tw = terminalreporter
    tw.section("tf.data's own tests, ported")
    tw.line(
        f"{total} cases: {len(passed)} passed, {len(failed)} failed, "
        f"{len(xpassed)} flaky ones passed"
    )
    by_class: "collections.Counter[str]" = collections.Counter()
    missing: "collections.Counter[str]" = collections.Counter()
    for r in xfailed + skipped:
        reason = _reason(r)
        by_class[_class(reason)] += 1
        if reason.startswith("missing:"):
            missing[reason.split(":", 1)[1].strip()] += 1
    for name in ("missing", "bug", "not applicable", "deliberate difference"):
        tw.line(f"  {name}: {by_class.pop(name, 0)}")
    for name, n in sorted(by_class.items()):
        tw.line(f"  {name}: {n}")
    for what, n in missing.most_common():
        tw.line(f"    missing {what}: {n}")

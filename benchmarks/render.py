"""Render an ``aiotier bench --json`` file as the Markdown of docs/benchmarks.md.

    python -m aiotier bench --json benchmarks/latest.json --plot docs/benchmarks.png
    python benchmarks/render.py benchmarks/latest.json > docs/benchmarks.md
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def render(doc: dict[str, Any]) -> str:
    m = doc.get("machine", {})
    lines = [
        "# Benchmarks",
        "",
        "Measured by `aiotier bench` on the project's CI-sized machine "
        f"(Python {m.get('python')}, {m.get('cpus')} CPUs, shared and noisy), aiotier "
        f"{doc.get('aiotier_version')}. Every figure is a median of alternating rounds; the "
        "floor (the fastest simple thing doing the same work) and the peer (what a user would "
        "pick instead) were measured in the same run, on the same data. **Ratios greater "
        "than 1 mean aiotier is better** (for lower-is-better units, `floor / aiotier`).",
        "",
        "Reproduce:",
        "",
        "```bash",
        "pip install -e '.[bench]'",
        "aiotier bench --json benchmarks/latest.json --plot docs/benchmarks.png",
        "python benchmarks/render.py benchmarks/latest.json > docs/benchmarks.md",
        "```",
        "",
        "`aiotier bench --quick` runs a small version in about a minute.",
        "",
        "![ratios per case](benchmarks.png)",
        "",
        "| case | parameters | aiotier | unit | floor | ratio | peer | ratio | notes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    known = {"name", "params", "unit", "higher_is_better", "aiotier", "floor", "peer",
             "ratio_to_floor", "ratio_to_peer", "skipped"}  # fmt: skip
    for c in doc["cases"]:
        params = ", ".join(f"{k}={v}" for k, v in c["params"].items())
        if c.get("skipped"):
            lines.append(f"| {c['name']} | {params} | skipped | | | | | | {c['skipped']} |")
            continue
        floor = c.get("floor") or {}
        peer = c.get("peer") or {}
        extras = {k: v for k, v in c.items() if k not in known}
        notes = "; ".join(f"{k}: {_fmt(v)}" for k, v in extras.items() if not isinstance(v, dict))
        for k, v in extras.items():
            if isinstance(v, dict):
                notes += ("; " if notes else "") + f"{k}: " + ", ".join(
                    f"{kk}={_fmt(vv)}" for kk, vv in v.items()
                )
        lines.append(
            f"| {c['name']} | {params} | {_fmt(c['aiotier'])} | {c['unit']} | "
            f"{_named(floor)} | {_fmt(c.get('ratio_to_floor'))} | {_named(peer)} | "
            f"{_fmt(c.get('ratio_to_peer'))} | {notes} |"
        )
    targets = os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets.md")
    if os.path.exists(targets):
        with open(targets) as f:
            lines += ["", f.read().rstrip()]
    return "\n".join(lines) + "\n"


def _named(m: dict[str, Any]) -> str:
    return "—" if not m else f"{_fmt(m.get('value'))} ({m.get('name', '')})"


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        sys.stdout.write(render(json.load(f)))

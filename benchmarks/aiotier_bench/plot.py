"""Draw a bench JSON as bars of ratios (greater than 1 means aiotier is better); the trace cases
as hit ratio against capacity, beside it (:mod:`.trace_plot`)."""

from __future__ import annotations

from typing import Any

__all__ = ["plot"]


def plot(doc: dict[str, Any], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError("--plot needs matplotlib: pip install 'aiotier[bench]'") from exc

    from .trace_plot import TRACE_CASES, plot_traces, trace_plot_path

    plot_traces(doc, trace_plot_path(path))  # hit ratio against capacity, a figure of its own
    labels: list[str] = []
    floors: list[float] = []
    peers: list[float] = []
    for c in doc["cases"]:
        if c["name"] in TRACE_CASES:
            continue
        if c.get("skipped") or (c["ratio_to_floor"] is None and c["ratio_to_peer"] is None):
            continue
        params = ",".join(f"{k}={v}" for k, v in c["params"].items() if k != "ops")
        labels.append(f"{c['name']}\n{params}"[:60])
        floors.append(c["ratio_to_floor"] or 0.0)
        peers.append(c["ratio_to_peer"] or 0.0)
    fig, ax = plt.subplots(figsize=(max(8, len(labels) * 0.9), 6))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], floors, width=0.4, label="vs floor")
    ax.bar([x + 0.2 for x in xs], peers, width=0.4, label="vs peer")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(list(xs), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("ratio (>1: aiotier better)")
    ax.set_title(f"aiotier {doc.get('aiotier_version', '')} benchmarks")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

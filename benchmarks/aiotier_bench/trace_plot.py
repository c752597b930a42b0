"""Draw the ``trace`` cases of a bench JSON: hit ratio against capacity, one line per policy and
admission, with the offline optimum, the infinite cache and vLLM's managers, one panel a trace."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["TRACE_CASES", "plot_traces", "trace_plot_path"]

#: The case names the trace bench writes (drawn here, not among the ratio bars).
TRACE_CASES = ("trace", "trace_tiered")


def trace_plot_path(path: str) -> str:
    """Where the trace figure goes beside the suite's figure ``path``: ``NAME-traces.png``."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}-traces{p.suffix or '.png'}"))


_MARKERS = {"lru": "o", "arc": "s", "lfuda": "^"}
_LINES = {"all": "-", "after:2": "--", "tinylfu": ":"}


def plot_traces(doc: dict[str, Any], path: str) -> bool:
    """Write the figure to ``path``; False (nothing written) when ``doc`` has no trace case."""
    cases = [c for c in doc["cases"] if c["name"] == "trace" and not c.get("skipped")]
    if not cases:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_trace: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in cases:
        by_trace[c["params"]["trace"]].append(c)
    fig, axes = plt.subplots(
        1, len(by_trace), figsize=(max(6.5 * len(by_trace), 10), 5.5), squeeze=False
    )
    for ax, (name, rows) in zip(axes[0], sorted(by_trace.items()), strict=True):
        lines: dict[str, dict[float, float]] = defaultdict(dict)
        for c in rows:
            p = c["params"]
            share = p["capacity_share"] * 100
            lines[f"{p['policy']}, {p['admission']}"][share] = c["hit_ratio"]
            lines["offline optimum"][share] = c["optimum_hit_ratio"]
            lines["infinite cache"][share] = c["infinite_hit_ratio"]
            if isinstance(c.get("vllm"), dict):
                for policy, fig_ in c["vllm"].items():
                    lines[f"vLLM {policy}"][share] = fig_["hit_ratio"]
        for label, points in lines.items():
            xs = sorted(points)
            policy, _, admission = label.partition(", ")
            # one marker per eviction policy, one line style per admission: legible in grey too
            style: dict[str, Any] = {
                "marker": _MARKERS.get(policy, "o"),
                "linestyle": _LINES.get(admission, "-"),
                "linewidth": 1.2,
            }
            if label == "offline optimum":
                style = {"color": "black", "linestyle": "--", "linewidth": 2}
            elif label == "infinite cache":
                style = {"color": "grey", "linestyle": ":", "linewidth": 2}
            elif label.startswith("vLLM"):
                style = {"marker": "x", "linestyle": "-.", "linewidth": 1.5}
            ax.plot(xs, [points[x] for x in xs], label=label, **style)
        ax.set_xscale("log")
        ax.minorticks_off()
        xs = sorted({c["params"]["capacity_share"] * 100 for c in rows})
        ax.set_xticks(xs, [f"{x:g}%" for x in xs])
        ax.set_xlabel("capacity (share of the trace's unique blocks)")
        ax.set_ylabel("block hit ratio")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{name} ({rows[0]['params']['requests']:,} requests)")
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=8)
    fig.tight_layout(rect=(0, 0.1, 1, 1))  # room for the shared legend below the panels
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True

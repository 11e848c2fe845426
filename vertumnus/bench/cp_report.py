"""``vertumnus bench cp`` around :func:`vertumnus.bench.cp.run_cp_bench`: the model resolved from a preset or a
checkpoint directory, the MoE-vs-dense figure added for an MoE model, and the text report."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_cp_bench_for(
    tokens: int,
    degrees: tuple[int, ...],
    model: str | None,
    *,
    repeats: int,
    progress: Callable[[str], None] | None = None,
    **shape: Any,
) -> dict[str, Any]:
    """Run the CP benchmark on ``model`` (a preset name, a Hugging Face checkpoint directory, or None: the
    Llama-style ``shape`` options); for an MoE model also :func:`~vertumnus.bench.cp.moe_vs_dense`."""
    from vertumnus.bench.cp import moe_vs_dense, run_cp_bench
    from vertumnus.cp.qwen3 import PRESETS, write_preset

    with tempfile.TemporaryDirectory(prefix="vertumnus-bench-") as tmp:
        path: str | None = None
        if model in PRESETS:
            path = str(write_preset(model, Path(tmp) / model))
        elif model is not None:
            if not (Path(model) / "config.json").is_file():
                raise ValueError(
                    f"--model {model!r} is neither a preset ({', '.join(PRESETS)}) nor a directory with a config.json"
                )
            path = model
        res = run_cp_bench(tokens, degrees, repeats=repeats, progress=progress, model_path=path, **shape)
        if path is not None and res["model"]["experts"]:
            if progress is not None:
                progress("MoE vs dense of the same active size (this process, 1 thread)")
            hf = json.loads((Path(path) / "config.json").read_text())
            res["moe_vs_dense"] = moe_vs_dense(hf, tokens, repeats)
    return res


def report_lines(res: dict[str, Any], model: str | None) -> list[str]:
    """The text report of one :func:`run_cp_bench_for` result."""
    m = res["model"]
    moe = f", {m['experts']} experts top-{m['top_k']} × {m['expert_intermediate']}" if m["experts"] else ""
    out = [
        f"zigzag CP prefill, {m['type']}{f' ({model})' if model else ''}, {res['tokens']} tokens, "
        f"{m['layers']} layers, hidden {m['hidden']}, {m['heads']}/{m['kv_heads']} heads × {m['head_dim']}"
        f"{moe}, {m['dtype']}, {res['attention']} attention, "
        f"1 thread per rank, {res['machine']['cpus']} CPUs (load before {res['load_avg_before'][0]}, "
        f"after {res['load_avg_after'][0]})",
        f"{'degree':>6} {'prefill s':>10} {'rank compute s':>15} {'speed-up':>9} {'rank CPU s':>11} {'CPU x':>6}",
    ]
    for d in sorted(res["prefill_s"], key=int):
        sp, cs = res["speedup"][d], res["cpu_speedup"][d]
        out.append(
            f"{d:>6} {res['prefill_s'][d]:>10.3f} {res['compute_s'][d]:>15.3f} "
            f"{'' if sp is None else f'{sp:.2f}x':>9} {res['rank_cpu_s'][d]:>11.3f} "
            f"{'' if cs is None else f'{cs:.2f}x':>6}"
        )
    for kind in ("split", "merge"):
        if kind in res["switch_s"]:
            park, switch = res["park_s"][kind] * 1e3, res["switch_s"][kind] * 1e3
            out.append(f"{kind}: park {park:.1f} ms, switch {switch:.1f} ms")
    if "moe_vs_dense" in res:
        r = res["moe_vs_dense"]
        mu, lu = r["model_us_per_token"], r["mlp_us_per_token"]
        out.append(
            f"MoE vs dense (MLP width {r['dense_intermediate']}), {r['tokens']} tokens, per token: "
            f"whole forward {mu['moe']:.1f} vs {mu['dense']:.1f} us ({r['model_ratio']:.2f}x), "
            f"MLP block {lu['moe']:.2f} vs {lu['dense']:.2f} us ({r['mlp_ratio']:.2f}x)"
        )
    return out

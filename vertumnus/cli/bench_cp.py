"""`vertumnus bench cp`: measured zigzag-CP prefill speed-up and split / merge durations of the torch engine."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import typer


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``bench cp``."""

    @bench_app.command("cp")
    def bench_cp(
        tokens: int | None = typer.Option(
            None, help="Prompt length (uncached tokens) per prefill [default: 16384; 8192 with --model]."
        ),
        model: str | None = typer.Option(
            None,
            "--model",
            help="A model instead of the Llama-style shape options: a preset (tiny-qwen3, tiny-qwen3-moe; random "
            "weights) or a local Hugging Face checkpoint directory (Llama, Qwen3, Qwen3-MoE).",
        ),
        degrees: str = typer.Option("1,2", help="Comma-separated CP degrees (powers of two); ranks = the largest."),
        layers: int = typer.Option(2, help="Transformer layers of the benchmark model."),
        hidden: int = typer.Option(512, help="Hidden size (head dim = hidden / heads)."),
        heads: int = typer.Option(8, help="Query heads."),
        kv_heads: int = typer.Option(2, help="KV heads (GQA)."),
        intermediate: int = typer.Option(1024, help="SwiGLU intermediate size."),
        repeats: int = typer.Option(2, help="Prefills per degree; the fastest is reported."),
        attention: str = typer.Option("auto", help="Chunk attention: auto, flash_lse, mask, causal_lr."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    ) -> None:
        """Prefill time per CP degree on this CPU (one thread per rank), speed-up over degree 1, and the
        park / switch durations of the splits and merges between them; for a Qwen3-MoE model also the MoE
        path's per-token time against a dense model of the same active size. Figures, not assertions."""
        from vertumnus.cp.qwen3 import PRESETS, write_preset
        from vertumnus.engines.torch.bench import moe_vs_dense, run_cp_bench

        if tokens is None:
            tokens = 8192 if model else 16384

        try:
            degs = tuple(int(d) for d in degrees.split(",") if d.strip())
        except ValueError:
            raise ValueError(f"--degrees must be comma-separated integers, got {degrees!r}") from None
        if tokens < 1 or repeats < 1 or layers < 1:
            raise ValueError("--tokens, --repeats and --layers must be positive")
        if hidden % heads or heads % kv_heads:
            raise ValueError("hidden must be a multiple of heads, and heads a multiple of kv-heads")
        with tempfile.TemporaryDirectory(prefix="vertumnus-bench-") as tmp:
            path: str | None = None
            if model in PRESETS:
                path = str(write_preset(model, Path(tmp) / model))
            elif model is not None:
                if not (Path(model) / "config.json").is_file():
                    raise ValueError(
                        f"--model {model!r} is neither a preset ({', '.join(PRESETS)}) nor a directory with a "
                        "config.json"
                    )
                path = model
            res = run_cp_bench(
                tokens,
                degs,
                layers=layers,
                hidden=hidden,
                heads=heads,
                kv_heads=kv_heads,
                intermediate=intermediate,
                repeats=repeats,
                attn_impl=attention,
                progress=None if as_json else (lambda msg: typer.echo(f"  {msg}")),
                model_path=path,
            )
            if path is not None and res["model"]["experts"]:
                if not as_json:
                    typer.echo("  MoE vs dense of the same active size (this process, 1 thread)")
                hf = json.loads((Path(path) / "config.json").read_text())
                res["moe_vs_dense"] = moe_vs_dense(hf, tokens, repeats)
        if as_json:
            typer.echo(json.dumps(res, indent=2))
            return
        m = res["model"]
        moe = f", {m['experts']} experts top-{m['top_k']} × {m['expert_intermediate']}" if m["experts"] else ""
        typer.echo(
            f"zigzag CP prefill, {m['type']}{f' ({model})' if model else ''}, {res['tokens']} tokens, "
            f"{m['layers']} layers, hidden {m['hidden']}, {m['heads']}/{m['kv_heads']} heads × {m['head_dim']}"
            f"{moe}, {m['dtype']}, {res['attention']} attention, "
            f"1 thread per rank, {res['machine']['cpus']} CPUs (load before {res['load_avg_before'][0]}, "
            f"after {res['load_avg_after'][0]})"
        )
        typer.echo(
            f"{'degree':>6} {'prefill s':>10} {'rank compute s':>15} {'speed-up':>9} {'rank CPU s':>11} {'CPU x':>6}"
        )
        for d in sorted(res["prefill_s"], key=int):
            sp, cs = res["speedup"][d], res["cpu_speedup"][d]
            typer.echo(
                f"{d:>6} {res['prefill_s'][d]:>10.3f} {res['compute_s'][d]:>15.3f} "
                f"{'' if sp is None else f'{sp:.2f}x':>9} {res['rank_cpu_s'][d]:>11.3f} "
                f"{'' if cs is None else f'{cs:.2f}x':>6}"
            )
        for kind in ("split", "merge"):
            if kind in res["switch_s"]:
                park, switch = res["park_s"][kind] * 1e3, res["switch_s"][kind] * 1e3
                typer.echo(f"{kind}: park {park:.1f} ms, switch {switch:.1f} ms")
        if "moe_vs_dense" in res:
            r = res["moe_vs_dense"]
            mu, lu = r["model_us_per_token"], r["mlp_us_per_token"]
            typer.echo(
                f"MoE vs dense (MLP width {r['dense_intermediate']}), {r['tokens']} tokens, per token: "
                f"whole forward {mu['moe']:.1f} vs {mu['dense']:.1f} us ({r['model_ratio']:.2f}x), "
                f"MLP block {lu['moe']:.2f} vs {lu['dense']:.2f} us ({r['mlp_ratio']:.2f}x)"
            )

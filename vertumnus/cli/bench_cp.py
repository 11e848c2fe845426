"""`vertumnus bench cp`: measured zigzag-CP prefill speed-up and split / merge durations of the torch engine."""

from __future__ import annotations

import json

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
        from vertumnus.bench.cp_report import report_lines, run_cp_bench_for

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
        res = run_cp_bench_for(
            tokens,
            degs,
            model,
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            intermediate=intermediate,
            repeats=repeats,
            attn_impl=attention,
            progress=None if as_json else (lambda msg: typer.echo(f"  {msg}")),
        )
        if as_json:
            typer.echo(json.dumps(res, indent=2))
            return
        for line in report_lines(res, model):
            typer.echo(line)

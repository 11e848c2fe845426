"""`vertumnus bench cp`: measured zigzag-CP prefill speed-up and split / merge durations of the torch engine."""

from __future__ import annotations

import json

import typer


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``bench cp``."""

    @bench_app.command("cp")
    def bench_cp(
        tokens: int = typer.Option(16384, help="Prompt length (uncached tokens) per prefill."),
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
        park / switch durations of the splits and merges between them. Figures, not assertions."""
        from vertumnus.engines.torch.bench import run_cp_bench

        try:
            degs = tuple(int(d) for d in degrees.split(",") if d.strip())
        except ValueError:
            raise ValueError(f"--degrees must be comma-separated integers, got {degrees!r}") from None
        if tokens < 1 or repeats < 1 or layers < 1:
            raise ValueError("--tokens, --repeats and --layers must be positive")
        if hidden % heads or heads % kv_heads:
            raise ValueError("hidden must be a multiple of heads, and heads a multiple of kv-heads")
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
        )
        if as_json:
            typer.echo(json.dumps(res, indent=2))
            return
        m = res["model"]
        typer.echo(
            f"zigzag CP prefill, {res['tokens']} tokens, {m['layers']} layers, hidden {m['hidden']}, "
            f"{m['heads']}/{m['kv_heads']} heads × {m['head_dim']}, fp32, {res['attention']} attention, "
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

"""`vertumnus tokenizer export`: the tiny model's byte tokenizer as a Hugging Face tokenizer directory."""

from __future__ import annotations

from pathlib import Path

import typer

from vertumnus.config import load_config


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    tok_app = typer.Typer(help="The server's tokenizer for third-party clients.", no_args_is_help=True)
    app.add_typer(tok_app, name="tokenizer")

    @tok_app.command("export")
    def export(
        out: Path = typer.Option(..., "--out", "-o", help="Directory to write (created if missing)."),
        config: Path | None = typer.Option(None, "--config", "-c", help="YAML config (its model.vocab_size)."),
        force: bool = typer.Option(False, "--force", help="Overwrite a tokenizer already in --out."),
    ) -> None:
        """Write tokenizer.json / tokenizer_config.json (with the chat template) that encode exactly as the
        server's byte-level tokenizer, for clients such as `vllm bench serve --tokenizer DIR`."""
        from vertumnus.serving.tokenizer_export import export_byte_tokenizer

        cfg = load_config(config)
        if cfg.serving.tokenizer:
            raise ValueError(
                f"this config serves the Hugging Face tokenizer {cfg.serving.tokenizer}; point clients at it"
            )
        for p in export_byte_tokenizer(cfg.model.vocab_size, out, cfg.pool.max_model_len, force=force):
            typer.echo(f"wrote {p}")

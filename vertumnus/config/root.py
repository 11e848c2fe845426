"""The whole configuration tree and its cross-section checks."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from vertumnus.config._base import REPO_ROOT, KeyedError, Section
from vertumnus.config.cache import CacheConfig
from vertumnus.config.controller import ControllerConfig
from vertumnus.config.model import CostModelConfig, ModelConfig, SLOConfig
from vertumnus.config.pool import PoolConfig
from vertumnus.config.scheduler import SchedulerConfig
from vertumnus.config.serving import ServingConfig
from vertumnus.config.vllm import VllmConfig


class VertumnusConfig(Section):
    pool: PoolConfig = Field(
        default_factory=PoolConfig, description="The prefill pool: nodes, GPUs (rank slots), CP degrees, engine."
    )
    scheduler: SchedulerConfig = Field(
        default_factory=SchedulerConfig, description="Request placement cost (DESIGN.md §1)."
    )
    controller: ControllerConfig = Field(
        default_factory=ControllerConfig, description="Window-based split / merge of workers (DESIGN.md §2)."
    )
    cache: CacheConfig = Field(
        default_factory=CacheConfig, description="Prefix cache: trie blocks, replication and reclamation scans."
    )
    cost_model: CostModelConfig = Field(
        default_factory=CostModelConfig, description="Prefill-time model E_C(R, P) and capacity κ_C."
    )
    slo: SLOConfig = Field(default_factory=SLOConfig, description="TTFT service-level objective.")
    model: ModelConfig = Field(
        default_factory=ModelConfig, description="The tiny reference model served by the torch engine."
    )
    serving: ServingConfig = Field(
        default_factory=ServingConfig, description="The HTTP server (vertumnus serve) and its decode side."
    )
    vllm: VllmConfig = Field(default_factory=VllmConfig, description="The pool.engine: vllm backend (docs/vllm.md).")

    @model_validator(mode="after")
    def _kv_export_needs_torch_and_decode_url(self) -> VertumnusConfig:
        if self.serving.kv_export_path and (self.pool.engine != "torch" or not self.serving.decode_url):
            raise KeyedError(
                "serving.kv_export_path",
                "exports the torch engine's prefill KV for an external decode endpoint: needs pool.engine: torch "
                "and serving.decode_url",
            )
        return self

    @model_validator(mode="after")
    def _engine_block_divides_cache_block(self) -> VertumnusConfig:
        # A trie node must cover whole engine blocks (DESIGN.md §3); the vLLM data plane would otherwise fail
        # only when it starts its first engine. The hashed vLLM block spans block_size × DCP tokens.
        if self.pool.engine != "vllm":
            return self
        if self.cache.replication and self.cache.policy == "queue_aware" and self.vllm.replication == "recompute":
            # queue_aware prices a prefix copied in before a prefill at link speed; a recomputing "copy" would
            # cost a prefill of the prefix on the request's path instead. Asked for by name, that is an error;
            # merely defaulted (vllm.replication defaults to recompute, so this is every vLLM config that never
            # mentions cache.policy), it resolves to the one policy that engine setting supports. The resolved
            # value is a real field value: `vertumnus config show` and dump_config print it.
            if "policy" in self.cache.model_fields_set:
                raise KeyedError(
                    "cache.policy",
                    "queue_aware copies prefixes over the link; with vllm.replication: recompute a copy is a "
                    "prefill of the prefix — set vllm.replication: transfer (a KV connector) or cache.policy: rules",
                )
            # A copy, not an in-place assignment: a CacheConfig passed in by the caller is not mutated.
            self.cache = self.cache.model_copy(update={"policy": "rules"})
        bt, bs = self.cache.block_tokens, self.vllm.block_size
        if bt % bs:
            raise KeyedError("vllm.block_size", f"{bs} tokens does not divide cache.block_tokens={bt}")
        dcp = self.vllm.engine_args.get("decode_context_parallel_size", 1)
        if isinstance(dcp, int) and dcp > 1 and bt % (bs * dcp):
            raise KeyedError(
                "vllm.engine_args.decode_context_parallel_size",
                f"the hashed block of block_size {bs} × DCP {dcp} = {bs * dcp} tokens does not divide "
                f"cache.block_tokens={bt}",
            )
        return self

    def resolve_path(self, p: str) -> Path:
        """Resolve a config-relative path: absolute, else CWD if it exists, else the repository root."""
        path = Path(p)
        if path.is_absolute() or path.exists():
            return path
        return REPO_ROOT / path

"""The vLLM worker backend (``pool.engine: vllm``): one vLLM engine per CP worker, KV events into the trie,
P/D hand-off through KV connectors. See docs/vllm.md.

Modules: ``hashing`` (vLLM block hashes outside vLLM), ``events`` / ``subscriber`` (KV-event feed),
``blockmap`` (engine blocks → trie blocks), ``engine_args`` / ``placement`` / ``actor`` / ``worker`` (engines on
Ray), ``data_plane`` / ``ops`` / ``restart`` (the DataPlane, cache ops, engine restarts), ``decode`` (embedded
decode engine), ``serving`` (factories used by the server), ``metrics`` (counters, Prometheus collector). The
profiling hook is ``EngineActor.profile_prefill`` (queue-free prefill of (r, p); used by
:mod:`vertumnus.profiling.vllm_target`). Importing this package does not import vLLM; the engine actors do.
"""

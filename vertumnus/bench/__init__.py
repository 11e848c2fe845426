"""Benchmarks that print measured figures (not tests): the control plane, the cache trie, the serving front end,
the torch engine's CP prefill, the profile fits and the cache-policy tuning sweep. ``vertumnus bench ...`` commands
(vertumnus/cli/bench_*.py) register thin commands over these modules."""

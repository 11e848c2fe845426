"""Global prefix trie over all workers' KV caches; replication and reclamation (DESIGN.md §3)."""

"""Zigzag context-parallel prefill data plane in PyTorch (DESIGN.md §4)."""


"""Vertumnus: adaptive context-parallel prefill-pool controller for P/D-disaggregated LLM serving."""

__version__ = "0.1.0"

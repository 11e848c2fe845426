"""Prefill pool scheduler: eligibility, cache-aware placement cost J, reservation (DESIGN.md §1)."""


"""Measurement: `vertumnus profile` targets, the cost model's fitting and per-degree capacities."""

"""Trace-driven discrete-event simulator, workloads, baselines and reports."""

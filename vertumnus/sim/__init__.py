"""Trace-driven discrete-event simulator: runner, workloads, metrics, baselines and the references the runner drives."""

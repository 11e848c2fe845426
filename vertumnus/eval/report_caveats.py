"""The caveats of docs/results.md: where the cost profile comes from (a calibrated or modelled profile is not a
measurement) and the limits of the simulation (its section 6)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vertumnus.eval.report import Report


def profile_notice(rep: Report) -> str:
    """The report's warning about where E_C comes from: a calibrated profile is not a measurement."""
    prof = rep.cost.profile
    where = f"`{rep.cfg.cost_model.profile}` (source: *{prof.source}*; {prof.model} on {prof.hardware})"
    if prof.source == "calibrated":
        return (
            f"> **The cost profile is calibrated, not measured.** The simulator charges E_C(R, P) from {where}: "
            "its coefficients were fitted to published speed-ups (for the default profile: the paper's "
            "Qwen3-30B-A3B, C=4: 2.71×, C=8: 3.91× at 64K tokens), not measured on the hardware. Absolute TTFTs "
            "are model outputs; all policies share the same model, the same workloads and the same simulated "
            "engine.\n"
        )
    if prof.source == "modelled":
        return (
            f"> **The cost profile is modelled, not measured or calibrated.** The simulator charges E_C(R, P) from "
            f"{where}: `vertumnus profile --engine {prof.engine}` fitted it to predicted prefill times (kernel sums "
            "without framework overhead, so optimistic, and extrapolated beyond the model's data; its notes say "
            "how far). Absolute TTFTs are model outputs; all policies share the same model, the same workloads "
            "and the same simulated engine.\n"
        )
    return (
        f"> The simulator charges E_C(R, P) from {where}, fitted by `vertumnus profile` to measured prefill times. "
        "Absolute TTFTs are model outputs of that fit; all policies share the same model, the same workloads and "
        "the same simulated engine.\n"
    )


def limits(source: str) -> str:
    """Section 6, with the first bullet following the profile's source."""
    if source == "calibrated":
        first = (
            "- The cost profile is calibrated to published speed-ups, not measured; κ_C (capacity per window) in it "
            "is an\n  assumption (the default's: 7 s of predicted work per 10-s window for every degree) until "
            "`vertumnus profile` measures it.\n"
        )
    elif source == "modelled":
        first = (
            "- The cost profile is modelled (predicted kernel times, not measured): optimistic, and extrapolated "
            "beyond\n  the model's data; its per-degree fit error (MAPE) is against the model, not hardware.\n"
        )
    else:
        first = "- The cost profile was measured by `vertumnus profile`; its per-degree fit error (MAPE) is in it.\n"
    return first + LIMITS


LIMITS = """- Engines are idealised: a worker runs one prefill at a time for exactly E_C(R, P) (no batching, no jitter);
  cache copies run beside compute and do not share link bandwidth with each other.
- Per-worker caches hold whole 512-token blocks with LRU eviction; block b of a prefix lives on rank b mod C,
  so a split leaves each child every other stripe (reconciled from the sibling on first reuse).
- Rates above a trace's own are reached by compressing its arrival times, which keeps its order and prefix
  reuse but also compresses think times between conversation turns.
- Controller and cache parameters are the config's (`configs/sim-40gpu.yaml`), the same for every experiment.
  The predictive controller's margins and the cache's `fetch_max_queue_s` / `hot_min_blocks` were chosen on the
  out-of-sample tuning sets (`configs/eval/tuning.yaml`, `configs/eval/cache-tuning.yaml`); the rule
  controller's band (read only under `controller.policy: rules`) was chosen on the time-varying workload of §2,
  in sample. Sections 1-3 and 7 are not out of sample: only the two out-of-sample sections below are.
"""

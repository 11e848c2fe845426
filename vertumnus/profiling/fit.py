"""Fit E_C coefficients from queue-free profile samples by non-negative least squares.

Rows are weighted by 1/seconds so the fit minimises *relative* error: a profile spans milliseconds (short
prompts) to seconds (long ones), and plain least squares would ignore the short end that routing of short
requests depends on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vertumnus.profiling.cost_model import CostProfile, DegreeProfile, attention_work


@dataclass(slots=True, frozen=True)
class ProfileSample:
    """One queue-free measurement: degree C, uncached R, cached P, seconds."""

    degree: int
    r: int
    p: int
    seconds: float


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """Lawson–Hanson active-set NNLS: argmin ||A x − b||₂ subject to x ≥ 0."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * np.linalg.norm(a, 1) * max(m, n)
    max_iter = max_iter or 3 * n
    w = a.T @ (b - a @ x)
    it = 0
    while (~passive).any() and (w[~passive] > tol).any() and it < max_iter:
        it += 1
        j = np.flatnonzero(~passive)[np.argmax(w[~passive])]
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            step = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + step * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        w = a.T @ (b - a @ x)
    return x


def design_matrix(degree: int, r: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Columns d, a, b, c, alpha of E_C for arrays of R and P."""
    r = np.asarray(r, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    return np.column_stack([np.ones_like(r), r, p, r / degree, attention_work(r, p) / degree])


@dataclass(slots=True)
class DegreeFit:
    degree: int
    profile: DegreeProfile
    samples: int
    mape: float
    max_error: float  # largest relative error
    worst: ProfileSample | None  # the sample with the largest relative error


def fit_degree(degree: int, samples: list[ProfileSample]) -> DegreeFit:
    """Fit one degree's coefficients; raises ValueError with fewer samples than coefficients."""
    rows = [s for s in samples if s.degree == degree]
    if len(rows) < 5:
        raise ValueError(f"degree {degree}: need at least 5 samples to fit 5 coefficients, got {len(rows)}")
    r = np.array([s.r for s in rows], dtype=np.float64)
    p = np.array([s.p for s in rows], dtype=np.float64)
    y = np.array([s.seconds for s in rows], dtype=np.float64)
    if (y <= 0).any():
        raise ValueError(f"degree {degree}: sample times must be positive")
    x = design_matrix(degree, r, p)
    # Scale columns to unit norm so the active-set tolerances mean the same for every coefficient.
    wx = x / y[:, None]
    scale = np.linalg.norm(wx, axis=0)
    scale[scale == 0] = 1.0
    coef = nnls(wx / scale, np.ones_like(y)) / scale
    pred = x @ coef
    rel = np.abs(pred - y) / y
    k = int(np.argmax(rel))
    prof = DegreeProfile(*map(float, coef), mape=float(rel.mean()), max_error=float(rel.max()))
    return DegreeFit(degree, prof, len(rows), prof.mape or 0.0, prof.max_error or 0.0, rows[k])


def fit_profile(samples: list[ProfileSample], **meta: str) -> tuple[CostProfile, list[DegreeFit]]:
    """Fit every degree present in ``samples``; meta goes to the profile (engine, model, hardware...)."""
    degrees = sorted({s.degree for s in samples})
    if not degrees:
        raise ValueError("no samples to fit")
    fits = [fit_degree(c, samples) for c in degrees]
    profile = CostProfile(degrees={f.degree: f.profile for f in fits}, **meta)  # type: ignore[arg-type]
    return profile, fits

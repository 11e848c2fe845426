"""Fit E_C coefficients from queue-free profile samples by non-negative least squares.

Rows are weighted by 1/seconds so the fit minimises *relative* error: a profile spans milliseconds (short
prompts) to seconds (long ones), and plain least squares would ignore the short end that routing of short
requests depends on.

Identifiability: within one degree, a·R and c·R/C are the same column, so samples of one degree determine only
k_C = a_C + c_C/C. We fit (d, k, b, alpha) per degree and split k afterwards: token-local compute c is the same
work at every degree (only divided C ways), so c is taken from degree 1 (where a_1 = 0 by definition: one rank
has no CP communication) and a_C = max(k_C − c/C, 0); without a degree-1 fit, c = C·k_C and a_C = 0. The split
never changes a prediction by more than the clamp (reported in the fit's errors).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vertumnus.cost_model import CostProfile, DegreeProfile, attention_work


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
    """Identifiable columns d, k (= a + c/C), b, alpha of E_C for arrays of R and P."""
    r = np.asarray(r, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    return np.column_stack([np.ones_like(r), r, p, attention_work(r, p) / degree])


@dataclass(slots=True)
class DegreeFit:
    degree: int
    profile: DegreeProfile
    samples: int
    mape: float
    max_error: float  # largest relative error
    worst: ProfileSample | None  # the sample with the largest relative error


def fit_degree(degree: int, samples: list[ProfileSample], token_compute: float | None = None) -> DegreeFit:
    """Fit one degree's coefficients; raises ValueError with too few samples.

    ``token_compute``: c (per-token compute before the C-way split) from degree 1, used to split k into a and c.
    """
    rows = [s for s in samples if s.degree == degree]
    if len(rows) < 5:
        raise ValueError(f"degree {degree}: need at least 5 samples to fit the coefficients, got {len(rows)}")
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
    d, k, b, alpha = (float(v) for v in nnls(wx / scale, np.ones_like(y)) / scale)
    c = degree * k if token_compute is None else min(token_compute, degree * k)
    a = max(k - c / degree, 0.0)
    prof = DegreeProfile(d=d, a=a, b=b, c=c, alpha=alpha)
    pred = d + a * r + b * p + (c * r + alpha * attention_work(r, p)) / degree
    rel = np.abs(pred - y) / y
    worst = int(np.argmax(rel))
    prof.mape, prof.max_error = float(rel.mean()), float(rel.max())
    return DegreeFit(degree, prof, len(rows), prof.mape, prof.max_error, rows[worst])


def fit_profile(samples: list[ProfileSample], **meta: str) -> tuple[CostProfile, list[DegreeFit]]:
    """Fit every degree present in ``samples``; meta goes to the profile (engine, model, hardware...)."""
    degrees = sorted({s.degree for s in samples})
    if not degrees:
        raise ValueError("no samples to fit")
    fits: list[DegreeFit] = []
    token_compute: float | None = None
    for c in degrees:  # ascending: degree 1 (if measured) fixes c for the others
        fit = fit_degree(c, samples, token_compute)
        if c == 1:
            token_compute = fit.profile.c
        fits.append(fit)
    profile = CostProfile(degrees={f.degree: f.profile for f in fits}, **meta)  # type: ignore[arg-type]
    return profile, fits

"""The prefill time model shared by scheduler, controller, cache manager and simulator.

    E_C(R, P) = d_C + a_C·R + b_C·P + (c_C·R + α_C·W(R, P)) / C,      W(R, P) = R·P + R(R+1)/2

R: uncached suffix tokens, P: cached prefix tokens, C: CP degree. One :class:`CostModel` instance answers
both scalar questions (the scheduler's hot path) and numpy-vectorised ones (the cache manager's marginal
benefits along a trie path, the simulator's bulk predictions).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

COEFFICIENTS = ("d", "a", "b", "c", "alpha")


def attention_work(r: Any, p: Any) -> Any:
    """W(R, P) = R·P + R(R+1)/2 — remaining causal attention work (scalar or array)."""
    return r * p + r * (r + 1) / 2


@dataclass(slots=True)
class DegreeProfile:
    """Coefficients of one degree plus fit quality and capacity.

    ``kappa``: κ_C, the largest window demand (Σ Ê seconds per window of ``CostProfile.kappa_window_s``) one
    worker of this degree serves while meeting the target token-weighted SLO attainment.
    """

    d: float
    a: float
    b: float
    c: float
    alpha: float
    mape: float | None = None
    max_error: float | None = None
    kappa: float | None = None

    def __post_init__(self) -> None:
        for name in COEFFICIENTS:
            v = getattr(self, name)
            if not np.isfinite(v) or v < 0:
                raise ValueError(f"coefficient {name}={v} must be finite and ≥ 0")


@dataclass(slots=True)
class CostProfile:
    """A cost profile file: per-degree coefficients and where they came from."""

    degrees: dict[int, DegreeProfile]
    source: str = "measured"  # "measured" or "calibrated"
    engine: str = "unknown"
    model: str = "unknown"
    hardware: str = "unknown"
    date: str = field(default_factory=lambda: _dt.date.today().isoformat())
    notes: str = ""
    kappa_window_s: float = 10.0

    def save(self, path: str | Path) -> None:
        """Write the profile as YAML (parts named plainly)."""
        data: dict[str, Any] = {
            "source": self.source,
            "engine": self.engine,
            "model": self.model,
            "hardware": self.hardware,
            "date": self.date,
            "notes": self.notes,
            "kappa_window_s": self.kappa_window_s,
            "degrees": {int(c): {k: _plain(v) for k, v in asdict(p).items()} for c, p in sorted(self.degrees.items())},
        }
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(yaml.safe_dump(data, sort_keys=False))

    @classmethod
    def load(cls, path: str | Path) -> CostProfile:
        """Read a profile YAML; raises ValueError naming the problem."""
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text())
        except FileNotFoundError:
            raise ValueError(f"cost profile not found: {p}") from None
        except yaml.YAMLError as e:
            raise ValueError(f"cost profile {p} is not valid YAML: {e}") from None
        if not isinstance(data, dict) or not isinstance(data.get("degrees"), dict) or not data["degrees"]:
            raise ValueError(f"cost profile {p}: expected a mapping with a non-empty 'degrees' section")
        degrees: dict[int, DegreeProfile] = {}
        for c, coeffs in data["degrees"].items():
            try:
                deg = int(c)
                missing = [k for k in COEFFICIENTS if k not in coeffs]
                if missing:
                    raise ValueError(f"missing {missing}")
                unknown = set(coeffs) - set(DegreeProfile.__dataclass_fields__)
                if unknown:
                    raise ValueError(f"unknown keys {sorted(unknown)}")
                opt = [None if coeffs.get(k) is None else float(coeffs[k]) for k in ("mape", "max_error", "kappa")]
                degrees[deg] = DegreeProfile(*(float(coeffs[k]) for k in COEFFICIENTS), *opt)
            except (TypeError, ValueError) as e:
                raise ValueError(f"cost profile {p}: degree {c}: {e}") from None
        meta = {k: data[k] for k in ("source", "engine", "model", "hardware", "date", "notes") if k in data}
        return cls(degrees=degrees, kappa_window_s=float(data.get("kappa_window_s", 10.0)), **meta)


def _plain(v: Any) -> Any:
    return float(v) if isinstance(v, (float, np.floating)) else v


class CostModel:
    """Predicts Ê = E_C(R, P) from a :class:`CostProfile`.

    Degrees missing from the profile are an error at prediction time (ValueError), never a silent default.
    """

    __slots__ = ("_arr", "_coef", "_index", "profile")

    def __init__(self, profile: CostProfile) -> None:
        self.profile = profile
        # Scalar path: one tuple lookup per call, no attribute chasing.
        self._coef: dict[int, tuple[float, float, float, float, float]] = {
            c: (p.d, p.a, p.b, p.c, p.alpha) for c, p in profile.degrees.items()
        }
        degs = sorted(profile.degrees)
        self._index = {c: i for i, c in enumerate(degs)}
        # Vector path: row i = coefficients of degree degs[i].
        self._arr = np.array([self._coef[c] for c in degs], dtype=np.float64).reshape(len(degs), 5)

    @classmethod
    def from_file(cls, path: str | Path) -> CostModel:
        return cls(CostProfile.load(path))

    @property
    def degrees(self) -> list[int]:
        return sorted(self._coef)

    def predict(self, degree: int, r: float, p: float) -> float:
        """Ê for one (C, R, P) in seconds."""
        try:
            d, a, b, c, al = self._coef[degree]
        except KeyError:
            raise ValueError(f"cost profile has no degree {degree} (has {self.degrees})") from None
        return d + a * r + b * p + (c * r + al * (r * p + r * (r + 1) * 0.5)) / degree

    def predict_many(self, degrees: Any, r: Any, p: Any) -> np.ndarray:
        """Vectorised Ê over broadcastable arrays of degrees, R and P."""
        degs = np.asarray(degrees)
        try:
            idx = np.vectorize(self._index.__getitem__, otypes=[np.intp])(degs) if degs.size else degs
        except KeyError as e:
            raise ValueError(f"cost profile has no degree {e.args[0]} (has {self.degrees})") from None
        co = self._arr[idx]
        r = np.asarray(r, dtype=np.float64)
        p = np.asarray(p, dtype=np.float64)
        w = r * p + r * (r + 1) * 0.5
        return co[..., 0] + co[..., 1] * r + co[..., 2] * p + (co[..., 3] * r + co[..., 4] * w) / degs

    def predict_degree(self, degree: int, r: Any, p: Any) -> np.ndarray:
        """Vectorised Ê for one degree over arrays of R and P (the cache manager's path benefit)."""
        try:
            d, a, b, c, al = self._coef[degree]
        except KeyError:
            raise ValueError(f"cost profile has no degree {degree} (has {self.degrees})") from None
        r = np.asarray(r, dtype=np.float64)
        p = np.asarray(p, dtype=np.float64)
        return d + a * r + b * p + (c * r + al * (r * p + r * (r + 1) * 0.5)) / degree

    def kappa(self, degree: int, window_s: float) -> float:
        """κ_C scaled to a window of ``window_s`` seconds (linear in window length)."""
        prof = self.profile.degrees.get(degree)
        if prof is None:
            raise ValueError(f"cost profile has no degree {degree} (has {self.degrees})")
        if prof.kappa is None:
            raise ValueError(f"cost profile has no kappa for degree {degree}; run `vertumnus profile`")
        return prof.kappa * window_s / self.profile.kappa_window_s

"""Where a profile's numbers come from: the labels a profile and its samples CSV carry, and how they travel.

Every profile says what produced its numbers — ``source`` (``measured`` on an engine, ``simulated`` from a cost
profile, ``controlled`` by a test timer, ``modelled`` by AIConfigurator, ``calibrated`` by hand), ``engine``,
``model``, ``hardware``, the date and notes. The samples CSV written next to a profile carries the same labels
in ``# key: value`` comment lines above the column header, so ``vertumnus profile --from-samples X.samples.csv``
re-fits the samples under *their* provenance, not that of whatever engine the command line or config names
(``--source/--engine/--model/--hardware`` override single labels; a CSV without the lines is labelled
``unknown``, never borrowed from the config).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from vertumnus.cost_model import CostProfile
from vertumnus.profiling.targets import ProfilingTarget, target_notes, target_source

LABELS = ("source", "engine", "model", "hardware")  # the labels --from-samples may override
UNKNOWN = "unknown"


@dataclass(slots=True, frozen=True)
class Provenance:
    """The labels of one set of samples (and of the profile fitted from them)."""

    source: str
    engine: str
    model: str
    hardware: str
    date: str  # when the samples were taken (or modelled)
    notes: tuple[str, ...] = ()  # lines that must travel with the numbers (e.g. "MODELLED, NOT MEASURED ...")

    def header(self) -> dict[str, str | list[str]]:
        """The samples CSV's comment header (``note`` repeats, one line each)."""
        return {
            "source": self.source,
            "engine": self.engine,
            "model": self.model,
            "hardware": self.hardware,
            "date": self.date,
            "note": list(self.notes),
        }

    def profile_labels(self) -> dict[str, str]:
        """Keyword arguments for :class:`~vertumnus.cost_model.CostProfile` (date: the fit's own)."""
        return {"source": self.source, "engine": self.engine, "model": self.model, "hardware": self.hardware}


def of_target(target: ProfilingTarget, date: str, controlled: bool = False) -> Provenance:
    """The provenance of samples taken now from ``target`` (``controlled``: a test timer supplied the times)."""
    source = "controlled" if controlled else target_source(target)
    return Provenance(source, target.engine, target.model, target.hardware, date, tuple(target_notes(target)))


def of_samples(header: Mapping[str, str | list[str]], overrides: Mapping[str, str], name: str) -> Provenance:
    """The provenance of a samples CSV from its header, with explicit ``overrides`` (CLI flags) taking priority.

    A CSV without a header (written before the header existed, or by hand) gets ``unknown`` labels and a note
    that says so: the labels of the config's current profile are never borrowed.
    """
    bad = set(overrides) - set(LABELS)
    if bad:
        raise ValueError(f"unknown provenance labels {sorted(bad)}; expected {', '.join(LABELS)}")

    def one(key: str) -> str:
        v = overrides.get(key) or header.get(key)
        return v if isinstance(v, str) and v else UNKNOWN

    raw_notes = header.get("note", [])
    notes = [raw_notes] if isinstance(raw_notes, str) else list(raw_notes)
    missing = [k for k in LABELS if one(k) == UNKNOWN]
    if missing:
        notes.append(
            f"provenance: {', '.join(missing)} not recorded in {name} (give --{' / --'.join(missing)} to label it)"
        )
    prov = Provenance(one("source"), one("engine"), one("model"), one("hardware"), one("date"), tuple(notes))
    if overrides:
        given = ", ".join(f"{k}={v}" for k, v in sorted(overrides.items()))
        prov = replace(prov, notes=(*prov.notes, f"provenance: labels set on the command line ({given})"))
    return prov


def save_profile(profile: CostProfile, path: Path) -> None:
    """Save the profile; a *modelled* one opens with a banner so nobody reads it as a measurement."""
    profile.save(path)
    if profile.source != "modelled":
        return
    text = (
        f"MODELLED, NOT MEASURED OR CALIBRATED: prefill times of {profile.model} predicted by {profile.engine}, "
        "fitted to E_C(R,P) = d + a·R + b·P + (c·R + alpha·W(R,P)) / C. The labels and notes below say which "
        "version, database and backend produced them and above which prompt length they are extrapolated."
    )
    banner = "".join(f"# {line}\n" for line in textwrap.wrap(text, width=114))
    path.write_text(banner + path.read_text())

"""One runner for independent simulations: in this process, or on a process pool."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")


def run_parallel(
    tasks: Sequence[T], fn: Callable[[T], R], jobs: int = 1, progress: Callable[[int, int, T], None] | None = None
) -> list[R]:
    """``fn`` on every task, results in task order. ``jobs`` ≤ 1: one after the other in this process; more: a
    process pool of ``jobs`` workers (``fn`` and the tasks must pickle; each worker keeps its own caches, so
    tasks that share inputs should sit next to each other). ``progress(done, total, task)`` after each task.

    Every task is a pure function of its inputs, so the results do not depend on ``jobs``."""
    out: list[R | None] = [None] * len(tasks)
    if jobs <= 1:
        for i, t in enumerate(tasks):
            out[i] = fn(t)
            if progress:
                progress(i + 1, len(tasks), t)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as ex:
            futures = {ex.submit(fn, t): i for i, t in enumerate(tasks)}
            for done, fut in enumerate(as_completed(futures), start=1):
                i = futures[fut]
                out[i] = fut.result()
                if progress:
                    progress(done, len(tasks), tasks[i])
    return cast("list[R]", out)  # every slot filled above

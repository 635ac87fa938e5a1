#!/usr/bin/env python3
"""ResNet-50 CPU inference, onnxrun vs today's peers from PyPI, side by side (issue #18).

The onnxzoo ResNet-50 (3x224x224, 1000 classes) at batch 1 and 8, T intra-op threads each:
`onnxrun --bench N` (its printed median), ONNX Runtime (CPUExecutionProvider, ORT_ENABLE_ALL,
intra_op T, inter_op 1, sequential) on the same file, and torchvision's resnet50 in torch eager
(inference_mode, NCHW); and in mixed precision `onnxrun --precision bf16` against torch eager
under torch.autocast("cpu", dtype=torch.bfloat16). Each run is its own child process; the peers' order rotates every
round and the table gives the median over rounds of each run's median. The logits' agreement
is bench/resnet50_cpu.py's business (--check-only), not this script's.
Run through bench/infer_peers.sh, which builds the venv (bench/setup_peers.sh) first.
"""
import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers_common import run_main  # noqa: E402
from peers_common import (REPO, BenchError, describe_rc, emit, header, median, parse_result,  # noqa: E402
                          print_table, resolve_tool, rotated, run_child, tail, time_steps,
                          uptime, versions)

PEERS = ["onnxrun", "onnxrun-winograd", "onnxrun-bf16", "onnxruntime", "torch", "torch-bf16"]
OURS = ("onnxrun", "onnxrun-winograd", "onnxrun-bf16")
PEER_LABEL = {"onnxrun": "onnxrun", "onnxrun-winograd": "onnxrun --conv-algorithm winograd",
              "onnxrun-bf16": "onnxrun --precision bf16", "onnxruntime": "ONNX Runtime",
              "torch": "torch eager NCHW",
              "torch-bf16": "torch eager NCHW, autocast bf16"}
INPUT = (3, 224, 224)


def worker(a):
    import statistics
    import numpy as np
    x = np.random.default_rng(a.batch).standard_normal((a.batch,) + INPUT, dtype=np.float32)
    if a.worker == "onnxruntime":
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
        times = time_steps(lambda: sess.run(["logits"], {"input": x}), a.warmup, a.runs)
    else:
        import torch
        import torchvision
        torch.set_num_threads(a.threads)
        torch.set_num_interop_threads(1)
        net = torchvision.models.resnet50(weights=None, num_classes=1000).eval()
        tx = torch.from_numpy(x)
        if a.worker == "torch-bf16":
            def step():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return net(tx)
        else:
            def step():
                return net(tx)
        with torch.inference_mode():
            times = time_steps(step, a.warmup, a.runs)
    med = statistics.median(times[a.warmup:])
    emit({"median_ms": med, "img_s": a.batch * 1e3 / med})
    return 0


def one_run(a, peer, batch, work):
    if peer in OURS:
        x = work / f"input_b{batch}.npy"
        cmd = [a.onnxrun, a.model, "--input", f"input={x}", "--threads", a.threads,
               "--bench", a.runs_of[batch]]
        if peer == "onnxrun-winograd":
            cmd += ["--conv-algorithm", "winograd"]
        if peer == "onnxrun-bf16":
            cmd += ["--precision", "bf16"]
    else:
        cmd = [sys.executable, __file__, "--worker", peer, "--model", a.model, "--batch", batch,
               "--threads", a.threads, "--runs", a.runs_of[batch], "--warmup", a.warmup]
    rc, so, se, rss, _ = run_child(cmd, timeout=a.timeout)
    if rc != 0:
        return None, f"{describe_rc(rc)}: {tail(se or so)}", rss
    if peer in OURS:
        m = re.search(r"median latency:\s*([0-9.eE+-]+)\s*ms", so)
        if not m:
            return None, f"no 'median latency: X ms' line: {tail(so)}", rss
        ms = float(m.group(1))
        return {"median_ms": ms, "img_s": batch * 1e3 / ms}, None, rss
    res = parse_result(so)
    return (res, None, rss) if res else (None, f"no RESULT line: {tail(so + se)}", rss)


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads, every peer (2)")
    ap.add_argument("--batches", default="1,8", help="batch sizes (default 1,8)")
    ap.add_argument("--runs", type=int, help="timed runs per peer and batch in each round "
                    "(default 10 at batch 1, 5 otherwise)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed runs, ORT and torch (default 1, as onnxrun --bench does)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peers", help=f"subset of {','.join(PEERS)} (default: all; onnxrun-bf16 "
                    "only where the CPU has bf16 instructions, which onnxrun needs for it)")
    ap.add_argument("--bin", default=os.environ.get("ONNXTRAIN_BIN", str(REPO / "build/tools")),
                    help="folder of onnxrun and onnxzoo (default: build/tools, or $ONNXTRAIN_BIN)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per child run")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(a)
    if a.peers is None:  # onnxrun refuses bf16 without AVX512-BF16 / AMX (--allow-emulation)
        native_bf16 = bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", cpu_flags()))
        a.peers = ",".join(p for p in PEERS if native_bf16 or p != "onnxrun-bf16")
        if not native_bf16:
            print("infer_peers: this CPU has no bf16 instructions: onnxrun-bf16 left out")
    peers = [p.strip() for p in a.peers.split(",") if p.strip()]
    if not peers or any(p not in PEERS for p in peers):
        raise BenchError(f"--peers: choose from {','.join(PEERS)}")
    if "onnxrun" not in peers:
        peers.insert(0, "onnxrun")
    batches = [int(b) for b in a.batches.split(",") if b]
    if a.threads < 1 or a.rounds < 1 or (a.runs is not None and a.runs < 1) or a.warmup < 0:
        raise BenchError("--threads, --rounds and --runs must be >= 1, --warmup >= 0")
    a.runs_of = {b: a.runs or (10 if b == 1 else 5) for b in batches}
    onnxzoo = resolve_tool(a.bin, "onnxzoo")
    a.onnxrun = resolve_tool(a.bin, "onnxrun")

    header("ResNet-50 CPU inference: onnxrun vs peers from PyPI (issue #18)", sys.argv)
    print(f"peer versions: {versions(['onnxruntime', 'torch', 'torchvision', 'numpy'])}")
    print(f"{a.threads} intra-op threads each, 1 warm-up run inside onnxrun --bench, {a.warmup} "
          f"for ORT/torch; runs per round {a.runs_of}; {a.rounds} round(s), order rotated")
    import numpy as np
    work = Path(tempfile.mkdtemp(prefix="infer_peers_"))
    try:
        a.model = work / "resnet50.onnx"
        rc, so, se, _, _ = run_child([onnxzoo, "resnet50", "--input", "3x224x224", "--classes",
                                      "1000", "-o", a.model])
        if rc != 0:
            raise BenchError(f"onnxzoo failed: {tail(se or so)}")
        for b in batches:
            np.save(work / f"input_b{b}.npy",
                    np.random.default_rng(b).standard_normal((b,) + INPUT, dtype=np.float32))
        got, errors, rss_of = {}, {}, {}
        for r in range(a.rounds):
            for b in batches:
                for p in rotated(peers, r):
                    if (p, b) in errors:
                        continue
                    res, err, rss = one_run(a, p, b, work)
                    if err:
                        errors[(p, b)] = err
                        print(f"  round {r + 1} batch {b} {p:<16} FAILED {err}", flush=True)
                        continue
                    got.setdefault((p, b), []).append(res["median_ms"])
                    rss_of[(p, b)] = max(rss_of.get((p, b), 0.0), rss)
                    print(f"  round {r + 1} batch {b} {p:<16} {res['median_ms']:9.1f} ms "
                          f"RSS {rss:.0f} MiB", flush=True)
        rows = []
        for b in batches:
            ours = median(got.get(("onnxrun", b), []))
            wino = median(got.get(("onnxrun-winograd", b), []))
            bf16 = median(got.get(("onnxrun-bf16", b), []))
            for p in peers:
                ms = median(got.get((p, b), []))
                if ms is None:
                    rows.append([PEER_LABEL[p], b, "failed", "", "", "", "", ""])
                    continue
                ratios = [f"{ms / o:.2f}x" if o else "-" for o in (ours, wino, bf16)]
                rows.append([PEER_LABEL[p], b, f"{ms:.1f}", f"{b * 1e3 / ms:.2f}",
                             f"{rss_of[(p, b)]:.0f}"] + ratios)
        print()
        print_table(["peer", "batch", "median ms", "img/s", "max RSS MiB", "onnxrun/peer",
                     "winograd/peer", "bf16/peer"], rows)
        print("\nonnxrun/peer = onnxrun img/s / peer img/s (> 1: onnxrun is faster); "
              "winograd/peer and bf16/peer the same for onnxrun --conv-algorithm winograd and "
              "onnxrun --precision bf16 (mixed precision: compare it with torch's autocast bf16; "
              "against float32 peers it is a speed-for-precision trade)")
        print(f"uptime after: {uptime()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any(p in OURS for p, _ in errors) else 0


if __name__ == "__main__":
    run_main(main, "infer_peers")

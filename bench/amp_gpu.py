#!/usr/bin/python3
"""ResNet-50 training on one NVIDIA GPU in mixed precision (issue #19): onnxtrain --precision
fp32 | bf16 | fp16 against PyTorch's torch.autocast("cuda", bf16 | fp16) (+ GradScaler for fp16)
on the same GPU, side by side.

The same topology (the zoo's torchvision-v1.5 ResNet-50; PyTorch's from bench/resnet50_cpu.py),
Adam, cross-entropy, random data, the same batch. Each run is its own process; the peers take
turns leading across `--rounds`; median ms/step (onnxtrain: its steady-state rate, the first step
excluded), images/s, max RSS of the process, and the ratios. float32 runs with TF32 on both sides
unless --no-tf32. Run by scripts/gpu-check.sh (its AMP stage).

--device cpu runs the onnxtrain side on the CPU (a dry run of this script on a machine without a
GPU; pass --peers onnxtrain-fp32,onnxtrain-bf16 and a small --input / --batch).
"""
import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from peers_common import (BenchError, child_result, emit, emit_na, fmt, header,  # noqa: E402
                          print_table, resolve_tool, rotated, run_child, run_main, step_result,
                          summarize_runs, tail, time_steps)

PRECISIONS = ["fp32", "bf16", "fp16"]
PEERS = [f"{who}-{p}" for p in PRECISIONS for who in ("onnxtrain", "torch")]
LR = "1e-3"


def torch_worker(a):
    """One PyTorch run: RESULT with the step times (CUDA synchronized by reading the loss)."""
    try:
        import torch
    except ImportError as e:
        return emit_na(f"PyTorch is not installed: {e}")
    if not torch.cuda.is_available():
        return emit_na("PyTorch sees no CUDA GPU")
    from resnet_train_gpu import torch_gpu_setup
    torch, dev, model, opt, loss_fn, x, y = torch_gpu_setup(a.input, a.batch, a.classes, 1,
                                                            a.tf32)
    precision = a.worker.split("-", 1)[1]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")

    def step():
        xd, yd = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(model(xd), yd)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        float(loss)  # synchronizes, as onnxtrain's step returns the loss

    emit(step_result(time_steps(step, a.warmup, a.steps), a.warmup, a.batch,
                     peak_gpu_mib=torch.cuda.max_memory_allocated() / 2**20))


def one_run(a, peer, model, work):
    """(RESULT dict or None, error text or None, max RSS MiB) of one child."""
    if peer.startswith("onnxtrain"):
        metrics = work / "metrics.json"
        metrics.unlink(missing_ok=True)
        cmd = [a.onnxtrain, model, "--data", f"synthetic:{a.batch * (a.warmup + a.steps)}",
               "--val-data", "none", "--epochs", "1", "--batch-size", a.batch,
               "--replicas", "1", "--optimizer", "adam", "--lr", LR, "--device", a.device,
               "--precision", peer.split("-", 1)[1], "--metrics-json", metrics,
               "--output", work / "trained.onnx"]
        if not a.tf32:
            cmd.append("--no-tf32")
    else:
        cmd = [sys.executable, __file__, "--worker", peer, "--input", a.input, "--batch", a.batch,
               "--classes", a.classes, "--steps", a.steps, "--warmup", a.warmup]
        if not a.tf32:
            cmd.append("--no-tf32")
    rc, so, se, rss, _ = run_child(cmd, timeout=a.timeout)
    return child_result(rc, so, se, rss, metrics if peer.startswith("onnxtrain") else None,
                        a.batch)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", default="3x224x224")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run (default 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per run (default 3)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--peers", default=",".join(PEERS), help="subset of %(default)s")
    ap.add_argument("--device", default="cuda", help="onnxtrain's --device (default cuda)")
    ap.add_argument("--no-tf32", dest="tf32", action="store_false")
    ap.add_argument("--bin", default=str(HERE.parent / "build/tools"),
                    help="folder of onnxtrain and onnxzoo (default: build/tools)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per child run")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return torch_worker(a)
    peers = [p for p in a.peers.split(",") if p]
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise BenchError(f"unknown peer(s) {','.join(unknown)} (known: {','.join(PEERS)})")
    if any(p.startswith("onnxtrain") for p in peers):
        a.onnxtrain = resolve_tool(a.bin, "onnxtrain")
        onnxzoo = resolve_tool(a.bin, "onnxzoo")
    header(f"ResNet-50 {a.input} batch {a.batch} training on {a.device}, mixed precision: "
           "onnxtrain --precision vs torch.autocast", [__file__] + argv)
    runs = {p: [] for p in peers}
    with tempfile.TemporaryDirectory(prefix="amp_gpu_") as tmp:
        work = Path(tmp)
        model = work / "resnet50.onnx"
        if any(p.startswith("onnxtrain") for p in peers):
            rc, so, se, _, _ = run_child([onnxzoo, "resnet50", "--input", a.input, "--classes",
                                          a.classes, "-o", model])
            if rc != 0:
                raise BenchError(f"onnxzoo failed: {tail(se or so)}")
        for r in range(a.rounds):
            for peer in rotated(peers, r):
                res, err, rss = one_run(a, peer, model, work)
                if err:
                    print(f"  round {r + 1} {peer:<15} failed: {err}", flush=True)
                    continue
                res["rss"] = rss
                runs[peer].append(res)
                if "na" in res:
                    print(f"  round {r + 1} {peer:<15} n/a: {res['na']}", flush=True)
                else:
                    print(f"  round {r + 1} {peer:<15} {res['median_ms']:9.1f} ms/step "
                          f"{res['img_s']:8.1f} img/s  max RSS {rss:.0f} MiB", flush=True)
    summary = {p: summarize_runs(runs[p], a.batch) for p in peers}
    print()
    print_table(["peer", "ms/step", "images/s", "max RSS MiB"],
                [[p, fmt(s[0]), fmt(s[1]), fmt(s[3], ".0f")] if s else [p, "-", "-", "-"]
                 for p, s in summary.items()])
    print()
    for num, den in [(f"onnxtrain-{p}", "onnxtrain-fp32") for p in ("bf16", "fp16")] + \
                    [(f"onnxtrain-{p}", f"torch-{p}") for p in PRECISIONS]:
        if summary.get(num) and summary.get(den):
            print(f"{num} / {den} images/s: {summary[num][1] / summary[den][1]:.2f}x")
    failed = [p for p in peers if p.startswith("onnxtrain") and not summary[p]]
    return 1 if failed else 0


if __name__ == "__main__":
    run_main(main, "amp_gpu")

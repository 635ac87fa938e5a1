#!/usr/bin/env python3
"""ResNet-50 CPU training, onnxtrain vs today's peers from PyPI, side by side (issue #18).

Adam (lr 1e-3), cross-entropy over 1000 classes, random data with synthetic labels, one replica,
the same batch and intra-op thread count for every peer. Each run is its own child process (its
thread pools and max RSS are its own); the peers' order rotates every round and the table gives
the median over rounds. Peers: onnxtrain (the CLI), torch eager NCHW, torch channels_last,
torch.compile (inductor), TensorFlow/Keras, ONNX Runtime training 1.19.2 (its own venv).
Run through bench/train_peers.sh, which builds the venvs (bench/setup_peers.sh) first.
"""
import argparse
import os
import sys
import tempfile
import shutil
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers_common import run_main  # noqa: E402
from peers_common import (REPO, BenchError, child_result, emit, emit_na, fmt, header,  # noqa: E402
                          median, print_table, resolve_tool, rotated, run_child, step_result, tail,
                          time_steps, uptime, versions)

PEERS = ["onnxtrain", "onnxtrain-winograd", "onnxtrain-plain", "onnxtrain-unfused", "torch",
         "torch-cl", "torch-compile",
         "tensorflow", "ort-training"]
OURS = ("onnxtrain", "onnxtrain-winograd", "onnxtrain-plain", "onnxtrain-unfused")
PEER_LABEL = {"onnxtrain": "onnxtrain", "onnxtrain-winograd": "onnxtrain --conv-algorithm winograd",
              "onnxtrain-plain": "onnxtrain --plain-layout",
              "onnxtrain-unfused": "onnxtrain --unfused",
              "torch": "torch eager NCHW",
              "torch-cl": "torch channels_last", "torch-compile": "torch.compile (inductor)",
              "tensorflow": "TensorFlow/Keras", "ort-training": "ORT training 1.19.2"}
CLASSES = 1000
LR = 1e-3


# ----------------------------------------------------------------------------------------------
# Children: one timed run each; each prints one RESULT line.

def shape(inp):
    c, h, w = (int(v) for v in inp.split("x"))
    return c, h, w


def worker_torch(a, mode):
    import torch
    import torch.nn.functional as F
    import torchvision
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)
    c, h, w = shape(a.input)
    model = torchvision.models.resnet50(weights=None, num_classes=CLASSES)
    model.train()
    x = torch.randn(a.batch, c, h, w)
    y = torch.randint(0, CLASSES, (a.batch,))
    if mode == "torch-cl":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    fwd = torch.compile(model) if mode == "torch-compile" else model

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()
        loss.item()

    if mode == "torch-compile":
        # The first call compiles (forward and backward graphs); it is a warm-up step, so the
        # compile time lands in first_ms and not in the median. A compile failure is "n/a".
        try:
            import time
            t0 = time.perf_counter()
            step()
            first = (time.perf_counter() - t0) * 1e3
        except Exception as e:  # noqa: BLE001 - any compile error makes the peer n/a
            print(f"torch.compile failed: {type(e).__name__}: {e}", file=sys.stderr)
            emit_na(f"torch.compile failed: {type(e).__name__}: {e}")
            return 0
        times = [first] + time_steps(step, max(a.warmup - 1, 0), a.steps)
    else:
        times = time_steps(step, a.warmup, a.steps)
    emit(step_result(times, max(a.warmup, 1) if mode == "torch-compile" else a.warmup, a.batch))
    return 0


def worker_tensorflow(a):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.random.set_seed(0)
    c, h, w = shape(a.input)
    # Keras' ResNet50 is v1 (stride 2 on the first 1x1 of a downsampling block), torchvision's
    # and onnxzoo's are v1.5 (stride on the 3x3): slightly fewer FLOPs on the Keras side.
    model = tf.keras.applications.ResNet50(weights=None, input_shape=(h, w, c), classes=CLASSES,
                                           classifier_activation=None)
    opt = tf.keras.optimizers.Adam(learning_rate=LR)
    opt.build(model.trainable_variables)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x = tf.random.normal((a.batch, h, w, c))  # channels-last, TF's native CPU layout
    y = tf.random.uniform((a.batch,), 0, CLASSES, dtype=tf.int64)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    times = time_steps(lambda: float(train_step(x, y)), a.warmup, a.steps)
    emit(step_result(times, a.warmup, a.batch))
    return 0


def bn_running_stats(model):
    stats = set()
    for node in model.graph.node:
        if node.op_type == "BatchNormalization":
            stats.update(node.input[3:5])
    return stats


def worker_ort_prepare(a):
    """Training artifacts (training/eval/optimizer models, checkpoint) for the zoo model, once per
    input shape; runs under the ORT-training venv's python."""
    import onnx
    from onnxruntime.training import artifacts
    model = onnx.load(a.model)
    stats = bn_running_stats(model)
    names = [i.name for i in model.graph.initializer]
    requires_grad = [n for n in names if n not in stats]
    frozen = [n for n in names if n in stats]
    optim = getattr(artifacts.OptimType, "AdamW", None) or artifacts.OptimType.Adam
    Path(a.artifacts).mkdir(parents=True, exist_ok=True)
    artifacts.generate_artifacts(model, requires_grad=requires_grad, frozen_params=frozen,
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=optim,
                                 artifact_directory=a.artifacts)
    print(f"ort-training artifacts in {a.artifacts}: {len(requires_grad)} trainable, "
          f"{len(frozen)} frozen (BN running stats), optimizer {optim}")
    return 0


def worker_ort_train(a):
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.training.api import CheckpointState, Module, Optimizer
    d = Path(a.artifacts)
    state = CheckpointState.load_checkpoint(str(d / "checkpoint"))
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    try:
        module = Module(str(d / "training_model.onnx"), state, str(d / "eval_model.onnx"),
                        device="cpu", session_options=so)
    except TypeError:  # an API without session_options: ORT's default thread count
        print("ort-training: Module() takes no session_options; threads = ORT's default",
              file=sys.stderr)
        module = Module(str(d / "training_model.onnx"), state, str(d / "eval_model.onnx"),
                        device="cpu")
    opt = Optimizer(str(d / "optimizer_model.onnx"), module)
    if hasattr(opt, "set_learning_rate"):
        opt.set_learning_rate(LR)
    module.train()
    c, h, w = shape(a.input)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.batch, c, h, w), dtype=np.float32)
    y = rng.integers(0, CLASSES, (a.batch,), dtype=np.int64)

    def step():
        loss = module(x, y)
        opt.step()
        module.lazy_reset_grad()
        float(loss)

    times = time_steps(step, a.warmup, a.steps)
    emit(step_result(times, a.warmup, a.batch))
    return 0


def worker(a):
    if a.worker in ("torch", "torch-cl", "torch-compile"):
        return worker_torch(a, a.worker)
    if a.worker == "tensorflow":
        return worker_tensorflow(a)
    if a.worker == "ort-prepare":
        return worker_ort_prepare(a)
    if a.worker == "ort-training":
        return worker_ort_train(a)
    raise SystemExit(f"unknown worker {a.worker}")


# ----------------------------------------------------------------------------------------------
# The parent.

def parse_configs(text):
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3:
            raise BenchError(f"--config '{item}': expected INPUT:BATCH:THREADS, e.g. 3x64x64:16:1")
        inp, b, t = parts
        shape(inp)
        out.append((inp, int(b), int(t)))
    return out


def one_run(a, peer, inp, batch, threads, work, model, artifacts):
    """(RESULT dict or None, error text or None, max RSS MiB) of one child."""
    env = dict(os.environ)
    common = ["--input", inp, "--batch", batch, "--threads", threads, "--steps", a.steps,
              "--warmup", a.warmup]
    if peer in OURS:
        metrics = work / "metrics.json"
        metrics.unlink(missing_ok=True)
        cmd = [a.onnxtrain, model, "--data", f"synthetic:{batch * (a.warmup + a.steps)}",
               "--val-data", "none", "--epochs", "1", "--batch-size", batch, "--replicas", "1",
               "--threads", threads, "--optimizer", "adam", "--lr", LR, "--metrics-json", metrics]
        if peer == "onnxtrain-winograd":
            cmd += ["--conv-algorithm", "winograd"]
        if peer == "onnxtrain-plain":
            cmd += ["--plain-layout"]
        if peer == "onnxtrain-unfused":
            cmd += ["--unfused"]
    elif peer == "ort-training":
        if artifacts is None:
            return None, "no training artifacts (see the error above)", 0.0
        cmd = [a.ort_python, __file__, "--worker", peer, "--artifacts", artifacts] + common
    else:
        cmd = [sys.executable, __file__, "--worker", peer] + common
        if peer == "tensorflow":
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    rc, so, se, rss, _ = run_child(cmd, env=env, timeout=a.timeout)
    return child_result(rc, so, se, rss, metrics if peer in OURS else None, batch)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="3x64x64:16:1,3x64x64:16:2,3x224x224:8:2",
                    help="comma-separated INPUT:BATCH:THREADS (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per run (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per run (default 1)")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help="comma-separated subset of %(default)s")
    ap.add_argument("--bin", default=os.environ.get("ONNXTRAIN_BIN", str(REPO / "build/tools")),
                    help="folder of onnxtrain and onnxzoo (default: build/tools, or $ONNXTRAIN_BIN)")
    ap.add_argument("--ort-python", default=str(REPO / "build/bench-ort-train-venv/bin/python"),
                    help="python of the ONNX Runtime training venv")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per child run")
    ap.add_argument("--keep", metavar="DIR", help="keep models and artifacts in DIR")
    # child modes
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--artifacts", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(a)

    peers = [p.strip() for p in a.peers.split(",") if p.strip()]
    bad = [p for p in peers if p not in PEERS]
    if bad or not peers:
        raise BenchError(f"--peers: unknown {bad}; choose from {','.join(PEERS)}")
    if a.rounds < 1 or a.steps < 1 or a.warmup < 0:
        raise BenchError("--rounds and --steps must be >= 1, --warmup >= 0")
    configs = parse_configs(a.config)
    onnxzoo = resolve_tool(a.bin, "onnxzoo")
    a.onnxtrain = resolve_tool(a.bin, "onnxtrain")

    header("ResNet-50 CPU training: onnxtrain vs peers from PyPI (issue #18)", sys.argv)
    print(f"peer versions: {versions(['torch', 'torchvision', 'tensorflow-cpu', 'keras', 'numpy'])}")
    if "ort-training" in peers:
        print(f"ort-training venv ({a.ort_python}): "
              f"{versions(['onnxruntime-training-cpu', 'onnx', 'numpy'], a.ort_python)}")
    print(f"Adam lr {LR:g}, cross-entropy, {CLASSES} classes, random data; {a.warmup} warm-up + "
          f"{a.steps} timed steps per run, {a.rounds} round(s), peer order rotated each round")
    if "tensorflow" in peers:
        print("note: Keras' ResNet50 is v1 (stride on the first 1x1 of a downsampling block); "
              "the others are torchvision's v1.5 (stride on the 3x3): slightly different FLOPs")
    sys.stdout.flush()

    work = Path(a.keep).resolve() if a.keep else Path(tempfile.mkdtemp(prefix="train_peers_"))
    work.mkdir(parents=True, exist_ok=True)
    onnxtrain_failed = False
    try:
        models, artifacts = {}, {}
        for inp, _, _ in configs:
            if inp in models:
                continue
            models[inp] = work / f"resnet50_{inp}.onnx"
            rc, so, se, _, _ = run_child([onnxzoo, "resnet50", "--input", inp, "--classes",
                                          CLASSES, "-o", models[inp]])
            if rc != 0:
                raise BenchError(f"onnxzoo failed: {tail(se or so)}")
            artifacts[inp] = None
            if "ort-training" in peers:
                d = work / f"ort_artifacts_{inp}"
                rc, so, se, _, _ = run_child([a.ort_python, __file__, "--worker", "ort-prepare",
                                              "--model", models[inp], "--artifacts", d])
                if rc == 0:
                    artifacts[inp] = d
                    print(f"  {so.strip().splitlines()[-1]}")
                else:
                    print(f"  ort-training: generate_artifacts failed for {inp}: {tail(se or so)}")

        summary = []
        for inp, batch, threads in configs:
            print(f"\n-- {inp} batch {batch} threads {threads}", flush=True)
            got = {p: [] for p in peers}
            errors = {}
            for r in range(a.rounds):
                for p in rotated(peers, r):
                    if p in errors and p not in OURS:
                        continue  # a peer that failed once is not retried
                    res, err, rss = one_run(a, p, inp, batch, threads, work, models[inp],
                                            artifacts[inp])
                    if err:
                        errors[p] = err
                        print(f"  round {r + 1} {p:<18} FAILED {err}", flush=True)
                        if p in OURS:
                            onnxtrain_failed = True
                        continue
                    res["rss"] = rss
                    got[p].append(res)
                    if "na" in res:
                        errors.setdefault(p, None)  # not retried in later rounds either
                        print(f"  round {r + 1} {p:<18} n/a: {res['na']}", flush=True)
                        continue
                    print(f"  round {r + 1} {p:<18} {res['median_ms']:9.1f} ms/step "
                          f"{res['img_s']:8.2f} img/s  first {fmt(res.get('first_ms'))} ms  "
                          f"RSS {rss:.0f} MiB", flush=True)
            rows, ours = [], None
            stats = {}
            for p in peers:
                runs = [x for x in got[p] if "na" not in x]
                if runs:
                    ms = median([x["median_ms"] for x in runs])
                    first = median([x["first_ms"] for x in runs])
                    stats[p] = (ms, batch * 1e3 / ms, first, max(x["rss"] for x in runs),
                                all(x.get("steady", True) for x in runs))
            if "onnxtrain" in stats:
                ours = stats["onnxtrain"][1]
            wino = stats["onnxtrain-winograd"][1] if "onnxtrain-winograd" in stats else None
            for p in peers:
                label = PEER_LABEL[p]
                if p in stats:
                    ms, ips, first, rss, steady = stats[p]
                    mark = "" if steady else " *"
                    ratio = f"{ours / ips:.2f}x" if ours else "-"
                    wratio = f"{wino / ips:.2f}x" if wino else "-"
                    rows.append([label, f"{ms:.1f}{mark}", f"{ips:.2f}{mark}",
                                 f"{first / ms:.2f}" if first else "-", f"{rss:.0f}", ratio,
                                 wratio])
                elif errors.get(p):
                    rows.append([label, "failed", "", "", "", "", ""])
                else:
                    na = next((x["na"] for x in got[p] if "na" in x), "n/a")
                    rows.append([label, "n/a", "", "", "", "", ""])
                    print(f"  {p}: n/a ({na})")
                summary.append((inp, batch, threads, rows[-1]))
            print()
            print_table(["peer", "median ms/step", "img/s", "first step / steady",
                         "max RSS MiB", "onnxtrain/peer", "winograd/peer"], rows)
            if "onnxtrain" in stats and not stats["onnxtrain"][4]:
                print("* onnxtrain's metrics JSON has no steady_images_per_sec: its figure is "
                      "images_per_sec over the whole epoch, first step included")
        print("\nonnxtrain/peer = onnxtrain img/s / peer img/s (> 1: onnxtrain is faster); "
              "winograd/peer the same for onnxtrain --conv-algorithm winograd; "
              "first step / steady = the first step's time over the median timed step")
        print(f"uptime after: {uptime()}")
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    if onnxtrain_failed:
        print("train_peers: error: onnxtrain failed (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_main(main, "train_peers")

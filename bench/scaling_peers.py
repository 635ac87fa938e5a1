#!/usr/bin/env python3
"""Data-parallel scaling over 2 CPU cores, onnxtrain vs today's peers from PyPI (issue #18).

ResNet-50 (default 3x64x64, per-replica batch 16), Adam lr 1e-3, cross-entropy, random data.
Each peer's efficiency = images/s with 2 replicas / (2 x images/s with 1), per-replica batch
fixed, 1 thread per replica:
  onnxtrain: --replicas 2 --threads 2 vs --replicas 1 --threads 1, and against the machine
             bound: two independent --replicas 1 --threads 1 processes at once (sum of rates);
  torch:     DistributedDataParallel (gloo), 2 processes x 1 thread vs 1 process, 1 thread;
  tensorflow: MirroredStrategy over 2 logical CPU devices (intra-op pool of 2) vs 1 device.
Every run is its own child process(es); the runs' order rotates every round, medians over
rounds. Run through bench/scaling_peers.sh, which builds the venv (bench/setup_peers.sh) first.
"""
import argparse
import os
import shutil
import socket
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers_common import run_main  # noqa: E402
from peers_common import (REPO, BenchError, describe_rc, emit, header, median, parse_result,  # noqa: E402
                          print_table, read_onnxtrain_metrics, resolve_tool, rotated, run_child,
                          step_result, tail, time_steps, uptime, versions)

HERE = Path(__file__).resolve().parent
PEERS = ["onnxtrain", "torch", "tensorflow"]
RUNS = {  # run name -> (peer, replicas)
    "onnxtrain r1": ("onnxtrain", 1), "onnxtrain r2": ("onnxtrain", 2),
    "onnxtrain 2 x r1": ("onnxtrain", 2),
    "torch 1 proc": ("torch", 1), "torch DDP 2 procs": ("torch", 2),
    "tf 1 device": ("tensorflow", 1), "tf Mirrored 2 devices": ("tensorflow", 2),
}
CLASSES = 1000
LR = 1e-3


def shape(inp):
    c, h, w = (int(v) for v in inp.split("x"))
    return c, h, w


# ----------------------------------------------------------------------------------------------
# Children.

def worker_ddp(a):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import torchvision
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the env
    torch.manual_seed(0)
    c, h, w = shape(a.input)
    model = torchvision.models.resnet50(weights=None, num_classes=CLASSES).train()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=LR)
    torch.manual_seed(1 + dist.get_rank())
    x = torch.randn(a.batch, c, h, w)
    y = torch.randint(0, CLASSES, (a.batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        loss.item()

    times = time_steps(step, a.warmup, a.steps)
    emit(step_result(times, a.warmup, a.batch * dist.get_world_size(), rank=dist.get_rank()))
    dist.destroy_process_group()
    return 0


def worker_tf_mirrored(a):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    n = a.replicas
    tf.config.threading.set_intra_op_parallelism_threads(n)  # one pool, shared by the devices
    tf.config.threading.set_inter_op_parallelism_threads(1)
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:n]
    strategy = tf.distribute.MirroredStrategy(
        devices=devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
    c, h, w = shape(a.input)
    global_batch = a.batch * n
    with strategy.scope():
        model = tf.keras.applications.ResNet50(weights=None, input_shape=(h, w, c),
                                               classes=CLASSES, classifier_activation=None)
        opt = tf.keras.optimizers.Adam(learning_rate=LR)
        opt.build(model.trainable_variables)
    # per-example losses (Keras 3 spells no reduction "none"; Keras 2 Reduction.NONE), averaged
    # over the global batch by compute_average_loss
    none = tf.keras.losses.Reduction.NONE if hasattr(tf.keras.losses, "Reduction") else "none"
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=none)

    def batch_of(ctx):
        return (tf.random.normal((a.batch, h, w, c)),
                tf.random.uniform((a.batch,), 0, CLASSES, dtype=tf.int64))

    data = strategy.experimental_distribute_values_from_function(batch_of)

    def step_fn(xy):
        x, y = xy
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)),
                                              global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(xy):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=(xy,)),
                               axis=None)

    times = time_steps(lambda: float(train_step(data)), a.warmup, a.steps)
    emit(step_result(times, a.warmup, global_batch, devices=devices))
    return 0


# ----------------------------------------------------------------------------------------------
# The parent.

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_many(cmds, timeout, envs=None):
    """Runs the commands at once; a list of run_child results in order."""
    envs = envs or [None] * len(cmds)
    with ThreadPoolExecutor(len(cmds)) as ex:
        futs = [ex.submit(run_child, c, e, timeout) for c, e in zip(cmds, envs)]
        return [f.result() for f in futs]


def onnxtrain_cmd(a, replicas, metrics):
    return [a.onnxtrain, a.model, "--data", f"synthetic:{a.batch * replicas * (a.warmup + a.steps)}",
            "--val-data", "none", "--epochs", "1", "--batch-size", a.batch, "--replicas", replicas,
            "--threads", replicas, "--optimizer", "adam", "--lr", LR, "--metrics-json", metrics]


def one_run(a, name, work):
    """(images/s, note or None, error or None) of one run (summed over its processes)."""
    common = ["--input", a.model_input, "--batch", a.batch, "--steps", a.steps,
              "--warmup", a.warmup]
    if name.startswith("onnxtrain"):
        k = 2 if name == "onnxtrain 2 x r1" else 1
        replicas = 2 if name == "onnxtrain r2" else 1
        ms = [work / f"m{i}.json" for i in range(k)]
        for m in ms:
            m.unlink(missing_ok=True)
        outs = run_many([onnxtrain_cmd(a, replicas, m) for m in ms], a.timeout)
        rate, steady = 0.0, True
        for (rc, so, se, _, _), m in zip(outs, ms):
            if rc != 0:
                return None, None, f"{describe_rc(rc)}: {tail(se or so)}"
            try:
                res = read_onnxtrain_metrics(m, a.batch * replicas)
            except (OSError, ValueError, KeyError, BenchError) as e:
                return None, None, f"no metrics: {e}"
            rate += res["img_s"]
            steady = steady and res["steady"]
        return rate, None if steady else "epoch rate, first step included", None
    if name == "torch DDP 2 procs":
        port = str(free_port())
        envs = []
        for rank in range(2):
            e = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank),
                     WORLD_SIZE="2", LOCAL_RANK=str(rank))
            envs.append(e)
        cmd = [sys.executable, __file__, "--worker", "ddp"] + common
        outs = run_many([cmd, cmd], a.timeout, envs)
        results = []
        for rc, so, se, _, _ in outs:
            res = parse_result(so) if rc == 0 else None
            if res is None:
                return None, None, f"{describe_rc(rc)}: {tail(se or so)}"
            results.append(res)
        # a step ends for both ranks at the same AllReduce: the slower rank's median sets the rate
        return min(r["img_s"] for r in results), None, None
    if name == "torch 1 proc":
        cmd = [sys.executable, HERE / "train_peers.py", "--worker", "torch", "--threads", 1] + common
    elif name == "tf 1 device":
        cmd = [sys.executable, HERE / "train_peers.py", "--worker", "tensorflow", "--threads", 1] \
            + common
    else:  # tf Mirrored 2 devices
        cmd = [sys.executable, __file__, "--worker", "tf-mirrored", "--replicas", 2] + common
    rc, so, se, _, _ = run_child(cmd, timeout=a.timeout)
    res = parse_result(so) if rc == 0 else None
    if res is None:
        return None, None, f"{describe_rc(rc)}: {tail(se or so)}"
    return res["img_s"], None, None


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-input", default="3x64x64", help="CxHxW (default %(default)s)")
    ap.add_argument("--batch", type=int, default=16, help="per-replica batch (default 16)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per run (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per run (default 1)")
    ap.add_argument("--peers", default=",".join(PEERS), help="subset of %(default)s")
    ap.add_argument("--bin", default=os.environ.get("ONNXTRAIN_BIN", str(REPO / "build/tools")),
                    help="folder of onnxtrain and onnxzoo (default: build/tools, or $ONNXTRAIN_BIN)")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per child run")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--replicas", type=int, default=2, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker == "ddp":
        return worker_ddp(a)
    if a.worker == "tf-mirrored":
        return worker_tf_mirrored(a)
    peers = [p.strip() for p in a.peers.split(",") if p.strip()]
    if not peers or any(p not in PEERS for p in peers):
        raise BenchError(f"--peers: choose from {','.join(PEERS)}")
    if "onnxtrain" not in peers:
        peers.insert(0, "onnxtrain")
    if a.rounds < 1 or a.steps < 1 or a.warmup < 0 or a.batch < 1:
        raise BenchError("--rounds, --steps and --batch must be >= 1, --warmup >= 0")
    shape(a.model_input)
    onnxzoo = resolve_tool(a.bin, "onnxzoo")
    a.onnxtrain = resolve_tool(a.bin, "onnxtrain")
    runs = [n for n, (p, _) in RUNS.items() if p in peers]

    header("ResNet-50 data-parallel scaling on CPUs: onnxtrain vs peers from PyPI (issue #18)",
           sys.argv)
    print(f"peer versions: {versions(['torch', 'torchvision', 'tensorflow-cpu', 'keras'])}")
    print(f"{a.model_input}, per-replica batch {a.batch}, 1 thread per replica, Adam lr {LR:g}; "
          f"{a.warmup} warm-up + {a.steps} timed steps per run, {a.rounds} round(s), rotated")
    work = Path(tempfile.mkdtemp(prefix="scaling_peers_"))
    failed = {}
    try:
        a.model = work / "resnet50.onnx"
        rc, so, se, _, _ = run_child([onnxzoo, "resnet50", "--input", a.model_input,
                                      "--classes", CLASSES, "-o", a.model])
        if rc != 0:
            raise BenchError(f"onnxzoo failed: {tail(se or so)}")
        rates, notes = {n: [] for n in runs}, {}
        for r in range(a.rounds):
            for n in rotated(runs, r):
                if n in failed:
                    continue
                rate, note, err = one_run(a, n, work)
                if err:
                    failed[n] = err
                    print(f"  round {r + 1} {n:<22} FAILED {err}", flush=True)
                    continue
                rates[n].append(rate)
                if note:
                    notes[n] = note
                print(f"  round {r + 1} {n:<22} {rate:8.2f} img/s", flush=True)
        med = {n: median(v) for n, v in rates.items()}
        rows = []
        for n in runs:
            v = med[n]
            rows.append([n, "failed" if n in failed else f"{v:.2f}",
                         " ".join(f"{x:.2f}" for x in rates[n]) + (f" ({notes[n]})" if n in notes
                                                                     else "")])
        print()
        print_table(["run", "median img/s", "per round"], rows)

        def eff(two, one):
            if med.get(two) is None or med.get(one) is None:
                return "-"
            return f"{med[two] / (2 * med[one]):.3f}"

        print()
        erows = []
        if "onnxtrain" in peers:
            erows.append(["onnxtrain --replicas 2 --threads 2", eff("onnxtrain r2", "onnxtrain r1")])
            erows.append(["2 independent onnxtrain processes (the machine bound)",
                          eff("onnxtrain 2 x r1", "onnxtrain r1")])
            bound = med.get("onnxtrain 2 x r1")
            erows.append(["onnxtrain r2 / machine bound",
                          f"{med['onnxtrain r2'] / bound:.3f}"
                          if bound and med.get("onnxtrain r2") else "-"])
        if "torch" in peers:
            erows.append(["torch DDP gloo, 2 procs x 1 thread", eff("torch DDP 2 procs", "torch 1 proc")])
        if "tensorflow" in peers:
            erows.append(["TF MirroredStrategy, 2 logical CPUs", eff("tf Mirrored 2 devices", "tf 1 device")])
        print_table(["scaling", "efficiency = rate(2) / (2 x rate(1))"], erows)
        print("\n(onnxtrain r2 / machine bound = rate of --replicas 2 over the summed rate of two "
              "independent 1-replica processes; TF's ResNet50 is Keras' v1, the others v1.5)")
        print(f"uptime after: {uptime()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any(n.startswith("onnxtrain") for n in failed) else 0


if __name__ == "__main__":
    run_main(main, "scaling_peers")

#!/usr/bin/env python3
"""The tools users already have read what onnxtrain writes (issue #21; ctest label `models`, run in
the corpus venv):

  tensorboard  `onnxtrain --tensorboard DIR` on the zoo CNN with validation: the `tensorboard`
               package's EventAccumulator reads DIR/train and DIR/validation back, with the tags
               Keras writes, the steps (epochs 0-based; batch scalars every N global steps) and
               the values of the metrics JSON (float32 rounding).
  onnxruntime  the model `onnxtrain --output` writes (zoo CNN with BatchNormalization, and the
               token classifier with integer inputs) loads in onnxruntime and gives onnxrun's
               outputs (within 1e-5 relative) and the same arg-max on every row.

    tests/models/interop.py tensorboard|onnxruntime --bin build/tools --work DIR
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"interop: FAIL: {' '.join(cmd)} exited {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def check(ok, what):
    print(f"interop: {'ok  ' if ok else 'FAIL'} {what}", flush=True)
    return ok


def tensorboard(a):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = os.path.join(a.work, "cnn.onnx")
    run([os.path.join(a.bin, "onnxzoo"), "cnn", "--input", "1x16x16", "--width", "4", "-o", model])
    tb, metrics = os.path.join(a.work, "tb"), os.path.join(a.work, "m.jsonl")
    # 200 examples at batch 32: 7 steps per epoch (the last partial), 21 steps; batch scalars at
    # steps 5, 10, 15, 20.
    run([os.path.join(a.bin, "onnxtrain"), model, "--data", "synthetic:200", "--val-data",
         "synthetic:64", "--epochs", "3", "--batch-size", "32", "--lr", "3e-3", "--threads", "2",
         "--tensorboard", tb, "--tensorboard-every", "5", "--metrics-json", metrics])
    epochs = [json.loads(line) for line in open(metrics)]
    ok = True

    def scalars(sub):
        ea = EventAccumulator(os.path.join(tb, sub))
        ea.Reload()
        return {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}

    train, val = scalars("train"), scalars("validation")
    ok &= check(set(train) == {"epoch_loss", "epoch_accuracy", "epoch_learning_rate",
                               "epoch_samples_per_second", "batch_loss", "batch_accuracy",
                               "batch_learning_rate"}, f"train tags {sorted(train)}")
    ok &= check(set(val) == {"epoch_loss", "epoch_accuracy"}, f"validation tags {sorted(val)}")

    def same(events, key, where):
        want = [(i, e[key]) for i, e in enumerate(epochs)]
        got = events.get(key.replace("val_", "epoch_") if key.startswith("val_") else "epoch_" + key, [])
        good = [s for s, _ in got] == [s for s, _ in want] and all(
            abs(g - w) <= 1e-6 * max(1.0, abs(w)) for (_, g), (_, w) in zip(got, want))
        return check(good, f"{where} {key}: {got} vs metrics {want}")

    ok &= same(train, "loss", "train")
    ok &= same(train, "accuracy", "train")
    ok &= same(val, "val_loss", "validation")
    ok &= same(val, "val_accuracy", "validation")
    steps = [s for s, _ in train.get("batch_loss", [])]
    ok &= check(steps == [5, 10, 15, 20], f"batch_loss steps {steps}")
    lrs = {round(v, 9) for _, v in train.get("batch_learning_rate", [])}
    ok &= check(lrs == {round(np.float32(3e-3).item(), 9)}, f"batch_learning_rate {lrs}")
    losses = [v for _, v in train.get("batch_loss", [])]
    ok &= check(all(np.isfinite(losses)) and 0 < min(losses), f"batch_loss values {losses}")
    return ok


def onnxruntime(a):
    import onnxruntime as ort

    ok = True
    rng = np.random.default_rng(3)
    cases = [
        ("cnn", ["--input", "1x16x16", "--width", "4"],
         {"input": rng.standard_normal((5, 1, 16, 16)).astype(np.float32)}),
        ("textcls", [], None),
    ]
    for name, opts, inputs in cases:
        model = os.path.join(a.work, f"{name}.onnx")
        trained = os.path.join(a.work, f"{name}_trained.onnx")
        run([os.path.join(a.bin, "onnxzoo"), name, *opts, "-o", model])
        run([os.path.join(a.bin, "onnxtrain"), model, "--data", "synthetic:128", "--val-data",
             "none", "--epochs", "2", "--batch-size", "16", "--lr", "3e-3", "--threads", "2",
             "--output", trained])
        sess = ort.InferenceSession(trained, providers=["CPUExecutionProvider"])
        if inputs is None:  # token ids below the embedding table, as synthetic: makes them
            inputs = {}
            for i in sess.get_inputs():
                shape = [5 if not isinstance(d, int) else d for d in i.shape]
                high = 2 if "mask" in i.name else 50
                inputs[i.name] = rng.integers(0, high, size=shape).astype(np.int64)
        cmd = [os.path.join(a.bin, "onnxrun"), trained, "--output-dir", os.path.join(a.work, name)]
        for k, v in inputs.items():
            path = os.path.join(a.work, f"{name}_{k}.npy")
            np.save(path, v)
            cmd += ["--input", f"{k}={path}"]
        run(cmd)
        for o, want in zip(sess.get_outputs(), sess.run(None, inputs)):
            got = np.load(os.path.join(a.work, name, o.name + ".npy"))
            err = float(np.max(np.abs(got - want))) / max(1e-6, float(np.max(np.abs(want))))
            ok &= check(got.shape == want.shape and err <= 1e-5,
                        f"{name} '{o.name}' {list(got.shape)}: onnxrun vs onnxruntime rel err {err:.1e}")
            if got.ndim == 2:
                ok &= check(bool(np.all(got.argmax(1) == want.argmax(1))), f"{name} arg-max per row")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["tensorboard", "onnxruntime"])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    ok = tensorboard(a) if a.what == "tensorboard" else onnxruntime(a)
    print(f"interop: {a.what}: {'passed' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

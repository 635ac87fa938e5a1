"""`import onnxtrain` (python/onnxtrain, issue #21): Trainer.fit on NumPy data learns, returns a
Keras-like History, releases the GIL, matches the command line's numerics contract (2 replicas =
1), saves a model that onnxruntime runs like onnxtrain.run, continues on a second fit, and turns
bad input into ValueError / RuntimeError / FileNotFoundError / TypeError with onnxtrain's message.
Run by ctest `python_api` (label models) in the corpus venv with PYTHONPATH=<build>/python."""

import os
import subprocess
import threading
import time

import numpy as np
import pytest

import onnxtrain

BIN = os.environ["ONNXTRAIN_BIN"]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("m") / "mlp.onnx")
    subprocess.run([os.path.join(BIN, "onnxzoo"), "mlp", "--input", "16", "--width", "8", "-o", path],
                   check=True, capture_output=True)
    return path


def separable(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 16)).astype(np.float32)
    w = np.random.default_rng(99).standard_normal(16).astype(np.float32)
    return x, (x @ w > 0).astype(np.int64)


def test_fit_learns_and_returns_history(mlp):
    x, y = separable(1024, 0)
    xv, yv = separable(256, 1)
    t = onnxtrain.Trainer(mlp, lr=1e-2, threads=1)
    h = t.fit((x, y), epochs=4, batch_size=32, validation_data=(xv, yv), verbose=0)
    assert h.epoch == [1, 2, 3, 4]
    assert set(h.history) >= {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert all(len(v) == 4 for v in h.history.values())
    assert h.history["loss"][-1] < 0.5 * h.history["loss"][0]
    assert h.history["val_accuracy"][-1] > 0.85  # chance is 0.5


def test_fit_releases_the_gil(mlp, monkeypatch):
    # A thread ticking every millisecond gets ticks in while the C++ training call runs only if
    # that call released the GIL (holding it, no other Python thread runs until it returns).
    x, y = separable(8192, 2)
    ticks, stop, window = [], threading.Event(), []
    real = onnxtrain._train

    def timed(*args):
        window.append(time.perf_counter())
        try:
            return real(*args)
        finally:
            window.append(time.perf_counter())

    monkeypatch.setattr(onnxtrain, "_train", timed)

    def tick():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    th = threading.Thread(target=tick)
    th.start()
    onnxtrain.Trainer(mlp, threads=1).fit((x, y), epochs=10, batch_size=16, verbose=0)
    stop.set()
    th.join()
    start, end = window
    inside = [t for t in ticks if start < t < end]
    # (Holding the GIL, at most a tick or two slip in as the call starts and returns.)
    assert len(inside) >= 10, f"{len(inside)} ticks during the {1e3 * (end - start):.0f} ms training call"


def test_two_replicas_follow_one(mlp):
    x, y = separable(512, 3)
    one = onnxtrain.Trainer(mlp, replicas=1, threads=2, optimizer="momentum", lr=0.05)
    two = onnxtrain.Trainer(mlp, replicas=2, threads=2, optimizer="momentum", lr=0.05)
    a = one.fit((x, y), epochs=2, global_batch_size=64, verbose=0).history["loss"]
    b = two.fit((x, y), epochs=2, global_batch_size=64, verbose=0).history["loss"]
    assert np.allclose(a, b, rtol=1e-5), (a, b)


def test_save_runs_in_onnxruntime_like_run(mlp, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    x, y = separable(512, 4)
    t = onnxtrain.Trainer(mlp, lr=1e-2, lr_schedule="warmup:2,cosine")
    t.fit({"input": x, "labels": y}, epochs=2, batch_size=64, verbose=0)
    path = tmp_path / "trained.onnx"
    t.save(path)
    ours = onnxtrain.run(path, x[:8])
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    theirs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"input": x[:8]})))
    assert list(ours) == list(theirs)
    for k in ours:
        assert ours[k].dtype == np.float32 and ours[k].shape == theirs[k].shape
        assert np.allclose(ours[k], theirs[k], rtol=1e-5, atol=1e-6)
    # The saved model is the trained one: it differs from the untrained model's outputs.
    assert not np.allclose(ours["logits"], onnxtrain.run(mlp, x[:8])["logits"])


def zoo_resnet18(tmp_path, seed):
    """(path, batch): onnxzoo's resnet18 at 32x32, width 16, 10 classes; 4 random images."""
    path = str(tmp_path / "r18.onnx")
    subprocess.run([os.path.join(BIN, "onnxzoo"), "resnet18", "--input", "3x32x32", "--width", "16",
                    "--classes", "10", "-o", path], check=True, capture_output=True)
    return path, np.random.default_rng(seed).standard_normal((4, 3, 32, 32)).astype(np.float32)


def test_conv_algorithm_winograd(tmp_path):
    # --conv-algorithm as a keyword (Trainer) and an argument (run): a resnet18 at 32x32 has 4
    # Winograd-eligible convolutions (stage 1's 3x3 on 8x8 maps); Winograd rounds differently
    # but stays within float32 noise of direct.
    path, x = zoo_resnet18(tmp_path, 5)
    direct = onnxtrain.run(path, x)["logits"]
    wino = onnxtrain.run(path, x, conv_algorithm="winograd")["logits"]
    assert np.allclose(wino, direct, rtol=1e-4, atol=1e-5 * np.abs(direct).max())
    assert not np.array_equal(wino, direct), "bit-identical: did Winograd run?"
    with pytest.raises(ValueError, match="conv_algorithm"):
        onnxtrain.run(path, x, conv_algorithm="fft")
    y = np.random.default_rng(6).integers(0, 10, 64)
    xs = np.random.default_rng(7).standard_normal((64, 3, 32, 32)).astype(np.float32)
    h = onnxtrain.Trainer(path, conv_algorithm="winograd", threads=1, lr=1e-3).fit(
        (xs, y), epochs=2, batch_size=32, verbose=0)
    assert np.isfinite(h.history["loss"]).all()
    with pytest.raises(ValueError, match="--conv-algorithm: expected direct or winograd"):
        onnxtrain.Trainer(path, conv_algorithm="fft").fit((xs, y), verbose=0)


def test_run_precision_bf16(tmp_path):
    # precision= is onnxrun's --precision (tools/inference_prep.h, shared): a resnet18's logits
    # in bf16 within bf16 rounding of float32's, not bit-identical; fp16 has no CPU kernels
    # here and is refused with onnxrun's message; an unknown name is a ValueError.
    path, x = zoo_resnet18(tmp_path, 8)
    f32 = onnxtrain.run(path, x)["logits"]
    try:
        bf16 = onnxtrain.run(path, x, precision="bf16")["logits"]
    except RuntimeError as e:  # a CPU without AVX512-BF16 / AMX: the refusal, then emulation
        assert "no native bf16 instructions" in str(e)
        bf16 = onnxtrain.run(path, x, precision="bf16", allow_emulation=True)["logits"]
    assert bf16.dtype == np.float32 and bf16.shape == f32.shape
    assert np.abs(bf16 - f32).max() < 0.05 * np.abs(f32).max()
    assert not np.array_equal(bf16, f32), "bit-identical to float32: did bf16 run?"
    with pytest.raises(RuntimeError, match="--precision fp16: this CPU has no native fp16"):
        onnxtrain.run(path, x, precision="fp16")
    with pytest.raises(ValueError, match="precision"):
        onnxtrain.run(path, x, precision="int8")


def test_second_fit_continues(mlp):
    x, y = separable(1024, 5)
    t = onnxtrain.Trainer(mlp, lr=1e-2)
    first = t.fit((x, y), epochs=2, batch_size=32, verbose=0).history["loss"]
    second = t.fit((x, y), epochs=1, batch_size=32, verbose=0).history["loss"]
    assert second[0] < first[0]


def test_errors_name_the_problem(mlp, tmp_path):
    x, y = separable(64, 6)
    t = onnxtrain.Trainer(mlp)
    with pytest.raises(ValueError, match=r"--lr: expected a number > 0, got '-1'"):
        t.fit((x, y), lr=-1, verbose=0)
    with pytest.raises(ValueError, match=r"unknown option|unknown|--no-such-flag"):
        t.fit((x, y), no_such_flag=3, verbose=0)
    with pytest.raises(RuntimeError, match=r"nothing.npz"):
        t.fit(str(tmp_path / "nothing.npz").join(["npz:", ""]), verbose=0)
    with pytest.raises(FileNotFoundError):
        onnxtrain.Trainer(tmp_path / "missing.onnx")
    with pytest.raises(ValueError, match=r'"labels"'):
        t.fit({"input": x}, verbose=0)
    with pytest.raises(TypeError):
        t.fit([x, y], verbose=0)
    with pytest.raises(RuntimeError, match=r"nothing trained yet"):
        onnxtrain.Trainer(mlp).save(tmp_path / "x.onnx")
    # save() never writes over the model the Trainer reads; the file keeps its bytes.
    t.fit((x, y), epochs=1, batch_size=16, verbose=0)
    before = open(mlp, "rb").read()
    with pytest.raises(ValueError, match=r"would overwrite the model this Trainer reads"):
        t.save(mlp)
    assert open(mlp, "rb").read() == before
    assert not [f for f in os.listdir(os.path.dirname(mlp)) if f.startswith(".onnxtrain-")]
    with pytest.raises(TypeError, match=r"complex128"):
        onnxtrain.run(mlp, np.zeros((2, 16), np.complex128))

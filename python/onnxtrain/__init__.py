"""onnxtrain from Python: train an ONNX model data-parallel as Keras' model.fit does.

    import numpy as np, onnxtrain
    t = onnxtrain.Trainer("model.onnx", replicas=2, optimizer="adam", lr=1e-3)
    history = t.fit((x, y), epochs=3, batch_size=32, validation_data=(xv, yv))
    history.history["val_accuracy"]            # one value per epoch, as Keras' History
    t.save("trained.onnx")
    out = onnxtrain.run("trained.onnx", {"input": x[:4]})   # {output name: ndarray}

Data is a NumPy pair (inputs, labels) -- inputs one array for a one-input model or a dict of
arrays by input name -- a dict of arrays with a "labels" entry, or any of the command line's data
specs as a string ("fashion-mnist", "images:DIR", "npz:FILE", "synthetic:N"). Every other keyword
is the onnxtrain command-line option of that name (lr_schedule="warmup:5,cosine" is
--lr-schedule warmup:5,cosine; True alone is a flag, such as sync_batchnorm=True). The training
runs in this process with the GIL released; errors raise ValueError (a bad option) or
RuntimeError (the model, data or a file), with onnxtrain's one-line message. A second fit()
continues from the weights the first one trained (the optimizer state starts afresh).
"""

import os
import shutil
import signal
import tempfile

import numpy as np

from ._onnxtrain import _inputs, _run, _train, usage  # noqa: F401

__all__ = ["Trainer", "History", "run", "usage"]


class History:
    """What fit() returns: history[key] is one value per epoch (loss, accuracy, val_loss,
    val_accuracy, seconds, samples_per_sec), as Keras' History.history; epochs their numbers."""

    def __init__(self, epochs):
        self.epoch = [e["epoch"] for e in epochs]
        self.history = {}
        for key in ("loss", "accuracy", "val_loss", "val_accuracy", "seconds", "samples_per_sec"):
            values = [e[key] for e in epochs]
            if any(v is not None for v in values):
                self.history[key] = values

    def __repr__(self):
        return f"History(epochs={self.epoch}, keys={list(self.history)})"


def _flags(options):
    args = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        else:
            args += [flag, str(value)]
    return args


class Trainer:
    """An ONNX model file and the options of its training (the onnxtrain command line's)."""

    def __init__(self, model, *, replicas=1, optimizer="adam", lr=1e-3, **options):
        self.model = os.fspath(model)
        if not os.path.isfile(self.model):
            raise FileNotFoundError(f"onnxtrain: no model file '{self.model}'")
        self.options = dict(replicas=replicas, optimizer=optimizer, lr=lr, **options)
        self._dir = tempfile.mkdtemp(prefix="onnxtrain-")
        self._trained = None  # the latest trained model, in self._dir

    def __del__(self):
        shutil.rmtree(getattr(self, "_dir", ""), ignore_errors=True)

    def _data_spec(self, data, tag):
        if isinstance(data, (str, os.PathLike)):
            return os.fspath(data)
        if isinstance(data, tuple) and len(data) == 2:
            x, y = data
            if isinstance(x, dict):
                arrays = dict(x)
            else:
                names = [name for name, _, _ in _inputs(self.model)]
                if len(names) != 1:
                    raise ValueError(f"the model has inputs {names}: pass a dict of arrays by input name")
                arrays = {names[0]: x}
            arrays["labels"] = y
        elif isinstance(data, dict):
            if "labels" not in data:
                raise ValueError('a dict of arrays needs a "labels" entry (class labels or targets)')
            arrays = dict(data)
        else:
            raise TypeError("data: expected (inputs, labels), a dict of arrays or a data-spec string")
        path = os.path.join(self._dir, f"{tag}.npz")
        np.savez(path, **{k: np.ascontiguousarray(v) for k, v in arrays.items()})
        return "npz:" + path

    def fit(self, data, *, epochs=1, batch_size=None, validation_data=None, verbose=1, **options):
        """Trains for `epochs` on `data` and returns a History. validation_data: the same forms
        as data; without it (and without validation_split / val_data) no validation runs."""
        out = os.path.join(self._dir, f"trained{len(os.listdir(self._dir))}.onnx")
        opts = dict(self.options)
        opts.update(options)
        opts.update(data=self._data_spec(data, "train"), epochs=epochs, batch_size=batch_size,
                    output=out)
        if validation_data is not None:
            opts["val_data"] = self._data_spec(validation_data, "val")
        elif "val_data" not in opts and "val_split" not in opts:
            opts["val_data"] = "none"
        epochs_done, stopped = _train([self._trained or self.model] + _flags(opts), verbose == 0)
        self._trained = out
        if stopped == signal.SIGINT:
            raise KeyboardInterrupt("onnxtrain: stopped by Ctrl-C after a finished step "
                                    "(the model trained so far is kept: save() writes it)")
        return History(epochs_done)

    def save(self, path):
        """Writes the trained inference model (float32, the original graph with trained weights)
        atomically: a temporary file in the same folder, renamed over `path`. The model this
        Trainer was built from is never overwritten (as onnxtrain --output refuses its input)."""
        if self._trained is None:
            raise RuntimeError("onnxtrain: nothing trained yet: call fit() first")
        path = os.fspath(path)
        if os.path.exists(path) and os.path.samefile(path, self.model):
            raise ValueError(f"onnxtrain: save('{path}') would overwrite the model this Trainer "
                             "reads; choose another path")
        fd, tmp = tempfile.mkstemp(prefix=".onnxtrain-", suffix=".tmp",
                                   dir=os.path.dirname(os.path.abspath(path)))
        try:
            with os.fdopen(fd, "wb") as out, open(self._trained, "rb") as src:
                shutil.copyfileobj(src, out)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise


def run(model, inputs, threads=0, conv_algorithm="direct", precision="fp32",
        allow_emulation=False):
    """The model's outputs on NumPy inputs ({input name: array}; one array for a one-input
    model), as onnxrun computes them: {output name: ndarray}. conv_algorithm="winograd" is
    onnxrun's --conv-algorithm winograd (3x3 stride-1 convolutions over maps >= 7x7);
    precision="bf16" / "fp16" its --precision (convolutions and matmuls in that precision,
    outputs float32; refused on a CPU without native kernels for it unless allow_emulation)."""
    if conv_algorithm not in ("direct", "winograd"):
        raise ValueError(f"conv_algorithm: expected 'direct' or 'winograd', got {conv_algorithm!r}")
    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"precision: expected 'fp32', 'bf16' or 'fp16', got {precision!r}")
    model = os.fspath(model)
    if not isinstance(inputs, dict):
        names = [name for name, _, _ in _inputs(model)]
        if len(names) != 1:
            raise ValueError(f"the model has inputs {names}: pass a dict of arrays by input name")
        inputs = {names[0]: inputs}
    return _run(model, {k: np.ascontiguousarray(v) for k, v in inputs.items()}, threads,
                conv_algorithm, precision, allow_emulation)

#!/usr/bin/env python3
"""Exports a torch.nn.Module to ONNX for training with onnxtrain, with either torch exporter, and
says what it did (README "Exporting a model for training").

    from export_torch import export_for_training
    export_for_training(model, (x,), "model.onnx")                        # dynamo exporter
    export_for_training(model, (x,), "model.onnx", exporter="classic")    # TorchScript exporter
    export_for_training(model, (), "bert.onnx", kwargs={"input_ids": ids, "attention_mask": m})

    python3 tools/export_torch.py torchvision.models:resnet18 --kwargs num_classes=10 \
        --input 4x3x32x32 -o resnet18.onnx [--exporter classic]

What it sets, and why (each default of torch.onnx.export would give a graph that trains
differently from the module):
  dynamo  (torch.onnx.export(dynamo=True)): optimize=False. The default optimizer folds
          BatchNormalization into the preceding Conv and merges initializers with equal values
          (e.g. all-ones LayerNorm scales), so their parameters can no longer be trained apart.
          The dynamo exporter writes the eval-mode graph even under model.train() (BN reads the
          running statistics, Dropout is gone); onnxtrain turns BN and Dropout back to training
          mode itself. Initializers keep torch's named_parameters() / named_buffers() names.
  classic (torch.onnx.export(dynamo=False)): training=TrainingMode.TRAINING,
          do_constant_folding=False. In eval mode this exporter folds BN into Conv and merges
          equal-valued parameters; in training mode it keeps both, and BN/Dropout are written
          in training mode (BatchNormalization training_mode=1; the trained model that onnxtrain
          writes keeps that graph, so export again from torch, or use dynamo, for inference).
  both:   every input and output gets a dynamic batch axis 0 (dynamic_axes), parameters are
          stored in the .onnx file (no external data), the module's train/eval mode is restored.
"""

import argparse
import importlib
import os
import sys

import numpy as np
import onnx
import torch
from onnx import numpy_helper

EXPORTERS = ("dynamo", "classic")


def _names(prefix, n, given):
    if given:
        return list(given)
    return [f"{prefix}{i}" if n > 1 else prefix for i in range(n)]


def _count_outputs(model, args, kwargs):
    with torch.no_grad():
        out = model(*args, **kwargs)
    if isinstance(out, torch.Tensor):
        return 1
    if isinstance(out, dict):
        return len(out)
    return len(out)


def describe(model, path):
    """What the exported file kept of the module: parameter names and merged/folded params."""
    m = onnx.load(path)
    inits = {t.name: t for t in m.graph.initializer}
    params = dict(model.named_parameters())
    kept = [n for n in params if n in inits]
    missing = [n for n in params if n not in inits]
    # a parameter that is not kept by name may still be there under another name, unchanged
    by_value = {}
    for n in missing:
        p = params[n].detach().cpu().numpy()
        for t in inits.values():
            if tuple(t.dims) == p.shape and np.array_equal(numpy_helper.to_array(t), p):
                by_value[n] = t.name
                break
    ops = [n.op_type for n in m.graph.node]
    n_bn_modules = sum(isinstance(x, torch.nn.modules.batchnorm._BatchNorm) for x in model.modules())
    return {
        "parameters": len(params),
        "kept_by_name": len(kept),
        "renamed": by_value,
        "lost": [n for n in missing if n not in by_value],
        "initializers": len(inits),
        "batchnorm_modules": n_bn_modules,
        "batchnorm_nodes": ops.count("BatchNormalization"),
        "nodes": len(ops),
        "opset": next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), None),
    }


def _restore_initializers(path, saved):
    """Sets every initializer named like a state_dict entry back to its saved value."""
    m = onnx.load(path)
    changed = False
    for t in m.graph.initializer:
        v = saved.get(t.name)
        if v is None or tuple(t.dims) != tuple(v.shape):
            continue
        want = v.cpu().numpy().astype(numpy_helper.to_array(t).dtype)
        if not np.array_equal(numpy_helper.to_array(t), want):
            t.CopyFrom(numpy_helper.from_array(want, t.name))
            changed = True
    if changed:  # a temp file renamed over the export: an interrupted save leaves the export
        tmp = path + ".tmp"
        onnx.save(m, tmp)
        os.replace(tmp, path)


def export_for_training(model, args, path, *, exporter="dynamo", kwargs=None, input_names=None,
                        output_names=None, opset=None, dynamic_batch=True, verbose=True):
    """Writes `model` called on (*args, **kwargs) to `path` as a trainable ONNX graph.

    exporter: "dynamo" (torch.onnx.export(dynamo=True, optimize=False)) or "classic"
    (dynamo=False, training=TRAINING, do_constant_folding=False). Input names default to the
    keyword names (kwargs) or input, input1, ...; outputs to output, output1, ... Returns
    describe()'s summary (parameters kept by name, renamed, lost; BN modules vs nodes) plus the
    settings used, and prints it unless verbose=False.
    """
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, not {exporter!r}")
    kwargs = dict(kwargs or {})
    args = tuple(args)
    if input_names is None:
        input_names = _names("input", len(args), None) if args else []
        input_names += list(kwargs)
    # Train-mode forward passes (the output count below, the classic exporter's trace) update BN
    # running statistics and num_batches_tracked, in the module and in the file the exporter writes
    # from it: both get the values from before the export back.
    saved = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    try:
        output_names = _names("output", _count_outputs(model, args, kwargs), output_names)
    finally:
        with torch.no_grad():
            for k, v in model.state_dict(keep_vars=True).items():
                v.copy_(saved[k])
    dynamic_axes = None
    if dynamic_batch:
        dynamic_axes = {n: {0: "batch"} for n in list(input_names) + list(output_names)}
    was_training = model.training
    settings = {}
    patched = False
    try:
        if exporter == "classic":
            model.train()
            if kwargs:
                # The classic exporter traces model(*args, **kwargs) with the keywords turned
                # into positions of forward's signature, so a keyword that is not forward's next
                # parameter (GPT-2: attention_mask comes after past_key_values) lands on the
                # wrong one. Call forward by keyword from positional inputs instead.
                names, inner = list(kwargs), model.forward
                model.forward = lambda *a: inner(**dict(zip(names, a)))
                args, kwargs, patched = tuple(args) + tuple(kwargs.values()), {}, True
            settings = dict(dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                            do_constant_folding=False, export_params=True,
                            opset_version=opset or 17)
        else:
            settings = dict(dynamo=True, optimize=False, external_data=False)
            if opset:
                settings["opset_version"] = opset
            if dynamic_batch and not (args and kwargs):
                # torch.export's own form (dynamic_axes works too, with a warning): one shared
                # symbol, so every input agrees on the batch size
                batch = torch.export.Dim("batch")
                dynamic_axes = None
                settings["dynamic_shapes"] = (
                    {k: {0: batch} for k in kwargs} if kwargs else tuple({0: batch} for _ in args))
        torch.onnx.export(model, args, path, kwargs=kwargs or None, input_names=list(input_names),
                          output_names=list(output_names), dynamic_axes=dynamic_axes, **settings)
    finally:
        if patched:
            del model.forward  # the instance attribute; the class's forward is back
        model.train(was_training)
        with torch.no_grad():
            for k, v in model.state_dict(keep_vars=True).items():
                v.copy_(saved[k])
    _restore_initializers(path, saved)
    info = describe(model, path)
    info.update(exporter=exporter, path=path, inputs=list(input_names), outputs=list(output_names),
                dynamic_batch=dynamic_batch,
                settings={k: str(v) for k, v in settings.items()})
    if verbose:
        print(summary(info))
    return info


def summary(info):
    s = ", ".join(f"{k}={v}" for k, v in info["settings"].items())
    lines = [f"export_torch: {info['path']}: {info['exporter']} exporter ({s}), "
             + (f"dynamic batch axis on {', '.join(info['inputs'] + info['outputs'])}"
                if info["dynamic_batch"] else "static shapes (dynamic_batch=False)")]
    lines.append(f"export_torch: {info['kept_by_name']}/{info['parameters']} parameters keep "
                 f"torch's names, {len(info['renamed'])} renamed, {len(info['lost'])} not found "
                 f"as initializers; BatchNormalization: {info['batchnorm_modules']} modules, "
                 f"{info['batchnorm_nodes']} nodes; opset {info['opset']}")
    for k, v in list(info["renamed"].items())[:10]:
        lines.append(f"export_torch:   renamed {k} -> {v}")
    for k in info["lost"][:10]:
        lines.append(f"export_torch:   not found: {k} (merged, folded or transformed)")
    return "\n".join(lines)


def _main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("factory", help="module:callable that returns the nn.Module, e.g. "
                    "torchvision.models:resnet18")
    ap.add_argument("--kwargs", default="", help="k=v,... for the factory (ints, floats, strings)")
    ap.add_argument("--input", action="append", required=True,
                    help="an example input shape like 4x3x32x32 (float32); NAME:SHAPE:int64 for "
                         "token ids (values 0..--vocab-1); repeatable")
    ap.add_argument("--vocab", type=int, default=100)
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--exporter", choices=EXPORTERS, default="dynamo")
    ap.add_argument("--opset", type=int)
    a = ap.parse_args()
    mod, _, fn = a.factory.partition(":")
    factory = getattr(importlib.import_module(mod), fn)
    fkw = {}
    for item in filter(None, a.kwargs.split(",")):
        k, _, v = item.partition("=")
        for conv in (int, float):
            try:
                v = conv(v)
                break
            except ValueError:
                pass
        fkw[k] = v
    model = factory(**fkw)
    args, kwargs = [], {}
    for spec in a.input:
        parts = spec.split(":")
        shape = [int(d) for d in parts[-2 if len(parts) == 3 else -1].split("x")]
        if len(parts) == 3 and parts[2] == "int64":
            t = torch.randint(0, a.vocab, shape)
        else:
            t = torch.randn(shape)
        if len(parts) >= 2:
            kwargs[parts[0]] = t
        else:
            args.append(t)
    export_for_training(model, tuple(args), a.output, exporter=a.exporter, kwargs=kwargs,
                        opset=a.opset)
    return 0


if __name__ == "__main__":
    sys.exit(_main())

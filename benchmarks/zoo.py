"""The zoo: capture -> the exact passes (verified) -> ONNX export (verified), model after model.

Three corpora:

* ``torchvision`` -- every torchvision classification model, random weights, at its default input size;
* ``timm`` -- the smallest model (by parameter count, counted on the ``meta`` device) of every timm
  architecture family, a family being the ``timm.models`` module a model is registered in
  (``timm.list_modules()``, ``timm.list_models(module=...)``); ``test_*`` models (timm's own tiny test
  configurations) are left out. Each model runs at its own ``pretrained_cfg`` input size;
* ``transformers`` -- transformers models built from small configs (2 layers, width 32...), no download.

For each model, in a fresh forked process:

1. **capture**: ``fxforge.prepare`` (build, seeded inputs, ``symbolic_trace`` then ``torch.export``, check);
2. **passes**: ``fxforge.optimize(captured, FIX_ORDER, verify=True, keep_going=True)`` -- every exact pass, in
   the order ``optimize`` runs them, each pass that changes the graph verified against the model, a
   failing pass rolled back with its reason; nothing is written;
3. **export**: ``fxforge.export_model(captured with the rewritten graph, "onnx", tmp)`` -- written to a
   temporary directory, reloaded with ONNX Runtime and verified against the model.

Recorded per model: capture method and dialect, passes that changed the graph, rolled-back passes and why,
BatchNorms before -> after and those left directly after a conv/linear (the fold target), whether the
passes verified and the export verified, seconds per stage (wall and CPU), and the first line of any error.
A model whose three stages take more than ``--timeout`` seconds (default 120) is killed and reported as
"skipped: over 2 min" with the stage it was in. The time is CPU time by default (``--time-by cpu``: the
budget is timeout x torch's thread count, what 2 minutes of wall time are on a quiet machine), so that other
jobs on a shared machine do not turn into skips; ``--time-by wall`` measures wall time.

    .venv/bin/python benchmarks/zoo.py [--corpus torchvision|timm|transformers|all] [--limit N]
        [--only NAME[,NAME]] [--timeout 120] [--json out.json]
    .venv/bin/python benchmarks/zoo.py --markdown out1.json [out2.json ...]   # tables for docs/zoo.md

The functions :func:`run_model` (one model, in this process) and :func:`summarize` are what
``tests/test_zoo_subset.py`` reuses.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing
import os
import platform
import re
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The per-model budget and the table are in CPU seconds, which mean work done only if idle OpenMP threads sleep:
# spinning threads on a shared 2-core machine turned resnet50's 13.4 CPU s into 95.6. Set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import torch.nn.functional as F
from torch import fx, nn

import fxforge
from fxforge.lint import FIX_ORDER
from fxforge.passes.merge_convs import value_users

CORPORA = ("torchvision", "timm", "transformers")
DEFAULT_TIMEOUT = 120.0


# --------------------------------------------------------------------------------------------------
# the machine


def machine() -> dict[str, Any]:
    """CPU model, the instruction-set flags that matter for these kernels, versions and thread count."""
    cpu, flags = platform.processor() or platform.machine(), set()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as file:
        for line in file:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    wanted = ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"]
    versions = {"torch": torch.__version__}
    for package in ("torchvision", "timm", "transformers", "onnx", "onnxruntime", "onnxscript"):
        with contextlib.suppress(Exception):
            versions[package] = __import__(package).__version__
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "flags": [flag for flag in wanted if flag in flags],
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "fxforge": str(Path(fxforge.__file__).resolve().parent),
        **versions,
    }


def machine_line(info: dict[str, Any]) -> str:
    flags = " ".join(info["flags"]) or "none of avx2/avx512/amx"
    packages = ("torchvision", "timm", "transformers", "onnx", "onnxruntime")
    others = ", ".join(f"{name} {info[name]}" for name in packages if name in info)
    return (
        f"{info['cpu']}, {info['cores']} cores ({flags}), torch {info['torch']} ({info['threads']} threads), "
        f"Python {info['python']}, {others}"
    )


# --------------------------------------------------------------------------------------------------
# the models


@dataclass
class ZooModel:
    """One model of a corpus: a spec for ``fxforge.prepare`` or a factory of an ``nn.Module``, and its inputs."""

    corpus: str
    name: str
    spec: str | None = None
    inputs: list[str] | None = None  # input specs; None: the spec's defaults
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    factory: Callable[[], nn.Module] | None = None  # used instead of ``spec``
    family: str | None = None  # timm: the module the model is registered in
    note: str = ""

    def capture(self) -> Any:
        if self.factory is not None:
            torch.manual_seed(0)
            module = self.factory().eval()
            return fxforge.prepare(module, self.inputs)
        return fxforge.prepare(self.spec, self.inputs, model_kwargs=self.model_kwargs or None)


def torchvision_models() -> list[ZooModel]:
    try:
        from fxforge.models import torchvision_classification_models

        names = torchvision_classification_models()
    except ImportError:  # the module moved: the same list, from torchvision itself
        import torchvision

        names = sorted(torchvision.models.list_models(module=torchvision.models))
    return [ZooModel("torchvision", name, f"torchvision:{name}") for name in names]


def timm_model(name: str, family: str | None = None, inputs: list[str] | None = None, **kwargs: Any) -> ZooModel:
    if family is None:
        family = next((m for m in _timm_modules() if name in _timm_models(m)), None)
    return ZooModel("timm", name, f"timm:{name}", inputs=inputs, model_kwargs=kwargs, family=family)


def _timm_modules() -> list[str]:
    import timm

    return list(timm.list_modules())


def _timm_models(module: str) -> list[str]:
    import timm

    return [name for name in timm.list_models(module=module) if not name.startswith("test_")]


def count_parameters_on_meta(spec: str) -> int:
    """Parameters of ``spec``, built on the meta device (no weight memory, no initialisation)."""
    loaded = fxforge.load_model(spec, device="meta")
    return sum(p.numel() for p in loaded.module.parameters())


def timm_families(log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """The smallest model of every timm family: ``[{family, name, params, models}]``, families sorted.

    Ties in parameter count go to the alphabetically first name. A model that cannot be built on the meta
    device is left out of the choice (and named in the log).
    """
    families = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module in _timm_modules():
            sized = []
            for name in _timm_models(module):
                try:
                    sized.append((count_parameters_on_meta(f"timm:{name}"), name))
                except Exception as exc:
                    log(f"  timm:{name} does not build on the meta device: {one_line(exc)}")
            if sized:
                params, name = min(sized)
                families.append({"family": module, "name": name, "params": params, "models": len(sized)})
    return families


# Small configs: two layers, width 32, vocabulary 100, 16 tokens at batch 2, 32x32 images.
BATCH, TOKENS, VOCAB = 2, 16, 100
IDS = f"{BATCH}x{TOKENS}:int64"
IMAGE = f"{BATCH}x3x32x32"
SMALL = {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 32, "intermediate_size": 64}
TEXT = {**SMALL, "vocab_size": VOCAB, "max_position_embeddings": 64}
DECODER = {**TEXT, "num_key_value_heads": 2}
VISION = {**SMALL, "image_size": 32, "patch_size": 8}
T5 = {"d_model": 32, "d_ff": 64, "num_layers": 2, "num_heads": 2, "d_kv": 16, "vocab_size": VOCAB}
BART = {
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "vocab_size": VOCAB,
    "max_position_embeddings": 64,
}
WHISPER = {
    "d_model": 32,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_layers": 2,
    "decoder_attention_heads": 2,
    "decoder_ffn_dim": 64,
    "num_mel_bins": 8,
    "max_source_positions": 16,
    "max_target_positions": 32,
    "vocab_size": VOCAB,
    "pad_token_id": 1,
    "bos_token_id": 2,
    "eos_token_id": 3,
    "decoder_start_token_id": 2,
}
STAGES4 = {"depths": [1, 1, 1, 1], "hidden_sizes": [8, 16, 32, 64]}


class EncoderDecoder(nn.Module):
    """Passes the decoder's token ids by keyword: ``export_model`` takes positional inputs only, and the
    seq2seq models' second positional parameter is an attention mask."""

    def __init__(self, model: nn.Module, input_name: str) -> None:
        super().__init__()
        self.model, self.input_name = model, input_name

    def forward(self, inputs: torch.Tensor, decoder_input_ids: torch.Tensor) -> Any:
        return self.model(**{self.input_name: inputs, "decoder_input_ids": decoder_input_ids})


def seq2seq(class_name: str, config: dict[str, Any], input_name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        loaded = fxforge.load_model(f"transformers:{class_name}", model_kwargs=config)
        return EncoderDecoder(loaded.module, input_name)

    return build


def transformers_models() -> list[ZooModel]:
    def spec(name: str, class_name: str, inputs: list[str], config: dict[str, Any], note: str = "") -> ZooModel:
        return ZooModel("transformers", name, f"transformers:{class_name}", inputs, config, note=note)

    clip = {
        "text_config": {**TEXT, "projection_dim": 32, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0},
        "vision_config": {**VISION, "projection_dim": 32},
        "projection_dim": 32,
    }
    return [
        spec("bert", "BertModel", [IDS], TEXT),
        spec("roberta", "RobertaModel", [IDS], TEXT),
        spec(
            "distilbert",
            "DistilBertModel",
            [IDS],
            {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64, "vocab_size": VOCAB},
        ),
        spec("albert", "AlbertModel", [IDS], {**TEXT, "embedding_size": 16}),
        spec("electra", "ElectraModel", [IDS], {**TEXT, "embedding_size": 16}),
        spec(
            "gpt2",
            "GPT2Model",
            [IDS],
            {
                "n_embd": 32,
                "n_layer": 2,
                "n_head": 2,
                "vocab_size": VOCAB,
                "n_positions": 64,
                "bos_token_id": 1,
                "eos_token_id": 2,
            },
        ),
        spec("llama", "LlamaModel", [IDS], DECODER),
        spec("mistral", "MistralModel", [IDS], DECODER),
        spec("qwen2", "Qwen2Model", [IDS], DECODER),
        spec("gemma", "GemmaModel", [IDS], {**DECODER, "head_dim": 16}),
        spec("phi", "PhiModel", [IDS], TEXT),
        spec("t5_encoder", "T5EncoderModel", [IDS], T5),
        ZooModel(
            "transformers",
            "t5",
            inputs=[IDS, IDS],
            factory=seq2seq("T5Model", T5, "input_ids"),
            note="T5Model(input_ids, decoder_input_ids=...) through a two-input wrapper",
        ),
        ZooModel(
            "transformers",
            "bart",
            inputs=[IDS, IDS],
            factory=seq2seq("BartModel", BART, "input_ids"),
            note="BartModel(input_ids, decoder_input_ids=...) through a two-input wrapper",
        ),
        ZooModel(
            "transformers",
            "whisper",
            inputs=[f"{BATCH}x8x32", f"{BATCH}x4:int64"],
            factory=seq2seq("WhisperModel", WHISPER, "input_features"),
            note="WhisperModel(input_features, decoder_input_ids=...) through a two-input wrapper",
        ),
        spec("vit", "ViTModel", [IMAGE], VISION),
        spec("deit", "DeiTModel", [IMAGE], VISION),
        spec("beit", "BeitModel", [IMAGE], VISION),
        # Dinov2Config sizes its MLP by mlp_ratio; it has no intermediate_size (fxforge refuses unknown fields)
        spec("dinov2", "Dinov2Model", [IMAGE], {k: v for k, v in VISION.items() if k != "intermediate_size"}),
        spec("clip", "CLIPModel", [IDS, IMAGE], clip, note="CLIPModel(input_ids, pixel_values)"),
        spec(
            "swin",
            "SwinModel",
            [IMAGE],
            {
                "image_size": 32,
                "patch_size": 2,
                "embed_dim": 16,
                "depths": [1, 1],
                "num_heads": [2, 2],
                "window_size": 4,
            },
        ),
        spec("convnext", "ConvNextModel", [IMAGE], {**STAGES4, "image_size": 32}),
        spec(
            "segformer",
            "SegformerModel",
            [IMAGE],
            {
                "hidden_sizes": [8, 16, 32, 64],
                "depths": [1, 1, 1, 1],
                "num_attention_heads": [1, 1, 2, 2],
                "decoder_hidden_size": 32,
            },
        ),
        spec(
            "wav2vec2",
            "Wav2Vec2Model",
            [f"{BATCH}x1600"],
            {
                **SMALL,
                "conv_dim": [16, 16],
                "conv_stride": [5, 2],
                "conv_kernel": [10, 3],
                "num_conv_pos_embeddings": 16,
                "num_conv_pos_embedding_groups": 2,
            },
        ),
    ] + [
        model
        for name, (class_name, inputs, config) in KWARGS_VISION.items()
        for model in (
            spec(name, class_name, inputs, config),
            ZooModel(
                "transformers",
                f"{name}/wrapped",
                inputs=inputs,
                factory=one_input(class_name, config),
                note=f"{class_name} called through a one-input wrapper (its forward takes **kwargs)",
            ),
        )
    ]


# Vision models whose forward takes ``**kwargs``: each runs as specified and through a one-input wrapper.
KWARGS_VISION: dict[str, tuple[str, list[str], dict[str, Any]]] = {
    "resnet": (
        "ResNetModel",
        [IMAGE],
        {"embedding_size": 16, "hidden_sizes": [16, 32, 64, 128], "depths": [1, 1, 1, 1], "layer_type": "basic"},
    ),
    "regnet": (
        "RegNetModel",
        [IMAGE],
        {"embedding_size": 16, "hidden_sizes": [16, 32, 64, 128], "depths": [1, 1, 1, 1], "groups_width": 8},
    ),
    "mobilenet_v2": ("MobileNetV2Model", [IMAGE], {"image_size": 32, "depth_multiplier": 0.35}),
    "mobilevit": (
        "MobileViTModel",
        [f"{BATCH}x3x64x64"],
        {"image_size": 64, "hidden_sizes": [16, 24, 32], "neck_hidden_sizes": [8, 8, 16, 16, 24, 24, 32]},
    ),
    "efficientnet": (
        "EfficientNetModel",
        [IMAGE],
        {"image_size": 32, "width_coefficient": 0.25, "depth_coefficient": 0.25, "hidden_dim": 320},
    ),
    "levit": (
        "LevitModel",
        [f"{BATCH}x3x64x64"],
        {
            "image_size": 64,
            "hidden_sizes": [32, 48, 64],
            "num_attention_heads": [2, 2, 2],
            "depths": [1, 1, 1],
            "key_dim": [8, 8, 8],
        },
    ),
}


class OneInput(nn.Module):
    """Calls ``model(x)``: symbolic tracing then traces through the model's ``forward`` with no ``**kwargs``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> Any:
        return self.model(x)


def one_input(class_name: str, config: dict[str, Any]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        return OneInput(fxforge.load_model(f"transformers:{class_name}", model_kwargs=config).module)

    return build


# --------------------------------------------------------------------------------------------------
# BatchNorms


_BN_ATEN = {
    "batch_norm",
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit_functional",
    "_batch_norm_with_update",
    "_batch_norm_no_update",
    "_batch_norm_impl_index",
    "cudnn_batch_norm",
    "miopen_batch_norm",
}
_BN_FUNCTIONS = {F.batch_norm, torch.batch_norm, torch.native_batch_norm}
_CONV_FUNCTIONS = {F.conv1d: "conv", F.conv2d: "conv", F.conv3d: "conv", F.linear: "linear"}
_CONV_FUNCTIONS.update({F.conv_transpose1d: "conv_transpose", F.conv_transpose2d: "conv_transpose"})
_CONV_FUNCTIONS[F.conv_transpose3d] = "conv_transpose"
_CONV_ATEN = {"conv1d": "conv", "conv2d": "conv", "conv3d": "conv", "linear": "linear", "addmm": "linear"}
_CONV_ATEN.update({"conv_transpose1d": "conv_transpose", "conv_transpose2d": "conv_transpose"})
_CONV_ATEN.update({"conv_transpose3d": "conv_transpose", "convolution": "conv", "_convolution": "conv"})


def _aten_name(node: fx.Node) -> str | None:
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        return node.target._overloadpacket.__name__
    return None


def _module(gm: nn.Module, node: fx.Node) -> nn.Module | None:
    if node.op != "call_module":
        return None
    with contextlib.suppress(AttributeError):
        return gm.get_submodule(str(node.target))
    return None


def is_batch_norm(gm: nn.Module, node: fx.Node) -> bool:
    """A BatchNorm call in either dialect: a torch.nn BatchNorm module, ``F.batch_norm``, an ATen batch norm."""
    if node.op == "call_module":
        return isinstance(_module(gm, node), nn.modules.batchnorm._BatchNorm)
    if node.op == "call_function":
        name = _aten_name(node)
        return name in _BN_ATEN if name is not None else node.target in _BN_FUNCTIONS
    return False


def producer_kind(gm: nn.Module, node: fx.Node) -> str | None:
    """``"conv"``, ``"conv_transpose"`` or ``"linear"`` when ``node`` computes one, else None."""
    if node.op == "call_module":
        module = _module(gm, node)
        if isinstance(module, nn.modules.conv._ConvTransposeNd):
            return "conv_transpose"
        if isinstance(module, nn.modules.conv._ConvNd):
            return "conv"
        return "linear" if isinstance(module, nn.Linear) else None
    if node.op != "call_function":
        return None
    name = _aten_name(node)
    if name is None:
        return _CONV_FUNCTIONS.get(node.target)
    kind = _CONV_ATEN.get(name)
    if name in ("convolution", "_convolution") and len(node.args) > 6 and node.args[6]:
        return "conv_transpose"
    return kind


def batch_norms(gm: fx.GraphModule) -> dict[str, Any]:
    """BatchNorm calls in ``gm``; those whose input comes straight from a conv/linear, with the number of nodes
    that read the conv/linear's value (a node that reads only its shape, rank or dtype does not count: timm's
    ``assert x.ndim == 4``); and BatchNorms hidden inside leaf modules that are not BatchNorms themselves (the
    graph cannot see them)."""
    total, after, hidden = 0, [], 0
    for node in gm.graph.nodes:
        if is_batch_norm(gm, node):
            total += 1
            source = node.args[0] if node.args else node.kwargs.get("input")
            if isinstance(source, fx.Node):
                kind = producer_kind(gm, source)
                if kind is not None:
                    readers = len(value_users(source))  # reads of its shape or rank (timm's asserts) do not count
                    after.append(f"{node.name} after {source.name} ({kind}, {readers} users)")
        elif node.op == "call_module":
            module = _module(gm, node)
            if module is not None:
                hidden += sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())
    return {"count": total, "after_conv": after, "in_leaf_modules": hidden}


_AFTER = re.compile(r"\((\w+), (\d+) users?\)$")


def bn_left(census: dict[str, Any] | None) -> tuple[list[str], list[str]]:
    """``census["after_conv"]`` split in two: BatchNorms that are the conv/linear's only user (the fold target:
    folding is exact and free) and BatchNorms on a conv/linear output that other nodes also read (folding would
    change what they read; it would take a second copy of the conv)."""
    sole, shared = [], []
    for item in (census or {}).get("after_conv", []):
        match = _AFTER.search(item)
        (sole if match is None or match.group(2) == "1" else shared).append(item)
    return sole, shared


# --------------------------------------------------------------------------------------------------
# one model


def one_line(exc: BaseException, limit: int = 240) -> str:
    """``Type: first line`` of an error (fxforge's own message, without its hint), for a table cell."""
    message = getattr(exc, "message", None) if isinstance(exc, fxforge.FxforgeError) else None
    text = str(message if message is not None else exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:limit]


def _verify_line(check: Any) -> str:
    if check is None:
        return "not verified"
    if check.divergence is not None:
        return check.divergence.describe()
    return "; ".join(check.problems[:2]) or "verification failed"


def _stage(record: dict[str, Any], name: str, report: Callable[[dict[str, Any]], None] | None) -> None:
    record["stage"] = name
    if report is not None:
        report(record)


def run_model(model: ZooModel, report: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Capture, run the exact passes (verified, keep going) and export to ONNX (verified) one model.

    ``report`` is called with the record as it stands when each stage starts (the parent process keeps the
    last one, to say where a model that ran out of time was).
    """
    record = _empty_record(model)
    start, cpu_start = time.perf_counter(), time.process_time()
    cpu = record["cpu_seconds"] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _stage(record, "capture", report)
        captured = _capture(model, record)
        cpu["capture"] = round(time.process_time() - cpu_start, 1)
        if captured is not None:
            _stage(record, "passes", report)
            rewritten = _passes(captured, record)
            cpu["passes"] = round(time.process_time() - cpu_start - cpu["capture"], 1)
            _stage(record, "export", report)
            _export(captured, rewritten, record)
            cpu["export"] = round(time.process_time() - cpu_start - cpu["capture"] - cpu["passes"], 1)
    record["seconds"]["total"] = round(time.perf_counter() - start, 2)
    cpu["total"] = round(time.process_time() - cpu_start, 1)  # every thread of this process
    record["load_average"] = round(os.getloadavg()[0], 2)  # other jobs on the machine slow every stage
    record["stage"] = None
    record["status"] = "ok" if model_ok(record) else "failed"
    return record


def _capture(model: ZooModel, record: dict[str, Any]) -> Any:
    start = time.perf_counter()
    captured = None
    try:
        captured = model.capture()
    except Exception as exc:
        record["capture"]["error"] = one_line(exc)
    record["seconds"]["capture"] = round(time.perf_counter() - start, 2)
    if captured is None:
        return None
    capture = record["capture"]
    capture["method"] = captured.record.method
    capture["dialect"] = captured.dialect
    capture["leaves"] = list(captured.record.leaves)
    capture["params"] = sum(p.numel() for p in captured.original.parameters())
    capture["inputs"] = [
        "x".join(map(str, t.shape)) + ("" if t.dtype == torch.float32 else f":{str(t.dtype).removeprefix('torch.')}")
        for t in captured.example_inputs
        if isinstance(t, torch.Tensor)
    ]
    failed = [check for check in captured.record.checks if not check.ok]
    if failed:
        capture["error"] = f"capture check failed: {getattr(failed[0], 'message', failed[0])}"[:240]
        return None
    capture["ok"] = True
    record["bn_before"] = batch_norms(captured.graph_module)
    return captured


def _passes(captured: Any, record: dict[str, Any]) -> Any:
    """The rewritten Captured (the captured one when the pipeline itself raised)."""
    start = time.perf_counter()
    passes: dict[str, Any] = {"ok": False, "changed": [], "rolled_back": [], "unverified": []}
    record["passes"] = passes
    try:
        result = fxforge.optimize(captured, list(FIX_ORDER), verify=True, keep_going=True)
    except Exception as exc:
        passes["error"] = one_line(exc)
        record["seconds"]["passes"] = round(time.perf_counter() - start, 2)
        record["bn_after"] = record["bn_before"]
        return captured
    pipeline = result.pipeline
    for step in pipeline.steps:
        name = step.result.name
        if step.rolled_back:
            passes["rolled_back"].append({"pass": name, "reason": str(step.rolled_back)[:240]})
        elif step.result.changed:
            passes["changed"].append(name)
            if step.verification is None or not step.verification.ok:
                passes["unverified"].append({"pass": name, "reason": _verify_line(step.verification)})
    if pipeline.problem:
        passes["error"] = str(pipeline.problem)[:240]
    elif pipeline.verification is not None and not pipeline.verification.ok:
        passes["error"] = "final check: " + _verify_line(pipeline.verification)
    passes["ok"] = pipeline.ok and not passes["rolled_back"] and not passes["unverified"] and "error" not in passes
    record["seconds"]["passes"] = round(time.perf_counter() - start, 2)
    record["bn_after"] = batch_norms(pipeline.graph_module)
    return dataclasses.replace(captured, graph_module=pipeline.graph_module)


def _export(captured: Any, rewritten: Any, record: dict[str, Any]) -> None:
    start = time.perf_counter()
    export: dict[str, Any] = {"ok": False}
    record["export"] = export
    # fxforge exports the graph for a torch-dialect capture and the model itself for an ATen one
    export["source"] = "graph" if captured.dialect == "torch" else "model"
    try:
        with tempfile.TemporaryDirectory(prefix="fxforge-zoo-") as tmp:
            result = fxforge.export_model(rewritten, "onnx", Path(tmp) / "model.onnx")
    except Exception as exc:
        export["error"] = one_line(exc)
    else:
        export["exporter"] = result.exporter
        export["ok"] = bool(result.ok and result.verification is not None and result.verification.ok)
        if result.verification is not None:
            export["max_abs_err"] = result.verification.max_abs_err
        if not export["ok"]:
            export["error"] = "verification failed: " + _verify_line(result.verification)
    record["seconds"]["export"] = round(time.perf_counter() - start, 2)


def model_ok(record: dict[str, Any]) -> bool:
    return bool(
        record["capture"]["ok"]
        and (record["passes"] or {}).get("ok")
        and (record["export"] or {}).get("ok")
        and not bn_left(record.get("bn_after"))[0]
    )


# --------------------------------------------------------------------------------------------------
# isolation: one forked process per model, killed past the time limit


def cpu_seconds_of(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` (all its threads) from ``/proc``; None where there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)
    except (OSError, ValueError, IndexError):
        return None


def run_isolated(
    model: ZooModel, timeout: float, *, by: str = "cpu", wall_limit: float | None = None
) -> dict[str, Any]:
    """:func:`run_model` in a forked child, killed and reported as skipped once it has taken ``timeout`` seconds.

    ``by="cpu"`` (default) measures the child's CPU time against ``timeout`` x torch's thread count -- what
    ``timeout`` seconds of wall time are on a quiet machine -- so that other jobs on a shared machine do not
    turn slow wall clocks into skips; ``wall_limit`` (default 8 x ``timeout``) still stops a child that makes no
    progress. ``by="wall"`` measures wall time only. Forking keeps the parent's imports (seconds per model
    otherwise); the parent runs no tensor code, so no thread pool is inherited half-started.
    """
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child() -> None:
        receive.close()
        try:
            record = run_model(model, report=lambda partial: send.send(("partial", partial)))
            send.send(("done", record))
        except BaseException as exc:  # a bug here must still come back as a row
            send.send(("crash", f"{one_line(exc)} | {traceback.format_exc(limit=3)[-300:]}"))
        finally:
            send.close()

    threads = torch.get_num_threads()
    cpu_budget = timeout * threads if by == "cpu" else None
    wall_budget = (wall_limit or 8 * timeout) if by == "cpu" else timeout
    process = context.Process(target=child, daemon=True)
    start = time.perf_counter()
    process.start()
    send.close()
    last: dict[str, Any] = _empty_record(model)
    final: dict[str, Any] | None = None
    crash: str | None = None
    over: str | None = None
    used: float | None = None
    while final is None and crash is None:
        elapsed = time.perf_counter() - start
        used = cpu_seconds_of(process.pid) if cpu_budget is not None else None
        if elapsed >= wall_budget:
            over = f"{elapsed:.0f} s wall"
        elif used is not None and cpu_budget is not None and used >= cpu_budget:
            over = f"{used:.0f} CPU s = {_duration(timeout)} on {threads} threads"
        if over:
            break
        try:
            if not receive.poll(min(wall_budget - elapsed, 1.0)):
                if not process.is_alive() and not receive.poll(0):
                    break
                continue
            kind, payload = receive.recv()
        except (EOFError, OSError):
            break
        if kind == "partial":
            last = payload
        elif kind == "done":
            final = payload
        else:
            crash = payload
    elapsed = time.perf_counter() - start
    if final is None and process.is_alive():
        process.kill()
    process.join(10)
    receive.close()
    if final is not None:
        return final
    last = dict(last)
    last["seconds"] = {**last.get("seconds", {}), "total": round(elapsed, 2)}
    if used is not None:
        last["cpu_seconds"] = {**last.get("cpu_seconds", {}), "total": round(used, 1)}
    stage = last.get("stage") or "start"
    if crash is not None:
        last["status"], last["reason"] = "failed", f"crashed in {stage}: {crash}"
    elif over is not None:
        last["status"] = "skipped"
        last["reason"] = f"skipped: over {_duration(timeout)} (in {stage}, after {over})"
    else:
        code = process.exitcode
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        last["status"], last["reason"] = "failed", f"process died in {stage} ({how}; out of memory?)"
    return last


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds % 60 == 0 else f"{seconds:g} s"


def _empty_record(model: ZooModel) -> dict[str, Any]:
    return {
        "corpus": model.corpus,
        "name": model.name,
        "family": model.family,
        "spec": model.spec,
        "note": model.note,
        "status": "failed",
        "stage": None,
        "capture": {"ok": False},
        "passes": None,
        "export": None,
        "seconds": {},
    }


def in_child(function: Callable[[], Any]) -> Any:
    """``function()`` in a forked child (the parent stays free of tensor code); its result comes back pickled."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child() -> None:
        try:
            send.send(("ok", function()))
        except BaseException as exc:
            send.send(("error", one_line(exc)))

    process = context.Process(target=child, daemon=True)
    process.start()
    send.close()
    try:
        kind, payload = receive.recv()
    except EOFError:
        kind, payload = "error", f"child died (exit code {process.exitcode})"
    process.join()
    if kind == "error":
        raise RuntimeError(payload)
    return payload


# --------------------------------------------------------------------------------------------------
# summaries and tables


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts and percentages for one corpus. Models skipped over the time limit are counted apart and left out
    of the percentages (they were not judged); "captured" means the capture check passed."""
    judged = [r for r in records if r["status"] != "skipped"]
    captured = [r for r in judged if r["capture"]["ok"]]
    verified = [r for r in captured if (r["passes"] or {}).get("ok")]
    exported = [r for r in captured if (r["export"] or {}).get("ok")]
    left = [r for r in captured if bn_left(r.get("bn_after"))[0]]
    shared = [r for r in captured if bn_left(r.get("bn_after"))[1]]
    return {
        "models": len(records),
        "skipped": len(records) - len(judged),
        "captured": len(captured),
        "capture_failed": len(judged) - len(captured),
        "verified": len(verified),
        "verified_pct": _pct(len(verified), len(captured)),
        "bn_after_conv_left": sum(len(bn_left(r["bn_after"])[0]) for r in left),
        "models_with_bn_after_conv_left": len(left),
        "bn_after_shared_conv_left": sum(len(bn_left(r["bn_after"])[1]) for r in shared),
        "models_with_bn_after_shared_conv_left": len(shared),
        "bn_before": sum(r.get("bn_before", {}).get("count", 0) for r in captured),
        "bn_after": sum(r.get("bn_after", {}).get("count", 0) for r in captured),
        "exported": len(exported),
        "export_pct": _pct(len(exported), len(captured)),
        "ok": sum(r["status"] == "ok" for r in records),
        "seconds": round(sum(r["seconds"].get("total", 0.0) for r in records), 1),
    }


def _pct(part: int, whole: int) -> float | None:
    return round(100.0 * part / whole, 1) if whole else None


def summary_line(corpus: str, summary: dict[str, Any]) -> str:
    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{value:g}%"

    return (
        f"{corpus}: {summary['models']} models, {summary['skipped']} skipped over the time limit, "
        f"{summary['captured']} captured ({summary['capture_failed']} failed), "
        f"verified {pct(summary['verified_pct'])} ({summary['verified']}/{summary['captured']}), "
        f"BN left after a conv/linear it alone reads {summary['bn_after_conv_left']} "
        f"(in {summary['models_with_bn_after_conv_left']} models; BNs {summary['bn_before']} -> {summary['bn_after']}; "
        f"{summary['bn_after_shared_conv_left']} more after a conv/linear other nodes read too, in "
        f"{summary['models_with_bn_after_shared_conv_left']} models), "
        f"export verified {pct(summary['export_pct'])} of captured ({summary['exported']}/{summary['captured']}), "
        f"{summary['seconds'] / 60:.1f} min"
    )


def _short(number: int | None) -> str:
    if number is None:
        return ""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if number >= size:
            return f"{number / size:.1f}{unit}"
    return str(number)


def errors_of(record: dict[str, Any]) -> list[str]:
    """One line per failed stage: ``stage: error``."""
    lines = []
    if record.get("reason"):
        lines.append(record["reason"])
    if record["capture"].get("error"):
        lines.append(f"capture: {record['capture']['error']}")
    passes = record["passes"] or {}
    for item in passes.get("rolled_back", []):
        lines.append(f"passes: {item['pass']} rolled back: {item['reason']}")
    for item in passes.get("unverified", []):
        lines.append(f"passes: {item['pass']} not verified: {item['reason']}")
    if passes.get("error"):
        lines.append(f"passes: {passes['error']}")
    left, shared = bn_left(record.get("bn_after"))
    if left:
        lines.append(f"BN left after conv/linear: {', '.join(left[:3])}{' ...' if len(left) > 3 else ''}")
    if shared:
        more = " ..." if len(shared) > 2 else ""
        lines.append(
            f"note: {len(shared)} BN after a conv whose output is read elsewhere: {', '.join(shared[:2])}{more}"
        )
    export = record["export"] or {}
    if export.get("error"):
        lines.append(f"export: {export['error']}")
    return lines


def row_cells(record: dict[str, Any]) -> list[str]:
    capture, passes, export = record["capture"], record["passes"] or {}, record["export"] or {}
    seconds = record["seconds"]
    before, after = record.get("bn_before"), record.get("bn_after")
    bn = f"{before['count']} → {after['count']}" if before and after else ""
    if before and before["in_leaf_modules"]:
        bn += f" (+{before['in_leaf_modules']} in leaves)"
    method = f"{capture.get('method', '')}/{capture.get('dialect', '')}" if capture.get("method") else "—"
    if not capture["ok"]:
        method += " ✗"
    verify = "" if not capture["ok"] else "—" if not passes else ("ok" if passes.get("ok") else "**FAIL**")
    exported = "" if not capture["ok"] else "—" if not export else ("ok" if export.get("ok") else "**FAIL**")
    if export.get("ok") and export.get("exporter") != "dynamo":
        exported += f" ({export.get('exporter')})"
    times = "/".join(f"{seconds[s]:.1f}" if s in seconds else "—" for s in ("capture", "passes", "export"))
    cpu = record.get("cpu_seconds", {}).get("total")
    name = record["name"] + (f" ({record['family']})" if record.get("family") not in (None, record["name"]) else "")
    return [
        name,
        _short(capture.get("params")),
        " ".join(capture.get("inputs", [])),
        method,
        ", ".join(passes.get("changed", [])),
        bn,
        _left_cell(after),
        verify,
        exported,
        times,
        "" if cpu is None else f"{cpu:.0f}",
        "; ".join(errors_of(record)).replace("|", "\\|"),
    ]


def _left_cell(census: dict[str, Any] | None) -> str:
    if not census:
        return ""
    sole, shared = bn_left(census)
    return f"{len(sole)}" + (f" (+{len(shared)} shared)" if shared else "")


HEADERS = [
    "model",
    "params",
    "input",
    "capture",
    "passes that changed the graph",
    "BN before → after",
    "BN after conv left",
    "verified",
    "ONNX verified",
    "wall s capture/passes/export",
    "CPU s",
    "errors",
]


def markdown_table(records: Sequence[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row_cells(r)) + " |" for r in records]
    return "\n".join(lines)


def progress_line(index: int, total: int, record: dict[str, Any]) -> str:
    capture, passes, export = record["capture"], record["passes"] or {}, record["export"] or {}
    before, after = record.get("bn_before"), record.get("bn_after")
    parts = [f"[{index}/{total}] {record['corpus']} {record['name']}", record["status"].upper()]
    if capture.get("method"):
        parts.append(f"{_short(capture.get('params'))} {' '.join(capture.get('inputs', []))}")
        parts.append(f"{capture['method']}/{capture['dialect']}")
    if capture["ok"] and record["passes"] is not None:
        parts.append("passes: " + (",".join(passes.get("changed", [])) or "none changed"))
        if before and after:
            parts.append(f"BN {before['count']}->{after['count']} (left after conv {_left_cell(after)})")
        if record["passes"] is not None:
            parts.append("verify " + ("ok" if passes.get("ok") else "FAIL"))
        if record["export"] is not None:
            parts.append("export " + ("ok" if export.get("ok") else "FAIL"))
    seconds = record["seconds"]
    stages = " + ".join(f"{seconds[s]:.1f}" for s in ("capture", "passes", "export") if s in seconds)
    cpu = record.get("cpu_seconds", {}).get("total")
    load = record.get("load_average")
    parts.append(
        f"({stages} s" + (f"; {cpu:.0f} CPU s" if cpu is not None else "") + (f"; load {load}" if load else "") + ")"
    )
    line = "  ".join(parts)
    for error in errors_of(record):
        line += f"\n      {error}"
    return line


# --------------------------------------------------------------------------------------------------
# the command line


def select_models(corpus: str, only: Sequence[str], log: Callable[[str], None]) -> list[ZooModel]:
    if corpus == "torchvision":
        models = torchvision_models()
    elif corpus == "transformers":
        models = transformers_models()
    elif only:  # named timm models need no family search
        return [timm_model(name) for name in only if in_child(lambda name=name: _is_timm_model(name))]
    else:
        start = time.perf_counter()
        log("timm: choosing the smallest model of each family (parameters counted on the meta device) ...")
        families = in_child(lambda: timm_families(log))
        log(f"timm: {len(families)} families chosen in {time.perf_counter() - start:.0f} s")
        return [timm_model(f["name"], f["family"]) for f in families]
    if only:
        models = [m for m in models if m.name in only]
    return models


def _is_timm_model(name: str) -> bool:
    import timm

    return bool(timm.is_model(name))


def run_corpus(
    corpus: str,
    models: Sequence[ZooModel],
    timeout: float,
    log: Callable[[str], None],
    by: str = "cpu",
    records: list[dict[str, Any]] | None = None,
    saved: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Every model in turn; each record is appended to ``records`` and ``saved()`` called after it, so an
    interrupted run (hours on 2 cores) leaves every finished row in its ``--json`` file."""
    records = [] if records is None else records
    for index, model in enumerate(models, 1):
        record = run_isolated(model, timeout, by=by)
        records.append(record)
        log(progress_line(index, len(models), record))
        if saved is not None:
            saved()
    return records


def merge_runs(paths: Iterable[str]) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """The machine of the first file and every corpus's records, in first-seen order; a model that appears in a
    later file (a re-run, e.g. ``--only`` of the models skipped while the machine was busy) replaces it."""
    machine_info: dict[str, Any] = {}
    corpora: dict[str, dict[str, dict[str, Any]]] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        machine_info = machine_info or data["machine"]
        for corpus, records in data["corpora"].items():
            by_name = corpora.setdefault(corpus, {})
            for record in records:
                if record["name"] in by_name and record["status"] == "skipped" != by_name[record["name"]]["status"]:
                    continue  # a re-run that ran out of time does not replace a finished row
                by_name[record["name"]] = record
    return machine_info, {corpus: list(records.values()) for corpus, records in corpora.items()}


def render_markdown(paths: Iterable[str]) -> str:
    machine_info, corpora = merge_runs(paths)
    out = [f"Machine: {machine_line(machine_info)}\n"]
    for corpus, records in corpora.items():
        summary = summarize(records)
        out.append(f"### {corpus}\n\n{summary_line(corpus, summary)}\n\n{markdown_table(records)}\n")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=[*CORPORA, "all"], default="all")
    parser.add_argument("--limit", type=int, help="the first N models of each corpus")
    parser.add_argument("--only", help="comma-separated model names (timm: any timm model name)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per model (default 120)")
    parser.add_argument(
        "--time-by",
        choices=["cpu", "wall"],
        default="cpu",
        help="cpu (default): the limit is timeout x threads of CPU time (robust to other jobs); wall: wall time",
    )
    parser.add_argument("--json", dest="json_path", help="write every record and summary to this file")
    parser.add_argument("--markdown", nargs="+", metavar="JSON", help="print docs tables from --json files and exit")
    args = parser.parse_args(argv)
    if args.markdown:
        print(render_markdown(args.markdown))
        return 0

    def log(line: str) -> None:
        print(line, flush=True)

    info = machine()
    log(f"zoo: capture -> exact passes {','.join(FIX_ORDER)} (verified, keep going) -> ONNX (verified)")
    log(f"machine: {machine_line(info)}")
    log(f"fxforge: {info['fxforge']}")
    # Import the exporters once here: forked children then start without it (pure imports, no tensor code).
    with contextlib.suppress(ImportError):
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
        import torch.onnx  # noqa: F401
    for package in ("timm", "transformers", "torchvision"):
        with contextlib.suppress(ImportError):
            __import__(package)
    only = [name.strip() for name in (args.only or "").split(",") if name.strip()]
    corpora = CORPORA if args.corpus == "all" else (args.corpus,)
    results: dict[str, list[dict[str, Any]]] = {}
    summaries: dict[str, dict[str, Any]] = {}
    payload: dict[str, Any] = {
        "machine": info,
        "timeout_s": args.timeout,
        "time_by": args.time_by,
        "corpora": results,
        "summary": summaries,
    }
    wall: dict[str, float] = {}
    for corpus in corpora:
        start = time.perf_counter()
        models = select_models(corpus, only, log)
        if args.limit is not None:
            models = models[: args.limit]
        log(f"{corpus}: {len(models)} models")

        def save() -> None:
            if args.json_path:
                Path(args.json_path).write_text(json.dumps(payload, indent=1, default=str))

        results[corpus] = []
        run_corpus(corpus, models, args.timeout, log, args.time_by, records=results[corpus], saved=save)
        summaries[corpus] = summarize(results[corpus])
        wall[corpus] = round(time.perf_counter() - start, 1)
        summaries[corpus]["wall_seconds"] = wall[corpus]
        save()
    log("")
    for corpus in corpora:
        log(summary_line(corpus, summaries[corpus]) + f" (wall {wall[corpus] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

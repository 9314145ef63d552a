"""Model loading: turns a model spec string into an ``nn.Module`` plus default example inputs.

Spec forms (every command takes the same ones):

* ``demo`` / ``demo:convnet`` / ``demo:mlp`` -- built-in models, no extra needed
* ``torchvision:resnet18`` -- any ``torchvision.models.get_model`` name, random weights
* ``timm:resnet50`` -- any ``timm.create_model`` name, random weights
* ``transformers:BertModel`` -- a transformers model class built from its default config
* ``path/to/file.py:factory`` -- a function, class or module instance in a Python file
* ``package.module:attr`` -- the same, imported from an installed package
* ``model.pt`` -- a whole module saved with ``torch.save``; ``model.pt2`` -- a ``torch.export`` program
* ``model.onnx`` -- an ONNX file, run by ONNX Runtime (verify compares it with a model; nothing to capture)
* ``OUTDIR`` -- a directory written by ``fxforge optimize`` or ``fxforge quantize`` (loads its ``model.pt``)

Models are built under a fixed seed (so two runs see the same random weights), put in eval mode, and
can be built on the ``meta`` device so that no weight memory is allocated.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import inspect as pyinspect
import io
import itertools
import json
import os
import pickle
import re
import warnings
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fxforge.artifacts import (
    AOTI_FILE,
    INPUTS_FILE,
    MODEL_FILE,
    ONNX_FILE,
    PLAN_FILE,
    PROGRAM_FILE,
    RECIPE_FILE,
    TORCHSCRIPT_FILE,
    AotiModule,
    StructuredOutputs,
    apply_recipe,
    is_aoti_package,
    is_pickle_stream,
    load_exported,
    load_program,
    load_provenance,
    program_module,
    pt2_torch_version,
    read_inputs,
    refuse_undecodable_path,
    refuse_unreadable,
    user_sources,
)
from fxforge.demo import DEMO_MODELS
from fxforge.errors import (
    NO_WORDS,
    YES_WORDS,
    FxforgeError,
    ModelSpecError,
    first_line,
    offered,
    one_line_reason,
    option,
    require,
    said,
    user_location,
    with_article,
)
from fxforge.inputs import InputSpec, parse_input_spec, physical_memory
from fxforge.references import import_file, import_module
from fxforge.runtime import fx_wraps_kept_loadable, quiet_torch_logs
from fxforge.vocabulary import PICKLED_GRAPH_BESIDE

# torchvision classification models that need more than the default 224x224 input.
_TORCHVISION_INPUT_SIZE = {"inception_v3": 299}
# File name inside an `fxforge optimize` output directory that holds the whole pickled module.


@dataclass
class LoadedModel:
    """A model ready for capture: the module, where it came from and the inputs it expects by default."""

    module: nn.Module
    spec: str
    default_inputs: list[InputSpec] = field(default_factory=list)
    # Set when the spec was a `.pt2` file: the program itself, already in the ATen dialect.
    exported_program: Any | None = None
    # Why the recorded default inputs could not be read (a damaged inputs.txt): an error only where they are needed,
    # not when the caller passes inputs of their own.
    default_inputs_error: FxforgeError | None = None
    # For a directory spec: the file of it that was loaded (model.pt2, model.pt, model.onnx...), so that a
    # verdict can say which form of the output it is about.
    file: str | None = None
    # For a directory spec whose pickled model.pt (the fx graph) was passed over for want of the opt-in: a quantize
    # output loads its int8 model.torchscript.pt then, which cannot be captured (capture's refusal names the way in)
    pickle_passed_over: str | None = None
    # Read from a written file or output directory (its default inputs are what it was built for), not built from
    # a spec; a factory file that happens to exist under the spec's whole name is no written file (QA)
    written: bool = False
    # Extra keyword inputs (e.g. attention masks) are not supported in specs; models take positional inputs.

    def __repr__(self) -> str:  # the dataclass's would print the whole module
        inputs = ", ".join(str(spec) for spec in self.default_inputs) or "none recorded"
        return f"<LoadedModel {self.spec}: {type(self.module).__name__}, inputs {inputs}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module: ``fxforge.load_model("out/r18")(x)`` is ``.module(x)`` (QA: "not callable")."""
        return self.module(*args, **kwargs)


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    # fork_rng restores the caller's RNG state afterwards: loading a model must not perturb the user's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _build_context(device: str | torch.device | None):
    if device is None:
        return contextlib.nullcontext()
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:  # torch's "Expected one of cpu, cuda, ... device type" in full
        raise ModelSpecError(
            f"unknown device {device!r}", hint="e.g. cpu, cuda, cuda:1, meta (fxforge doctor lists this machine's)"
        ) from exc


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Build on the CPU but move every parameter and buffer to ``meta`` as it is registered.

    The fallback for constructors that compute plain numbers with tensors (torchvision's RegNet calls
    ``.tolist()`` on a tensor), which the ``meta`` device context turns into data-less meta tensors.
    """
    register_parameter, register_buffer = nn.Module.register_parameter, nn.Module.register_buffer

    def parameter_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        register_parameter(module, name, param)

    def buffer_on_meta(module: nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True) -> None:
        register_buffer(module, name, tensor.to("meta") if tensor is not None else None, persistent)

    nn.Module.register_parameter = parameter_on_meta  # type: ignore[method-assign]
    nn.Module.register_buffer = buffer_on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
        nn.Module.register_buffer = register_buffer  # type: ignore[method-assign]


def load_model(
    spec: str | os.PathLike[str] | nn.Module,
    *,
    seed: int = 0,
    device: str | torch.device | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
    train: bool = False,
    trust_pickle: bool | None = None,
) -> LoadedModel:
    """Load ``spec`` (see the module docstring) with random weights drawn from ``seed``.

    ``device="meta"`` builds the model without allocating weights; ``model_kwargs`` go to the model
    constructor (torchvision/timm/file factories) or into the transformers config. Models built from a spec
    are put in eval mode (``train=True`` for training mode); a module passed in keeps its mode: fxforge never
    changes the caller's objects. ``trust_pickle``: allow unpickling a whole module from a ``.pt`` file, which
    can run arbitrary code (default: the ``FXFORGE_TRUST_PICKLE`` environment variable, else no).
    """
    if not 0 <= seed < 2**63:  # torch.manual_seed's range
        raise ModelSpecError(f"seed {seed} is out of range", hint="a seed is an integer from 0 to 2**63 - 1")
    if isinstance(spec, nn.Module):
        return LoadedModel(spec, type(spec).__name__)
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)  # a file or output directory as a Path: the same spec as its string
    if not isinstance(spec, str):
        raise ModelSpecError(f"a model is a spec string, a path or an nn.Module, not a {type(spec).__name__}")
    if spec.startswith("~"):  # a path the shell did not expand (--model=~/m.py:make, or quoted)
        spec = os.path.expanduser(spec)
    refuse_undecodable_path(spec)
    kwargs = dict(model_kwargs or {})
    try:
        with _seeded(seed), _build_context(device):
            loaded = _dispatch(spec.strip(), dict(kwargs), trust_pickle)
    except NotImplementedError as exc:
        if device is None or torch.device(device).type != "meta":
            raise _factory_error(spec, exc) from None
        # The constructor needed tensor data (e.g. `.tolist()`), which meta tensors do not have.
        with _seeded(seed), _parameters_on_meta():
            loaded = _dispatch(spec.strip(), dict(kwargs), trust_pickle)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        # the first look at such a path raised it, an internal error (QA)
        raise ModelSpecError(
            f"no file can be named {spec[:48]}...: a name in it is longer than the file system takes"
        ) from None
    # torch.export modules refuse .eval()/.train(): their mode was fixed when they were exported.
    with contextlib.suppress(NotImplementedError):
        loaded.module.train(train)
    return loaded


TRUST_PICKLE_ENV = "FXFORGE_TRUST_PICKLE"


def pickle_trusted(trust_pickle: bool | None = None) -> bool:
    """The caller's explicit choice, else the ``FXFORGE_TRUST_PICKLE`` environment variable (1/true/yes)."""
    if trust_pickle is not None:
        return trust_pickle
    value = os.environ.get(TRUST_PICKLE_ENV, "").strip().lower()
    if value not in ("", *YES_WORDS, *NO_WORDS):
        # read as "no", the refusal then said to set the variable that was set (QA: FXFORGE_TRUST_PICKLE=maybe)
        raise ModelSpecError(
            f"{TRUST_PICKLE_ENV}={os.environ[TRUST_PICKLE_ENV]!r} is neither yes nor no",
            hint=f"{TRUST_PICKLE_ENV}=1 to allow loading pickled modules, 0 (or unset) to refuse them",
        )
    return value in YES_WORDS


def _dispatch(spec: str, kwargs: dict[str, Any], trust_pickle: bool | None) -> LoadedModel:
    # the environment's FXFORGE_TRUST_PICKLE is read only for a file that may hold a pickle: a value that is neither
    # yes nor no stopped commands that never unpickle (QA)
    if not spec:
        raise ModelSpecError("empty model spec", hint=_SPEC_HINT)
    if "\x00" in spec:
        raise ModelSpecError("the model spec contains a NUL character", hint=_SPEC_HINT)
    prefix, _, name = spec.partition(":")
    if prefix == "demo":
        return _load_demo(name or "convnet", spec, kwargs)
    if prefix == "torchvision" and name:
        return _load_torchvision(name, spec, kwargs)
    if prefix == "timm" and name:
        return _load_timm(name, spec, kwargs)
    if prefix == "transformers" and name:
        return _load_transformers(name, spec, kwargs)
    path = Path(spec)
    written = _load_written(path, spec, trust_pickle)
    if written is not None:
        written.written = True
        return written
    file_part, sep, attr = spec.rpartition(":")
    if sep and file_part.endswith(".py"):
        return _load_from_file(Path(file_part), attr, spec, kwargs)
    if sep and file_part and attr:
        return _load_from_import(file_part, attr, spec, kwargs)
    if path.suffix == ".py":
        raise ModelSpecError(f"{spec!r} names a Python file but no factory", hint=f"write {spec}:NAME")
    if spec.endswith(("/", os.sep)) or spec.startswith(("./", "../", "/", "~")):  # a path, not a name
        raise ModelSpecError(f"no such file or directory: {spec}", hint="check the path")
    raise ModelSpecError(f"unknown model spec {spec!r}", hint=_SPEC_HINT)


def _load_written(path: Path, spec: str, trust_pickle: bool | None) -> LoadedModel | None:
    """A model file or output directory that fxforge or torch wrote, or None where ``spec`` names none."""
    if path.is_dir():
        return _load_output_dir(path, spec, pickle_trusted(trust_pickle))
    if path.exists() and not path.is_file():  # a FIFO or device: reading it would wait forever
        raise ModelSpecError(f"{spec} is not a regular file", hint="give a model file, a directory or a spec")
    if path.suffix == ".pt2" and path.is_file() and is_aoti_package(path):  # not a torch.export program
        return _load_aoti(path, spec, pickle_trusted(trust_pickle))
    if path.suffix == ".pt2":
        return _load_pt2(path, spec, pickle_trusted(trust_pickle))
    if path.suffix in {".pt", ".pth", ".bin", ".pkl"} and path.is_file() and _is_torchscript_archive(path):
        return _load_exported_file(path, "torchscript", spec)  # not a pickle: no opt-in, nor its variable (QA)
    if path.suffix in {".pt", ".pth", ".bin", ".pkl"}:
        return _load_pickled_module(path, spec, pickle_trusted(trust_pickle))
    if path.suffix == ".onnx":
        return _load_onnx_file(path, spec)
    return None


_SPEC_HINT = (
    "use demo, torchvision:NAME, timm:NAME, transformers:CLASS, path/to/file.py:factory, "
    "package.module:attr, model.pt, model.pt2, model.onnx or an fxforge output directory"
)


def _load_demo(name: str, spec: str, kwargs: dict[str, Any]) -> LoadedModel:
    if name not in DEMO_MODELS:
        raise ModelSpecError(f"unknown demo model {name!r}", hint=f"one of {', '.join(DEMO_MODELS)}")
    cls, inputs = DEMO_MODELS[name]
    model = _construct(cls, kwargs, spec)
    _randomise_batchnorms(model)
    return LoadedModel(model, spec, [parse_input_spec(s) for s in inputs])


def _keyword_names(function: Any) -> tuple[list[str], bool]:
    """(the keyword names ``function`` takes, whether it takes ``**kwargs`` too); ([], True) where it has no
    signature to read."""
    try:
        parameters = pyinspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return [], True
    named = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]
    return named, any(p.kind == p.VAR_KEYWORD for p in parameters)


def _keywords_hint(factory: Any, exc: TypeError) -> str | None:
    """The names the constructor takes, nearest first (QA: `--model-arg bogus=1` had no hint). A factory passing
    ``**kwargs`` on (torchvision's ``resnet18`` to ``ResNet``) adds the class the error names, found beside it."""
    names, passes_on = _keyword_names(factory)
    called = re.match(r"(\w+)\.__init__\(\)", str(exc))
    if passes_on and called:
        beside = getattr(pyinspect.unwrap(factory), "__globals__", {})  # torchvision's builders are decorated
        cls = beside.get(called.group(1), factory if isinstance(factory, type) else None)
        if isinstance(cls, type):
            names += [name for name in _keyword_names(cls.__init__)[0] if name not in names]
    if not names:
        return None
    rejected = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
    near = difflib.get_close_matches(rejected.group(1), names, n=1) if rejected else []
    return (f"did you mean {near[0]}? " if near else "") + f"it takes {', '.join(names)}"


def _construct(
    factory: Callable[..., Any], kwargs: dict[str, Any], spec: str, *, described_by: Callable[..., Any] | None = None
) -> Any:
    """``factory(**kwargs)``, its failures in one line naming the user's code; ``described_by``: the function whose
    parameters a rejected keyword is told of, where ``factory`` is a wrapper taking ``**kw``."""
    try:
        return factory(**kwargs)
    except (FxforgeError, NotImplementedError):  # NotImplementedError: load_model retries a meta build its own way
        raise
    except TypeError as exc:
        if _raised_by_call(exc):
            if kwargs:
                given = option("--model-arg", python="model_kwargs")
                raise ModelSpecError(
                    f"{spec}: constructor rejected {given}: {exc}", hint=_keywords_hint(described_by or factory, exc)
                ) from None
            missing = re.findall(r"'(\w+)'", str(exc).partition("missing")[2])
            name = missing[0] if missing else "NAME"
            hint = said(f"pass --model-arg {name}=VALUE", f"pass model_kwargs={{{name!r}: VALUE}}")
            raise ModelSpecError(f"{spec}: cannot be called without arguments: {exc}", hint=hint) from None
        raise _factory_error(spec, exc) from None
    except Exception as exc:  # the user's factory (or the library's constructor) failed: name it and its line
        raise _factory_error(spec, exc) from None
    except SystemExit as exc:
        raise ModelSpecError(f"{spec}: the factory called sys.exit({exc.code!r})") from None


def _raised_by_call(exc: TypeError) -> bool:
    """Whether a TypeError says a call got arguments it does not take (ours to the factory, or the factory's own
    pass-through to a constructor) rather than being a bug inside the factory."""
    text = str(exc)
    return any(
        phrase in text
        for phrase in ("unexpected keyword argument", "required positional argument", "positional argument but")
    )


def _factory_error(spec: str, exc: BaseException) -> ModelSpecError:
    where = user_location(exc)
    at = f" at {where}" if where else ""
    return ModelSpecError(f"{spec}: building the model raised {type(exc).__name__}: {first_line(exc)}{at}")


def torchvision_classification_models() -> list[str]:
    """Names of every torchvision classification model (``torchvision.models`` top level)."""
    torchvision = require("torchvision", "vision", "torchvision models")
    return sorted(torchvision.models.list_models(module=torchvision.models))


def _did_you_mean(name: str, known: Sequence[str], cutoff: float = 0.75) -> str:
    """``"did you mean resnet18? "`` for a misspelt name (``resnet81``), else ``""``."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    return f"did you mean {close[0]}? " if close else ""


def _transformers_class_hint(class_name: str, names: Sequence[str]) -> str:
    """A hint for a name that is no transformers model class: a close model class by name (``...Model``,
    ``...For...``; matched without case), never the name refused (QA: "did you mean AutoModel?" for AutoModel) nor an
    Auto* factory, which chooses a class from a checkpoint fxforge does not download."""
    if class_name.startswith("Auto"):
        return f"{class_name} is a factory that needs a checkpoint: name a model class, e.g. transformers:BertModel"
    models = {
        n.lower(): n for n in names if (n.endswith("Model") or "For" in n) and not n.startswith(("Auto", "TF", "Flax"))
    }
    if models.get(class_name.lower()) == class_name:  # the very name refused (a model class transformers lacks)
        del models[class_name.lower()]
    close = difflib.get_close_matches(class_name.lower(), list(models), n=1, cutoff=0.75)
    return f"did you mean {models[close[0]]}?" if close else "e.g. transformers:BertModel"


def _load_torchvision(name: str, spec: str, kwargs: dict[str, Any]) -> LoadedModel:
    torchvision = require("torchvision", "vision", "torchvision models")
    if name not in torchvision.models.list_models():
        raise ModelSpecError(
            f"torchvision has no model named {name!r}",
            hint=_did_you_mean(name, torchvision.models.list_models())
            + "list them with: python -c 'import torchvision; print(torchvision.models.list_models())'",
        )
    kwargs.setdefault("weights", None)  # never download weights
    if "weights_backbone" in pyinspect.signature(torchvision.models.get_model_builder(name)).parameters:
        kwargs.setdefault("weights_backbone", None)  # detection/segmentation models default to ImageNet ones
    if name in ("inception_v3", "googlenet"):
        # Their defaults add auxiliary classifiers (extra outputs, training only) and weight transforms.
        kwargs.setdefault("aux_logits", False)
        kwargs.setdefault("init_weights", True)
    builder = torchvision.models.get_model_builder(name)
    model = _construct(lambda **kw: torchvision.models.get_model(name, **kw), kwargs, spec, described_by=builder)
    _redraw_zero_layers(model)
    _randomise_batchnorms(model)
    classification = set(torchvision.models.list_models(module=torchvision.models))
    inputs = []
    if name in classification:
        size = _TORCHVISION_INPUT_SIZE.get(name, 224)
        inputs = [InputSpec((1, 3, size, size))]
    return LoadedModel(model, spec, inputs)


def _redraw_zero_layers(model: nn.Module) -> None:
    """Give a ``Linear`` or convolution whose weight is all zeros PyTorch's default random init instead.

    Libraries zero-initialise some layers for training from scratch (torchvision's ViTs their classifier head);
    with random weights and no training the model then outputs zeros for every input, and no check of a rewrite
    could fail on it. fxforge's random weights are for checking, so those layers are drawn like any other.
    """
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if (
            isinstance(module, (nn.Linear, nn.modules.conv._ConvNd))
            and isinstance(weight, torch.Tensor)
            and weight.device.type != "meta"
            and weight.numel()
            and not weight.any()
        ):
            module.reset_parameters()


def _randomise_batchnorms(model: nn.Module) -> None:
    """Give every BatchNorm statistics and an affine transform that are not the identity.

    Built without weights, a BatchNorm has mean 0, variance 1, scale 1 and shift 0: it passes its input through
    (up to eps), so a rewrite that drops it, or folds its mean or shift wrongly, changes nothing and no check
    could fail. Drawn around the identity (mean and shift N(0, 0.1), variance and scale U(0.5, 1.5)), every
    BatchNorm term matters while activations keep about the scale they had. From torch's RNG (``--seed``).
    """
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, nn.modules.batchnorm._BatchNorm):
                continue
            tensors = [module.running_mean, module.running_var, module.weight, module.bias]
            if any(t is not None and t.device.type == "meta" for t in tensors):
                continue  # no values to draw (--device meta)
            if module.running_mean is not None and module.running_var is not None:
                module.running_mean.normal_(0.0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
            _draw_affine(module)


def _draw_affine(norm: nn.modules.batchnorm._BatchNorm) -> None:
    """A BatchNorm's scale from U(0.5, 1.5) and shift from N(0, 0.1), from torch's RNG (under no_grad)."""
    if norm.weight is not None:
        norm.weight.uniform_(0.5, 1.5)
    if norm.bias is not None:
        norm.bias.normal_(0.0, 0.1)


def _measure_batchnorms(model: nn.Module, example: InputSpec) -> bool:
    """Give every BatchNorm the running statistics of its input on two random images of ``example``'s shape and a
    drawn scale (U(0.5, 1.5)) and shift (N(0, 0.1)); False, changing nothing, where the model has no BatchNorm,
    holds no values (meta) or does not run on such an input alone."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if not norms or any(p.device.type == "meta" for p in model.parameters()):
        return False
    modes = {m: m.training for m in model.modules()}
    momenta = {bn: bn.momentum for bn in norms}
    saved = {bn: (bn.running_mean.clone(), bn.running_var.clone()) for bn in norms}
    images = torch.randn(2, *example.shape[1:])  # two: a BatchNorm in training mode needs more than one value
    affine = {bn: (bn.weight.clone(), bn.bias.clone()) for bn in norms if bn.affine}
    # the scale and shift drawn before measuring, so that each BatchNorm's statistics are those of the input it gets:
    # drawn after, a shift of 0.1 on a signal of 1e-6 (transformers' 0.02-wide initialisation) reached the next
    # BatchNorm, measured on the signal alone, and each one multiplied it by 300 (MobileViT: 5e20, then NaN)
    with torch.no_grad():
        for bn in norms:
            _draw_affine(bn)
    try:
        model.eval()
        for bn in norms:
            bn.reset_running_stats()
            bn.momentum = None  # a plain average over the calls: one call gives the batch's statistics
            bn.train()
        with torch.no_grad():
            model(images)
        measured = all(bool(torch.isfinite(bn.running_var).all()) for bn in norms)
    except Exception:  # a model that needs more than its main input: drawn statistics then
        measured = False
    finally:
        for bn, momentum in momenta.items():
            bn.momentum = momentum
        for module, training in modes.items():
            module.training = training
    if not measured:
        with torch.no_grad():
            for bn, (mean, var) in saved.items():
                bn.running_mean.copy_(mean)
                bn.running_var.copy_(var)
            for bn, (weight, bias) in affine.items():
                bn.weight.copy_(weight)
                bn.bias.copy_(bias)
        return False
    return True


def _load_timm(name: str, spec: str, kwargs: dict[str, Any]) -> LoadedModel:
    timm = require("timm", "timm", "timm models")
    if not timm.is_model(name):
        raise ModelSpecError(
            f"timm has no model named {name!r}",
            hint=_did_you_mean(name, timm.list_models()) + "list them with: timm.list_models()",
        )
    entrypoint = timm.models.model_entrypoint(name)
    model = _construct(
        lambda **kw: timm.create_model(name, pretrained=False, **kw), kwargs, spec, described_by=entrypoint
    )
    _redraw_zero_layers(model)
    _randomise_batchnorms(model)
    cfg = getattr(model, "pretrained_cfg", None) or {}
    channels, height, width = cfg.get("input_size", (3, 224, 224))
    return LoadedModel(model, spec, [InputSpec((1, channels, height, width))])


def _load_transformers(class_name: str, spec: str, kwargs: dict[str, Any]) -> LoadedModel:
    transformers = require("transformers", "transformers", "transformers models")
    cls = getattr(transformers, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ModelSpecError(
            f"transformers has no model class named {class_name!r}",
            hint=_transformers_class_hint(class_name, dir(transformers)),
        )
    config_class = getattr(cls, "config_class", None)
    if config_class is None:
        raise ModelSpecError(f"transformers:{class_name} has no default config class")
    _refuse_unknown_config_keys(config_class, spec, kwargs)
    try:
        config = config_class(**kwargs)
    except Exception as exc:  # TypeError, ValueError, huggingface_hub's StrictDataclassFieldValidationError...
        reason = " ".join(str(exc).split())  # its detail ("expected int, got str") is on a second line
        raise ModelSpecError(f"{spec}: bad config value: {reason}") from None
    _widen_initialisation(config, kwargs)
    # A graph of one forward pass has no use for a KV cache, and the DynamicCache object transformers returns
    # with use_cache=True is not a pytree torch.export can flatten (Llama fails to capture with it). Off unless
    # the user asks (--model-arg use_cache=true).
    if "use_cache" not in kwargs and hasattr(config, "use_cache"):
        config.use_cache = False
    # eager attention: the SDPA path has data-dependent branches that no capture method can keep.
    with contextlib.suppress(AttributeError, ValueError):
        config._attn_implementation = "eager"
    _refuse_weights_larger_than_memory(cls, config, spec)
    try:
        model = cls(config)
    except NotImplementedError:  # load_model retries a meta build its own way
        raise
    except Exception as exc:  # a config the model rejects (hidden size 65 for 12 heads): was "internal error"
        error = _factory_error(spec, exc)
        error.hint = f"check the {option('--model-arg', python='model_kwargs')} values" if kwargs else None
        raise error from None
    _redraw_zero_layers(model)
    inputs: list[InputSpec] = []
    main_input = getattr(cls, "main_input_name", "input_ids")
    if main_input == "input_ids":
        # ids over the whole vocabulary: from [0, 10), every check of a transformers model read 10 rows of its
        # embedding, and a wrong row elsewhere was verified as equal (QA)
        vocabulary = getattr(config, "vocab_size", None)
        high = vocabulary if isinstance(vocabulary, int) and vocabulary > 0 else None
        inputs = [InputSpec((1, 16), torch.int64, high=high)]
        inputs += _decoder_inputs(cls, config, inputs[0])
    elif main_input == "pixel_values":
        size = getattr(config, "image_size", 224)
        size = size if isinstance(size, int) else size[0]
        inputs = [InputSpec((1, getattr(config, "num_channels", 3), size, size))]
    # transformers' vision models (MobileNetV2, ResNet, RegNet...) build every BatchNorm as the identity, and a fold
    # that dropped its mean still verified (QA). Their 0.02-wide initialisation shrinks a MobileNetV2's signal to
    # 1e-24, under which drawn statistics alone made every output the same: the statistics are measured on random
    # inputs (as training would), then the scale and shift drawn
    if not (inputs and _measure_batchnorms(model, inputs[0])):
        _randomise_batchnorms(model)
    return LoadedModel(model, spec, inputs)


# The config fields transformers draws its weights' standard deviation from (BERT, GPT-2, ViT, Llama...; BART's and
# Whisper's name). T5 and CLIP scale theirs by 1/sqrt(width) already (``initializer_factor``).
_INIT_STD_FIELDS = ("initializer_range", "init_std")


def _widen_initialisation(config: Any, kwargs: Mapping[str, Any]) -> None:
    """Draw the weights with a standard deviation of at least 1/sqrt(hidden size), unless the user set it.

    transformers' 0.02 is for training from scratch; untrained, on a narrow config it makes every attention score
    nearly zero, the softmax uniform, and a rewrite that scrambled the query or key projections was verified (QA: BERT
    at hidden size 32, its query heads reordered, "verified" at a relative error of 1e-4). At 1/sqrt(width) each
    projection keeps its input's scale, so the scores spread about one unit and attention depends on them, as in a
    trained model. fxforge's random weights are for checking (as its BatchNorm statistics are drawn, not the
    identity)."""
    width = getattr(config, "hidden_size", None)
    if not isinstance(width, int) or width <= 0:
        return
    for name in _INIT_STD_FIELDS:
        value = getattr(config, name, None)
        if name not in kwargs and isinstance(value, float):
            setattr(config, name, max(value, width**-0.5))


def _decoder_inputs(cls: type, config: Any, ids: InputSpec) -> list[InputSpec]:
    """An encoder-decoder's (T5, BART, Marian...) inputs after ``input_ids``, up to ``decoder_input_ids``: a 0/1
    attention mask, then decoder ids like the encoder's. Given only ``input_ids``, every such model refused its
    default inputs ("You must specify exactly one of input_ids or inputs_embeds", from its decoder: QA), and inputs
    are positional, so the decoder's come after the mask."""
    if not getattr(config, "is_encoder_decoder", False):
        return []
    try:
        names = list(pyinspect.signature(cls.forward).parameters)[1:4]  # past self
    except (TypeError, ValueError):
        return []
    if names != ["input_ids", "attention_mask", "decoder_input_ids"]:
        return []
    return [InputSpec(ids.shape, torch.int64, high=2), InputSpec(ids.shape, torch.int64, high=ids.high)]


def _refuse_weights_larger_than_memory(cls: type, config: Any, spec: str) -> None:
    """Refuse a model whose weights alone would not fit in this machine's memory, measured by building it on the
    ``meta`` device first (no weights allocated): a default Llama or Mistral config (7B parameters, 27 GiB in
    fp32) was killed by the kernel's out-of-memory killer, exit 137 and no word (QA)."""
    if torch.get_default_device().type != "cpu":  # meta: no weights; an accelerator: not the CPU's memory
        return
    physical = physical_memory()
    if physical is None:  # not POSIX: the real build decides
        return
    try:
        with torch.device("meta"):
            probe = cls(config)
    except Exception:  # a model that cannot be built on meta: the real build decides
        return
    needed = sum(t.numel() * t.element_size() for t in itertools.chain(probe.parameters(), probe.buffers()))
    if needed > 0.9 * physical:  # the build also needs room for the process and its initialisation
        count = sum(p.numel() for p in probe.parameters())
        raise ModelSpecError(
            f"{spec} has {count:,} parameters, {needed / 2**30:,.2f} GiB of weights: more than 90% of this "
            f"machine's {physical / 2**30:,.2f} GiB of memory, which the build and a run need room beyond",
            hint=said(
                # debug and verify take no --device: fxforge inspect does
                (
                    "inspect it without weights with --device meta"
                    if offered("--device", "--device")
                    else "fxforge inspect --device meta inspects it without weights"
                )
                + ", or make it smaller with --model-arg (num_hidden_layers=2, hidden_size=...)",
                "pass device='meta' to inspect it without weights, or model_kwargs to make it smaller "
                "(num_hidden_layers=2, hidden_size=...)",
            ),
        )


def _refuse_unknown_config_keys(config_class: type, spec: str, kwargs: dict[str, Any]) -> None:
    """A transformers config takes any keyword and keeps it as an attribute nothing reads: a misspelt
    ``--model-arg num_hidden_layer=2`` built the full 12-layer model, silently. Known keys: the default config's
    fields, its aliases (GPT-2's ``num_hidden_layers`` for ``n_layer``) and its constructor's parameters."""
    known = set(config_class().to_dict()) | set(getattr(config_class, "attribute_map", {}))
    with contextlib.suppress(TypeError, ValueError):
        known |= set(pyinspect.signature(config_class.__init__).parameters) - {"self", "kwargs"}
    for key in kwargs:
        if key not in known:
            guess = _did_you_mean(key, sorted(known), cutoff=0.6).strip()  # difflib's own cutoff, as it always had
            hint = guess or f"see the fields of transformers.{config_class.__name__}"
            raise ModelSpecError(f"{spec}: {config_class.__name__} has no field {key!r}", hint=hint)


def _load_output_dir(path: Path, spec: str, trusted: bool) -> LoadedModel:
    """An fxforge output directory: the model in the file :func:`_model_file_of` chooses, its provenance, recipe
    and recorded inputs."""
    chosen = _model_file_of(path, trusted)
    if chosen is None:
        looked_for = ", ".join((MODEL_FILE, PROGRAM_FILE, AOTI_FILE, TORCHSCRIPT_FILE, ONNX_FILE))
        raise ModelSpecError(f"directory {spec!r} holds no model ({looked_for})", hint="is it an fxforge output?")
    if chosen == AOTI_FILE:  # compiled code (optimize --auto chose Inductor): runs as timed
        loaded = _load_aoti(path / AOTI_FILE, spec, trusted)
    elif chosen == MODEL_FILE:
        loaded = _load_pickled_module(path / MODEL_FILE, spec, trusted)
    elif chosen == PROGRAM_FILE:
        loaded = _load_pt2(path / PROGRAM_FILE, str(path / PROGRAM_FILE), trusted)  # errors name the file
        loaded.spec = spec
        structure = _split_output_structure(path)
        if structure is not None:  # a split directory's model.pt2 returns the tensors flat: the model's nesting back
            with contextlib.suppress(Exception):  # a hand-edited record: the tensors stay flat, as the file has them
                loaded.module = StructuredOutputs(loaded.module, structure)
    else:
        loaded = _load_exported_file(path / chosen, "torchscript" if chosen == TORCHSCRIPT_FILE else "onnx", spec)
    loaded.file = chosen
    if chosen != MODEL_FILE and (path / MODEL_FILE).exists() and not trusted:
        loaded.pickle_passed_over = MODEL_FILE
    if isinstance(loaded.module, torch.fx.GraphModule):
        load_provenance(loaded.module, path)
    recipe_file = path / RECIPE_FILE
    if recipe_file.exists():  # how optimize --auto measured it: run it that way (autocast, torch.compile)
        try:
            recipe = json.loads(recipe_file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelSpecError(f"{recipe_file} is corrupt: {first_line(exc)}") from None
        loaded.module = apply_recipe(loaded.module, recipe)
        loaded.file += f" + {RECIPE_FILE}"
    try:
        specs = read_inputs(path)
    except (FxforgeError, OSError, UnicodeDecodeError) as exc:
        hint = said("pass --input instead", "pass inputs instead")
        loaded.default_inputs_error = ModelSpecError(f"{path / INPUTS_FILE} is corrupt: {first_line(exc)}", hint=hint)
        # not the example model.pt2 records instead: the directory's own file says which shapes (and token-id
        # ranges) to run, and a damaged one is the user's to know about (QA: it was passed over in silence)
        loaded.default_inputs = []
        specs = None
    if specs is not None:
        loaded.default_inputs = specs
    return loaded


def _split_output_structure(path: Path) -> Any | None:
    """The output structure a split directory's plan.json records for its flat model.pt2 (None for another
    directory or a plan without one)."""
    try:
        structure = json.loads((path / PLAN_FILE).read_text()).get("output_structure")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    # "tensor": a model returning one tensor, whose model.pt2 returns it in a 1-tuple (verify of a split of resnet18
    # read MISMATCH, "expected a tensor, got tuple", and load_model gave the tuple)
    return structure if isinstance(structure, dict) or structure == "tensor" else None


def _model_file_of(path: Path, trusted: bool) -> str | None:
    """Which file of an output directory is the model: the AOTInductor package (runs as timed; trusted, as it runs
    native code when loaded, or alone, to be refused by name), else the pickle when trusted (the torch-dialect
    graph, with provenance for bisection) or alone, else the pickle-free ``model.pt2``, else ``model.torchscript.pt``
    (a quantize output's int8 model beside its pickle) or what ``optimize --auto`` writes when it picks TorchScript
    or ONNX Runtime (runnable, though not capturable as an fx graph). None where there is none."""
    others = [name for name in (MODEL_FILE, PROGRAM_FILE, TORCHSCRIPT_FILE, ONNX_FILE) if (path / name).exists()]
    if (path / AOTI_FILE).exists() and (trusted or not others):  # untrusted and alone: refused when loaded
        return AOTI_FILE
    pickle_free = (PROGRAM_FILE, TORCHSCRIPT_FILE)  # a quantize output's int8 TorchScript beside its model.pt
    if (path / MODEL_FILE).exists() and (trusted or not any((path / name).exists() for name in pickle_free)):
        return MODEL_FILE
    return next((name for name in (PROGRAM_FILE, TORCHSCRIPT_FILE, ONNX_FILE) if (path / name).exists()), None)


def _load_aoti(path: Path, spec: str, trusted: bool) -> LoadedModel:
    refuse_unreadable(path, error=ModelSpecError)
    if not trusted:
        # loading a package dlopens the shared library inside it: its code runs at once (QA: a swapped .so ran its
        # constructor on every command that was given the file)
        raise ModelSpecError(
            f"{spec} is an AOTInductor package: loading it runs the native code compiled into it",
            hint=f"if you trust this file, pass {option('--trust-pickle', True)} (or set {TRUST_PICKLE_ENV}=1), "
            "which allows files that run code when loaded"
            # a program beside it is named only where there is one (QA: --auto writes the package alone)
            + (
                "; the model.pt2 program beside it loads without it"
                if (path.parent / "model.pt2").is_file() and path.name != "model.pt2"
                else ""
            ),
        )
    try:
        return LoadedModel(AotiModule(path), spec)
    except Exception as exc:  # torch raises its own error types for damaged packages and missing compilers
        raise ModelSpecError(f"cannot load AOTInductor package {path}: {first_line(exc)}") from None


def _load_exported_file(path: Path, form: str, spec: str) -> LoadedModel:
    if form == "onnx":
        require("onnxruntime", "onnx", f"loading {spec}")
    refuse_unreadable(path, error=ModelSpecError)
    try:
        return LoadedModel(load_exported(path, form), spec)
    except FxforgeError:
        raise
    except Exception as exc:  # the runtimes raise their own error types for damaged files
        raise ModelSpecError(f"cannot read {path}: {first_line(exc)}", hint="is the file corrupt?") from None


def _load_onnx_file(path: Path, spec: str) -> LoadedModel:
    if not path.exists():
        raise ModelSpecError(f"file not found: {spec}")
    loaded = _load_exported_file(path, "onnx", spec)
    loaded.default_inputs = loaded.module.input_specs()
    return loaded


def _load_pt2(path: Path, spec: str, trusted: bool) -> LoadedModel:
    if not path.exists():
        raise ModelSpecError(f"file not found: {spec}")
    refuse_unreadable(path, error=ModelSpecError)
    if is_aoti_package(path):  # compiled code under a program's name (an output directory's model.pt2)
        return _load_aoti(path, spec, trusted)
    try:
        # torch logs the whole failure (a traceback) before raising it: fxforge reports it in one line
        with quiet_torch_logs(), contextlib.redirect_stderr(io.StringIO()), _pickled_payloads_refused(trusted):
            program = load_program(path)
    except PickleRefused:
        raise ModelSpecError(
            f"{spec} holds pickled Python objects, and unpickling can run arbitrary code",
            hint=f"if you trust this file, pass {option('--trust-pickle', True)} (or set {TRUST_PICKLE_ENV}=1)",
        ) from None
    except FxforgeError:
        raise
    except Exception as exc:  # torch raises a wide variety of errors for damaged archives
        # a program written by another torch reads as damaged ("check the warnings above", which were silenced):
        # the version it records is the likelier cause, and is said (QA)
        written_by = pt2_torch_version(path)
        if written_by and written_by.split("+")[0] != torch.__version__.split("+")[0]:
            reason = first_line(exc)  # torch's own points at the log lines it printed, which were silenced
            raise ModelSpecError(
                f"cannot read exported program {spec}: it was written by torch {written_by}, and this is torch "
                f"{torch.__version__}" + (f" ({reason})" if "warnings above" not in reason else ""),
                hint=f"load it with torch {written_by.split('+')[0]}, or export it again with this torch",
            ) from None
        reason = first_line(exc).replace(" Please check the warnings above for possible errors.", "")
        raise ModelSpecError(f"cannot read exported program {spec}: {reason}", hint="is the file corrupt?") from None
    recorded = program.example_inputs
    if recorded is not None and not (
        isinstance(recorded, tuple)
        and len(recorded) == 2
        and isinstance(recorded[0], tuple)
        and isinstance(recorded[1], dict)
    ):  # torch.export records (args, kwargs); a damaged or crafted archive may hold anything (QA: KeyError: 0)
        raise ModelSpecError(
            f"cannot read exported program {spec}: its recorded example inputs are not (args, kwargs)",
            hint="is the file corrupt?",
        )
    inputs = [InputSpec.of(value) for value in (recorded[0] if recorded else ()) if isinstance(value, torch.Tensor)]
    module = program_module(program)
    if path.name == PROGRAM_FILE and (path.parent / MODEL_FILE).is_file() and isinstance(module, torch.fx.GraphModule):
        # an optimize output's re-export: verify's bisection can point at the torch-dialect graph pickled beside it,
        # which a plain exported program does not have (QA: its MISMATCH sent the user to a model.pt that was not there)
        module.meta[PICKLED_GRAPH_BESIDE] = MODEL_FILE
    return LoadedModel(module, spec, inputs, exported_program=program)


class PickleRefused(Exception):
    """A loader tried to unpickle arbitrary objects while pickles are not trusted."""


@contextlib.contextmanager
def _pickled_payloads_refused(trusted: bool) -> Iterator[None]:
    """Make ``torch.export.load`` refuse the payloads it would unpickle with ``weights_only=False``.

    A ``.pt2`` archive stores weights as raw bytes, but the archive itself can flag a payload as pickled, and
    torch 2.14 then loads it with ``torch.load(weights_only=False)`` or ``pickle.loads``: a crafted file would run
    code. While the block runs, ``torch.load`` is held to ``weights_only=True`` and ``pickle.loads`` refuses.
    """
    if trusted:
        yield
        return
    import pickle

    original_load, original_loads = torch.load, pickle.loads

    def weights_only_load(*args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        try:
            return original_load(*args, **kwargs)
        except pickle.UnpicklingError as exc:
            raise PickleRefused(str(exc)) from None

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise PickleRefused("pickle.loads")

    torch.load, pickle.loads = weights_only_load, refuse  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.load, pickle.loads = original_load, original_loads  # type: ignore[assignment]


def _is_torchscript_archive(path: Path) -> bool:
    """TorchScript archives (torch.jit.save) hold code run by the TorchScript interpreter, not pickled Python."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/constants.pkl") or "/code/" in name for name in archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def _load_pickled_module(path: Path, spec: str, trusted: bool) -> LoadedModel:
    if not path.exists():
        raise ModelSpecError(f"file not found: {path}")
    refuse_unreadable(path, error=ModelSpecError)
    if _is_torchscript_archive(path):
        return _load_exported_file(path, "torchscript", spec)
    if not zipfile.is_zipfile(path) and not is_pickle_stream(path):
        # torch.save writes a zip archive (a pickle stream before torch 1.6); anything else fails deep in the
        # unpickler with a message like "174812789" (a KeyError of a memo index)
        raise ModelSpecError(
            f"cannot read {path}: not a file torch.save wrote (neither a zip archive nor a pickle stream)",
            hint="is the file corrupt or truncated?",
        )
    try:
        with warnings.catch_warnings():
            # int8 models (fxforge quantize): torch's own rebuild of quantized tensors uses APIs it deprecates
            warnings.filterwarnings("ignore", message=r"TypedStorage is deprecated")
            warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel")
            # a bare pickle stream of protocol 4: the refusal below says what the file is, in one line
            warnings.filterwarnings("ignore", message=r"Detected pickle protocol")
            try:
                obj = torch.load(str(path), map_location="cpu", weights_only=True)
            except pickle.UnpicklingError as exc:
                # "Unsupported global": the file names Python classes to rebuild, i.e. it holds pickled objects
                # (a whole module); so does a bare pickle stream the safe loader cannot read. Anything else is a
                # damaged file, reported as such below.
                if "unsupported global" not in str(exc).lower() and not is_pickle_stream(path):
                    raise
                if not trusted:
                    raise ModelSpecError(
                        f"{spec} holds a pickled module: unpickling it can run arbitrary code",
                        hint=f"if you trust this file, pass {option('--trust-pickle', True)} (or set "
                        f"{TRUST_PICKLE_ENV}=1); to share models, prefer .pt2, TorchScript or ONNX files",
                    ) from None
                with user_sources(path.parent), fx_wraps_kept_loadable():  # its file: copied beside it when written
                    obj = torch.load(str(path), map_location="cpu", weights_only=False)
    except FxforgeError:
        raise
    except (AttributeError, ImportError) as exc:
        missing = re.search(r"No module named '(fxforge_user_\w+)'", str(exc))
        hint = "the code of the pickled module's classes must be importable (check PYTHONPATH)"
        if missing:  # written before fxforge kept a copy of the model's file: no PYTHONPATH supplies the name
            file_name = missing.group(1).removeprefix("fxforge_user_") + ".py"
            hint = f"its classes are in {file_name}: write the model again with this fxforge, which copies it"
        raise ModelSpecError(f"cannot read {path}: {first_line(exc)}", hint=hint) from None
    except Exception as exc:  # damaged files raise UnpicklingError, ValueError, UnicodeDecodeError, KeyError...
        raise ModelSpecError(
            f"cannot read {path}: {one_line_reason(exc)}", hint="is the file corrupt or truncated?"
        ) from None
    if isinstance(obj, nn.Module):
        return LoadedModel(obj, spec)
    if isinstance(obj, Mapping):
        raise ModelSpecError(
            f"{spec} holds a state_dict, not a module",
            hint="point fxforge at the code that builds the model (file.py:factory) instead",
        )
    raise ModelSpecError(f"{spec} holds a {type(obj).__name__}, not an nn.Module")


def _load_from_file(file: Path, attr: str, spec: str, kwargs: dict[str, Any]) -> LoadedModel:
    return _from_attribute(import_file(file, error=ModelSpecError), attr, spec, kwargs)


def _load_from_import(module_path: str, attr: str, spec: str, kwargs: dict[str, Any]) -> LoadedModel:
    try:
        module = import_module(module_path)
    except ImportError as exc:
        raise ModelSpecError(f"cannot import {module_path!r}: {exc}", hint=_SPEC_HINT) from None
    except Exception as exc:
        raise _factory_error(spec, exc) from None
    except SystemExit as exc:
        raise ModelSpecError(f"importing {module_path!r} called sys.exit({exc.code!r})") from None
    return _from_attribute(module, attr, spec, kwargs)


def _from_attribute(module: Any, attr: str, spec: str, kwargs: dict[str, Any]) -> LoadedModel:
    target = module
    parts = attr.split(".")
    for index, part in enumerate(parts):
        if not hasattr(target, part):
            # a user file's module name (fxforge_user_<stem>) is fxforge's, not the user's: name the file
            where = getattr(module, "__name__", module)
            if str(where).startswith("fxforge_user_"):
                where = Path(module.__file__).name
            raise ModelSpecError(f"{spec}: {where} has no attribute {attr!r}")
        if index and _is_method(target, part):  # index 0: a module-level function, a factory
            _refuse_method(spec, attr, parts[:index], part, instance=isinstance(target, nn.Module))
        target = getattr(target, part)
    if isinstance(target, nn.Module):
        model = target
    elif callable(target):
        model = _construct(target, kwargs, spec)
    else:
        raise ModelSpecError(f"{spec}: {attr} is {with_article(type(target).__name__)}, not a model, class or factory")
    if not isinstance(model, nn.Module):
        raise ModelSpecError(f"{spec}: {attr}() returned {with_article(type(model).__name__)}, not an nn.Module")
    return LoadedModel(model, spec, _user_example_inputs(module))


def _is_method(owner: Any, name: str) -> bool:
    """Whether ``owner.name`` is a method that needs (or is bound to) an instance: ``Net.forward`` or
    ``Net.__init__`` on a class, ``model.forward`` on a module instance; not a staticmethod or classmethod
    (``Net.from_config``: a factory) nor a nested class."""
    if isinstance(owner, nn.Module):
        return pyinspect.ismethod(getattr(owner, name))
    if not pyinspect.isclass(owner):
        return False
    try:
        raw = pyinspect.getattr_static(owner, name)
    except AttributeError:  # provided by a metaclass's __getattr__: not a method defined on the class
        return False
    if isinstance(raw, (staticmethod, classmethod)):
        return False
    return pyinspect.isfunction(raw) or pyinspect.ismethoddescriptor(raw)


def _refuse_method(spec: str, attr: str, owner: list[str], method: str, instance: bool) -> None:
    """A spec naming a method (``file.py:Net.forward``) was called as a factory without its instance, and the error
    hinted ``--model-arg self=VALUE`` (QA): the spec names the class (or the module instance) instead."""
    name = ".".join(owner)
    suggested = f"{spec[: len(spec) - len(attr)]}{name}"
    kind = "module" if instance else "class"
    builds = "captures its forward" if instance else "builds it and captures its forward"
    raise ModelSpecError(
        f"{spec}: {method} is a method of the {kind} {name}: a model spec names a model, class or factory, "
        "not a method",
        hint=f"name the {kind}: {suggested} (fxforge {builds})",
    )


def _user_example_inputs(module: Any) -> list[InputSpec]:
    """A user file may define ``example_inputs`` (specs, tensors, or a function returning either)."""
    value = getattr(module, "example_inputs", None)
    if value is None:
        return []
    if callable(value) and not pyinspect.isclass(value):
        try:
            with torch.random.fork_rng(devices=[]):  # its draws are not the weights' stream
                value = value()
        except Exception as exc:  # an internal error (exit 4) before, with no line of the user's
            where = user_location(exc)
            raise ModelSpecError(
                f"example_inputs() raised {type(exc).__name__}: {first_line(exc)}" + (f" at {where}" if where else "")
            ) from None
    if isinstance(value, (str, torch.Tensor)):
        value = [value]
    if isinstance(value, dict):  # its keys were read as specs ("cannot parse input spec 'x'")
        raise ModelSpecError(
            "example_inputs is a dict: fxforge passes example inputs to forward by position",
            hint="make it a list of tensors or shapes such as '1x3x224x224', in forward's order",
        )
    if not isinstance(value, (list, tuple)):
        raise ModelSpecError(
            f"example_inputs is {_described(value)}: it must be a list of tensors or shapes such as '1x3x224x224' "
            "(or a function returning one)"
        )
    specs = []
    for index, item in enumerate(value):
        if isinstance(item, str):
            specs.append(parse_input_spec(item))
        elif isinstance(item, torch.Tensor):
            specs.append(InputSpec.of(item))
        else:
            # Dropping it moved every later input one argument to the left: a bias tensor was captured as the mask.
            raise ModelSpecError(
                f"example_inputs[{index}] is {_described(item)}: fxforge passes example inputs to forward by "
                "position, and each must be a tensor or a shape such as '1x3x224x224'",
                hint=(
                    f"fix a non-tensor argument with {concrete} (concrete_args in Python) and leave it out of "
                    "example_inputs"
                    if (concrete := offered("--concrete NAME=VALUE", "--concrete"))
                    else "give a non-tensor argument a default in forward and leave it out of example_inputs"
                )
                + "; a model taking a dict or list of tensors: capture it with the Python API "
                "(fxforge.capture(model, example_inputs))",
            )
    return specs


def _described(value: Any) -> str:
    text = repr(value)
    if len(text) <= 40 and not isinstance(value, (dict, list, tuple)):
        return text
    return with_article(type(value).__name__)

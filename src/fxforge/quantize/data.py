"""Calibration and evaluation data: the formats ``--calib``, ``--eval`` and ``--data`` accept, read into batches.

Files are read with ``torch.load(weights_only=True)``: tensors, lists, tuples and dicts, never pickled code.
"""

from __future__ import annotations

import pickle
import re
import warnings
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from fxforge import references
from fxforge.artifacts import is_pickle_stream, refuse_unreadable
from fxforge.errors import FxforgeError, InputSpecError, first_line
from fxforge.inputs import make_inputs, specs_of
from fxforge.runtime import describe_inputs

# Random calibration data is split into this many batches; files holding one tensor are split into
# batches of this many samples.
DEFAULT_RANDOM_BATCHES = 8
DEFAULT_SPLIT = 32


class RandomCalibrationWarning(UserWarning):
    """Calibrated or evaluated on random data, or static int8 evaluated on its own calibration data: the int8
    model's accuracy on real, unseen data is unknown."""


RANDOM_WARNING = (
    "calibrated on random inputs: the int8 value ranges (and so its accuracy on real data) are unknown; "
    "pass calibration data (a torch.save file or file.py:function: --calib on the command line, calibration= in "
    "Python) for a model you mean to use"
)
RANDOM_EVAL_WARNING = (
    "accuracy measured on random inputs: the int8 model's accuracy on real data is unknown; "
    "pass evaluation data (a torch.save file or file.py:function: --eval on the command line, eval_data= in "
    "Python) to measure it"
)


@dataclass
class CalibrationData:
    """Input batches (each a tuple of positional inputs), where they came from, and the class labels
    of each batch when the data had them (``(inputs, labels)`` pairs; ``None`` for a batch without)."""

    batches: list[tuple[Any, ...]]
    source: str
    random: bool = False
    labels: list[torch.Tensor | None] = field(default_factory=list)

    @property
    def labelled(self) -> bool:
        return bool(self.labels) and len(self.labels) == len(self.batches) and all(y is not None for y in self.labels)

    @property
    def samples(self) -> int:
        return sum(batch_samples(batch) for batch in self.batches)

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "batches": len(self.batches),
            "samples": self.samples,
            "random": self.random,
            "labels": self.labelled,
        }


def batch_samples(batch: tuple[Any, ...]) -> int:
    """How many samples ``batch`` holds: the first tensor's leading dimension (1 for a scalar or no tensor)."""
    first = next((t for t in batch if isinstance(t, torch.Tensor)), None)
    return int(first.shape[0]) if first is not None and first.dim() > 0 else 1


def leading_batches(batches: Sequence[tuple[Any, ...]], samples: int) -> int:
    """How many leading batches hold at least ``samples`` samples (all of them when they hold fewer)."""
    held = 0
    for count, batch in enumerate(batches, start=1):
        held += batch_samples(batch)
        if held >= samples:
            return count
    return len(batches)


def _class_labels(value: Any, batch: tuple[Any, ...]) -> torch.Tensor | None:
    """``value`` when it looks like one integer class label per sample of ``batch``, else None."""
    first = next((t for t in batch if isinstance(t, torch.Tensor)), None)
    if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape[1] == 1:
        value = value.reshape(-1)  # a column of classes (N x 1), as label arrays often are: read as N classes (QA)
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.is_floating_point() or value.is_complex():
        return None
    return value if first is not None and first.dim() > 0 and value.shape[0] == first.shape[0] else None


def _as_batch(
    item: Any, arity: int | None, source: str, kind: str = "calibration"
) -> tuple[tuple[Any, ...], torch.Tensor | None]:
    if isinstance(item, torch.Tensor):
        batch: tuple[Any, ...] = (item,)
    elif isinstance(item, (tuple, list)):
        batch = tuple(item)
    else:
        raise InputSpecError(
            f"{kind} data from {source} holds a {type(item).__name__}; expected tensors or tuples of tensors",
            hint="each item is one batch: a tensor, or a tuple with one tensor per model input",
        )
    # (inputs, labels) pairs from a DataLoader: the model takes the leading items; the next one, when
    # it holds an integer class per sample, lets the accuracy report measure real top-1 accuracy.
    labels = None
    if arity is not None and len(batch) > arity:
        labels = _class_labels(batch[arity], batch[:arity])
        batch = batch[:arity]
    return batch, labels


def _dataset_with_labels(obj: Any, arity: int | None) -> bool:
    """``(inputs..., labels)`` as whole tensors (samples along dim 0), e.g. ``torch.save((x, y), f)``."""
    if arity is None or not isinstance(obj, (tuple, list)) or len(obj) != arity + 1:
        return False
    if not all(isinstance(t, torch.Tensor) and t.dim() > 0 for t in obj):
        return False
    return _class_labels(obj[arity], tuple(obj[:arity])) is not None and obj[0].shape[0] > 0


ACCEPTED_FORMATS = (
    "accepted: a tensor with samples along dim 0 (one-input models); a tuple (inputs..., labels) of such tensors, "
    "one per model input, then one integer class per sample; or a list of batches, each a tuple with one tensor "
    "per model input, e.g. torch.save(list(zip(a.split(32), b.split(32))), 'data.pt')"
)


def _refuse_unreadable_tuple(obj: Any, examples: Sequence[Any], source: str, kind: str) -> None:
    """Refuse whole tensors in a tuple (``torch.save((a, b), f)``) that are not ``(inputs..., labels)`` for this
    model and are not a list of one-input batches either.

    Read as batches, ``(input_ids, attention_mask)`` would feed the mask as token ids, and ``(x, y)`` with fewer
    labels than samples would feed the labels as images: each fails, or worse, runs, far from the cause.
    """
    if not examples or not isinstance(obj, (tuple, list)) or len(obj) < 2:
        return
    if not all(isinstance(t, torch.Tensor) and t.dim() > 0 for t in obj):
        return
    arity = len(examples)
    example = examples[0]
    if arity == 1 and (not isinstance(example, torch.Tensor) or all(t.dim() == example.dim() for t in obj)):
        return  # a list of batches for a one-input model, each shaped like its example input
    inputs, last = obj[:-1], obj[-1]
    counts = {int(t.shape[0]) for t in inputs}
    if len(obj) == arity + 1 and last.dim() == 1 and not last.is_floating_point() and len(counts) == 1:
        raise InputSpecError(
            f"{kind} data from {source} holds {counts.pop()} samples but {last.shape[0]} labels: (inputs..., "
            "labels) needs one integer class per sample",
            hint=ACCEPTED_FORMATS,
        )
    noun = "tuple" if isinstance(obj, tuple) else "list"
    raise InputSpecError(
        f"{kind} data from {source} is a {noun} of {len(obj)} whole tensors ({describe_inputs(obj)}): neither "
        f"(inputs..., labels) for this model's {arity} input{'s' if arity > 1 else ''} nor a list of batches",
        hint=ACCEPTED_FORMATS,
    )


def _refuse_valueless_tensors(obj: Any, source: str, kind: str) -> None:
    """A sparse tensor, or one on the meta device (no values), in the data: split into batches or read, it failed
    deep in torch, an internal error (QA: ``torch.save(x.to_sparse())``, ``torch.empty(..., device="meta")``)."""
    for leaf in pytree.tree_leaves(obj):  # a generator or DataLoader is one leaf: not consumed here
        if not isinstance(leaf, torch.Tensor):
            continue
        if leaf.is_meta:
            raise InputSpecError(
                f"{kind} data from {source} holds a tensor on the meta device, which has no values",
                hint="save the data's tensors with their values, on the CPU",
            )
        if leaf.layout != torch.strided:
            raise InputSpecError(
                f"{kind} data from {source} holds a {str(leaf.layout).removeprefix('torch.')} tensor: fxforge reads "
                "dense ones",
                hint="save dense tensors (tensor.to_dense())",
            )


def _batches_of(
    obj: Any, arity: int | None, source: str, split: int, kind: str, examples: Sequence[Any] = ()
) -> CalibrationData:
    _refuse_valueless_tensors(obj, source, kind)
    if isinstance(obj, torch.Tensor):
        # One tensor holds samples along dim 0 (a dataset), not one giant batch.
        chunks = [(chunk,) for chunk in obj.split(split)] if obj.dim() > 0 else [(obj,)]
        return CalibrationData(chunks, source, labels=[None] * len(chunks))
    if _dataset_with_labels(obj, arity):
        labels = _class_labels(obj[arity], tuple(obj[:arity]))
        columns = [t.split(split) for t in (*obj[:arity], labels)]
        batches = [tuple(column[i] for column in columns[:-1]) for i in range(len(columns[0]))]
        return CalibrationData(batches, source, labels=list(columns[-1]))
    _refuse_unreadable_tuple(obj, examples, source, kind)
    if isinstance(obj, Mapping) or not isinstance(obj, Iterable):
        raise InputSpecError(
            f"{kind} data from {source} is a {type(obj).__name__}",
            hint="give a tensor (samples along dim 0), (inputs, labels) tensors, or a list of batches",
        )
    pairs = [_as_batch(item, arity, source, kind) for item in _items(obj, source, kind)]
    return CalibrationData([batch for batch, _ in pairs], source, labels=[labels for _, labels in pairs])


# fxforge keeps calibration and evaluation data in memory (int8 is calibrated, then judged, on the same batches):
# an endless generator (itertools.cycle(loader)) filled the machine's memory before failing (QA)
MAX_DATA_BYTES = 4 * 2**30


def _items(obj: Iterable[Any], source: str, kind: str) -> Iterator[Any]:
    """The items of the user's iterable; its own failure part-way (a generator that raises, a DataLoader whose
    dataset does) is the data's error, said in one line with the item it stopped at, not an internal error. More
    than :data:`MAX_DATA_BYTES` of tensors is refused (an endless generator would fill the memory)."""
    count = held = 0
    what = kind if " " in kind else f"{kind} data"  # "evaluation (--data)" says what it is already
    try:
        for item in obj:
            held += sum(t.numel() * t.element_size() for t in pytree.tree_leaves(item) if isinstance(t, torch.Tensor))
            if held > MAX_DATA_BYTES:
                raise InputSpecError(
                    f"{what} from {source} holds more than {MAX_DATA_BYTES / 2**30:g} GiB of tensors after {count + 1} "
                    "items (an endless generator?): fxforge keeps it in memory",
                    hint="pass fewer samples, e.g. itertools.islice(batches, 100)",
                )
            yield item
            count += 1
    except FxforgeError:
        raise
    except Exception as exc:
        raise InputSpecError(
            f"{what} from {source} failed at item {count}: {_last_reason(exc)}",
            hint="the error is raised by the data's own code (its generator or dataset): fix it there",
        ) from None


def _last_reason(exc: Exception) -> str:
    """``Type: message``; for an error a DataLoader worker re-raised, the worker's own message, which torch puts on
    the last line ("Caught IndexError in DataLoader worker process 0. Original Traceback ... IndexError: ...")."""
    text = str(exc).strip()
    if "DataLoader worker process" in text and "\n" in text:
        return text.splitlines()[-1].strip()
    return f"{type(exc).__name__}: {first_line(exc)}" if text else type(exc).__name__


def _load_callable(spec: str, kind: str) -> Callable[..., Any]:
    function = references.import_reference(spec, what=f"{kind} data function", error=InputSpecError)
    if not callable(function):
        raise InputSpecError(f"{kind} data function {spec!r} is a {type(function).__name__}, not callable")
    return function


def _call_user(function: Callable[..., Any], name: str, kind: str) -> Any:
    try:
        return function()
    except Exception as exc:
        raise InputSpecError(
            f"the {kind} data function {name} failed: {type(exc).__name__}: {first_line(exc)}"
        ) from None


def _is_random_spec(spec: Any) -> bool:
    return spec is None or (isinstance(spec, str) and (spec == "random" or spec.startswith("random:")))


def check_data_file(spec: Any, kind: str = "calibration") -> None:
    """Refuse a data file (or the file of ``file.py:function``) that is missing or not a readable file, without
    reading it: :func:`load_calibration` runs after the model is built, and a factory that trains (the digits
    example) spent a minute before "calibration file not found" (QA)."""
    if _is_random_spec(spec) or not isinstance(spec, (str, Path)):
        return
    text = str(spec)
    path = Path(text)
    if ".py:" in text and not path.exists():
        path = Path(text.rpartition(":")[0])
    hint = "give a file written by torch.save, file.py:function, or random[:N]"
    if not path.exists():
        raise InputSpecError(f"{kind} file not found: {path}", hint=hint)
    if path.is_dir():
        raise InputSpecError(f"{kind} file {path} is a directory, not a file", hint=hint)
    refuse_unreadable(path, f"{kind} file", InputSpecError)


def load_calibration(
    spec: Any,
    example_inputs: Sequence[Any],
    *,
    batches: int = DEFAULT_RANDOM_BATCHES,
    seed: int = 0,
    split: int = DEFAULT_SPLIT,
    kind: str = "calibration",
) -> CalibrationData:
    """Turn the user's calibration (or evaluation, ``kind="eval"``) data into a list of input batches.

    ``spec`` is one of:

    * ``None``, ``"random"`` or ``"random:N"``: ``N`` (default ``batches``) random batches shaped like
      ``example_inputs`` -- for a quick look only (:data:`RANDOM_WARNING`);
    * a callable (or ``"file.py:function"``) returning an iterable of batches;
    * a path to a file written by ``torch.save``, or the object itself: a tensor (samples along dim 0,
      split into batches of ``split``); a tuple ``(inputs..., labels)`` of whole tensors (samples along
      dim 0, labels one integer class per sample), split the same way; or a list/tuple whose items
      are batches (a tensor, or a tuple with one tensor per model input).

    Items with more entries than the model has inputs (``(images, labels)`` from a DataLoader) keep
    only the leading inputs; an item right after them that holds one integer class per sample is kept
    as that batch's labels, so the accuracy report can measure real top-1 accuracy.
    """
    arity = len(example_inputs) if example_inputs else None
    if _is_random_spec(spec):
        count = batches
        if isinstance(spec, str) and spec.startswith("random:"):
            try:
                count = int(spec.split(":", 1)[1])
            except ValueError:
                raise InputSpecError(f"cannot read {spec!r}", hint="random or random:N (N batches)") from None
        if count < 1:
            # zero batches would calibrate (or judge) nothing: a vacuous check, not a quick one
            raise InputSpecError(f"{spec!r} asks for {count} batches", hint="random:N needs N >= 1")
        specs = specs_of(example_inputs)
        data = [make_inputs(specs, seed=seed + 1 + i) for i in range(count)]
        source = f"random ({count} batches shaped like the example inputs)"
        return _with_samples(CalibrationData(data, source, random=True, labels=[None] * len(data)), kind)
    if isinstance(spec, CalibrationData):
        return _with_samples(spec, kind)
    if isinstance(spec, (str, Path)):
        text = str(spec)
        if ".py:" in text and not Path(text).exists():
            obj = _call_user(_load_callable(text, kind), text, kind)
            source = f"function {text}"
            return _described(_batches_of(obj, arity, source, split, kind, example_inputs), source, kind)
        path = Path(text)
        if not path.exists():
            raise InputSpecError(
                f"{kind} file not found: {path}",
                hint="give a file written by torch.save, file.py:function, or random[:N]",
            )
        obj = _load_file(path, kind)
        source = f"file {path}"
        return _described(_batches_of(obj, arity, source, split, kind, example_inputs), source, kind)
    if callable(spec) and not isinstance(spec, (torch.Tensor, nn.Module)):
        name = getattr(spec, "__qualname__", type(spec).__name__)
        obj = _call_user(spec, f"{name}()", kind)
        source = f"callable {name}"
        return _described(_batches_of(obj, arity, source, split, kind, example_inputs), source, kind)
    source = f"{type(spec).__name__} in memory"
    return _described(_batches_of(spec, arity, source, split, kind, example_inputs), source, kind)


def _described(data: CalibrationData, source: str, kind: str) -> CalibrationData:
    data.source = source
    return _with_samples(data, kind)


def _with_samples(data: CalibrationData, kind: str) -> CalibrationData:
    # Observers that see no sample keep no range, so the int8 model outputs zeros; and float and int8 compared
    # on no sample "agree" with 0% error. Both would look like a good result.
    if kind.startswith("calibration") and not data.random:
        for index, batch in enumerate(data.batches):
            # int8 ranges cannot be fitted to NaN: the observers failed deep in FX quantization ("torch.histc: range
            # of [-nan, -nan] is not finite"), with a hint to keep a layer in float (QA)
            # so with infinities: the observers' range became [-nan, -nan] alike (QA)
            floats = [t for t in batch if isinstance(t, torch.Tensor) and t.is_floating_point()]
            if any(t.isnan().any() for t in floats):
                raise InputSpecError(
                    f"{kind} data from {data.source} holds NaN values (batch {index}): int8 value ranges cannot be "
                    "fitted to them",
                    hint="calibrate on samples without NaN",
                )
            if any(t.isinf().any() for t in floats):
                raise InputSpecError(
                    f"{kind} data from {data.source} holds infinite values (batch {index}): int8 value ranges "
                    "cannot be fitted to them",
                    hint="calibrate on finite samples",
                )
    if data.samples == 0:
        count = len(data.batches)
        held = f"{count} batch{'' if count == 1 else 'es'} of 0 samples" if count else "no batches"
        raise InputSpecError(
            f"{kind} data from {data.source} holds no samples ({held})",
            hint="give at least one sample: a tensor with samples along dim 0, or a list of non-empty batches",
        )
    return data


def _load_file(path: Path, kind: str) -> Any:
    """``torch.load(weights_only=True)`` of a data file, its failures as one line that says what the file is.

    torch's own message for any file its safe unpickler refuses, random bytes included, is a page that advises
    ``weights_only=False``: wrong for a damaged file, and fxforge never unpickles code from data files.
    """
    try:
        if not zipfile.is_zipfile(path) and not is_pickle_stream(path):
            raise InputSpecError(
                f"cannot read {kind} file {path}: not a file torch.save wrote (neither a zip archive nor a pickle "
                "stream)",
                hint="is the file corrupt or truncated?",
            )
        with warnings.catch_warnings():
            # pickle.dump's protocol 4 makes torch warn before it fails; the failure below says it all
            warnings.filterwarnings("ignore", message=r"Detected pickle protocol")
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except InputSpecError:
        raise
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if found or zipfile.is_zipfile(path):
            what = f" ({found.group(1)})" if found else ""
            raise InputSpecError(
                f"{kind} file {path} holds pickled Python objects{what}: fxforge reads tensors, lists, tuples and "
                "dicts from data files and never unpickles code",
                hint="save tensors (torch.from_numpy(array) for NumPy data), or return the batches from a "
                "file.py:function",
            ) from None
        raise InputSpecError(
            f"cannot read {kind} file {path}: a pickle stream, but not one torch.save wrote (pickle.dump?)",
            hint="save a tensor, (inputs, labels) tensors, or a list of batches with torch.save",
        ) from None
    except OSError as exc:  # a directory, no permission
        raise InputSpecError(f"cannot read {kind} file {path}: {first_line(exc)}") from None
    except Exception as exc:  # a truncated archive, a damaged pickle
        raise InputSpecError(
            f"cannot read {kind} file {path}: {first_line(exc)}", hint="is the file corrupt or truncated?"
        ) from None

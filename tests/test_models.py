"""load_model: every spec form, its errors, seeding and RNG hygiene; and input spec parsing."""

from __future__ import annotations

import pickle
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fxforge.artifacts import program_imports
from fxforge.capture import LOADED, capture
from fxforge.demo import DemoConvNet, DemoMLP
from fxforge.errors import EXIT_USAGE, InputSpecError, MissingExtraError, ModelSpecError
from fxforge.graphs import ATEN
from fxforge.inputs import INT_HIGH, InputSpec, make_inputs, parse_input_spec, specs_of
from fxforge.models import LoadedModel, load_model

FACTORIES = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.lin = nn.Linear(width, 4)

    def forward(self, x):
        return self.lin(x)

    @classmethod
    def narrow(cls):
        return cls(2)


def make_net(width: int = 8):
    return Net(width)


def needs_width(width):
    return Net(width)


def returns_int():
    return 3


instance = Net()
not_a_model = 42
example_inputs = ["3x8", "2x5:int64"]
"""


@pytest.fixture(autouse=True)
def _fixed_seed() -> None:
    torch.manual_seed(0)  # every test draws the same random tensors, run alone or in any order


@pytest.fixture
def factories(tmp_path: Path) -> Path:
    path = tmp_path / "factories.py"
    path.write_text(FACTORIES)
    return path


def weights(loaded: LoadedModel) -> list[torch.Tensor]:
    return list(loaded.module.state_dict().values())


def same_weights(a: LoadedModel, b: LoadedModel) -> bool:
    return all(torch.equal(p, q) for p, q in zip(weights(a), weights(b), strict=True))


def assert_one_line(error: BaseException) -> None:
    assert "\n" not in str(error) and "Traceback" not in str(error)


# --------------------------------------------------------------------------------------------------
# built-in and library models


def test_demo_default_is_the_convnet():
    loaded = load_model("demo")
    assert isinstance(loaded.module, DemoConvNet) and loaded.spec == "demo"
    assert loaded.default_inputs == [InputSpec((1, 3, 32, 32))]
    assert not loaded.module.training and loaded.exported_program is None


def test_demo_mlp():
    loaded = load_model("demo:mlp")
    assert isinstance(loaded.module, DemoMLP)
    assert loaded.default_inputs == [InputSpec((1, 64))]
    assert load_model("demo:mlp", model_kwargs={"hidden": 16}).module.layers[0].out_features == 16


def test_unknown_demo():
    with pytest.raises(ModelSpecError, match="unknown demo model 'nope'") as info:
        load_model("demo:nope")
    assert "convnet" in info.value.hint


def test_train_mode_and_module_spec():
    assert load_model("demo", train=True).module.training
    module = DemoMLP().train()
    loaded = load_model(module)
    # a caller's module keeps its mode: fxforge never changes the caller's objects
    assert loaded.module is module and module.training and loaded.spec == "DemoMLP"
    assert load_model(module, train=True).module.training
    exported = torch.export.export(DemoMLP().eval(), (torch.randn(1, 64),)).module()
    assert load_model(exported).module is exported  # exported modules refuse .eval(); no error


def test_torchvision_model():
    pytest.importorskip("torchvision")
    loaded = load_model("torchvision:resnet18")
    assert type(loaded.module).__name__ == "ResNet" and not loaded.module.training
    assert loaded.default_inputs == [InputSpec((1, 3, 224, 224))]
    assert sum(p.numel() for p in loaded.module.parameters()) == 11_689_512
    assert load_model("torchvision:inception_v3", device="meta").default_inputs == [InputSpec((1, 3, 299, 299))]


def test_torchvision_model_kwargs():
    pytest.importorskip("torchvision")
    loaded = load_model("torchvision:resnet18", model_kwargs={"num_classes": 7}, device="meta")
    assert loaded.module.fc.out_features == 7
    with pytest.raises(ModelSpecError, match="rejected"):
        load_model("torchvision:resnet18", model_kwargs={"no_such_argument": 1}, device="meta")


def test_unknown_torchvision_model():
    pytest.importorskip("torchvision")
    with pytest.raises(ModelSpecError, match="torchvision has no model named 'resnet1800'") as info:
        load_model("torchvision:resnet1800")
    assert_one_line(info.value)
    with pytest.raises(ModelSpecError, match="'resnet81'") as info:  # a misspelling gets the name it resembles
        load_model("torchvision:resnet81")
    assert info.value.hint.startswith("did you mean resnet18? list them with:")


def test_torchvision_never_downloads_weights(monkeypatch):
    """Detection models default to ImageNet backbone weights; fxforge must not fetch them."""
    torchvision = pytest.importorskip("torchvision")

    def no_download(*args, **kwargs):
        raise AssertionError("load_model tried to download weights")

    monkeypatch.setattr(torchvision.models.WeightsEnum, "get_state_dict", no_download)
    loaded = load_model("torchvision:fasterrcnn_mobilenet_v3_large_320_fpn", device="meta")
    assert type(loaded.module).__name__ == "FasterRCNN"
    assert loaded.default_inputs == []  # not a classification model: no default input
    load_model("torchvision:resnet18", device="meta")


def test_timm_model():
    pytest.importorskip("timm")
    loaded = load_model("timm:resnet18")
    assert type(loaded.module).__name__ == "ResNet" and not loaded.module.training
    assert loaded.default_inputs == [InputSpec((1, 3, 224, 224))]
    with pytest.raises(ModelSpecError, match="timm has no model named 'no_such_net'") as info:
        load_model("timm:no_such_net")
    assert "did you mean" not in info.value.hint  # nothing like it
    with pytest.raises(ModelSpecError, match="'convnext_atoo'") as info:
        load_model("timm:convnext_atoo")
    assert info.value.hint.startswith("did you mean convnext_atto?")


@pytest.mark.slow  # importing transformers takes ~9 s
def test_transformers_model():
    pytest.importorskip("transformers")
    config = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=50)
    loaded = load_model("transformers:BertModel", model_kwargs=config)
    assert type(loaded.module).__name__ == "BertModel" and not loaded.module.training
    assert loaded.module.config.hidden_size == 32
    assert loaded.default_inputs == [InputSpec((1, 16), torch.int64)]
    with torch.no_grad():
        loaded.module(*make_inputs(loaded.default_inputs))  # token ids fit the vocabulary
    with pytest.raises(ModelSpecError, match="no model class named 'NoSuchModel'"):
        load_model("transformers:NoSuchModel")
    with pytest.raises(ModelSpecError, match="no model class named 'BertConfig'"):
        load_model("transformers:BertConfig")  # a class, but not a model


def test_transformers_weights_larger_than_memory_are_refused_before_the_build(monkeypatch):
    """QA: a default Llama/Mistral config (7B parameters, 27 GiB in fp32) was killed for memory (exit 137) with no
    word. The weights are counted on the meta device first; the machine's memory is made 8 MiB here."""
    pytest.importorskip("transformers")
    import fxforge.models as models

    config = dict(num_hidden_layers=1, hidden_size=256, num_attention_heads=2, intermediate_size=512, vocab_size=5000)
    real_sysconf = models.os.sysconf
    monkeypatch.setattr(
        models.os, "sysconf", lambda name: 2048 if name == "SC_PHYS_PAGES" else real_sysconf(name)
    )  # 2048 pages of 4 KiB
    built = []
    monkeypatch.setattr(models, "_redraw_zero_layers", built.append)  # the real build would come after the check
    with pytest.raises(
        ModelSpecError,
        match=r"transformers:BertModel has [\d,]+ parameters, 0.01 GiB of weights: "
        r"more than 90% of this machine's 0.01 GiB",
    ) as info:
        load_model("transformers:BertModel", model_kwargs=config)
    assert "device='meta'" in info.value.hint and not built
    meta = load_model("transformers:BertModel", model_kwargs=config, device="meta")  # no weights: no check
    assert next(meta.module.parameters()).device.type == "meta"


def test_transformers_model_args_that_no_config_field_takes_are_refused():
    """A transformers config keeps any keyword as an attribute nothing reads: a misspelt num_hidden_layer=2
    built the full 12-layer model, silently; a value of the wrong type was an internal error (exit 4) whose
    detail was cut off at a line break."""
    pytest.importorskip("transformers")
    with pytest.raises(ModelSpecError, match="BertConfig has no field 'num_hidden_layer'") as info:
        load_model("transformers:BertModel", model_kwargs={"num_hidden_layer": 2})
    assert info.value.hint == "did you mean num_hidden_layers?"
    with pytest.raises(ModelSpecError, match=r"bad config value: .*n_layer.* expected int, got str"):
        load_model("transformers:GPT2Model", model_kwargs={"n_layer": "two"})
    aliased = load_model("transformers:GPT2Model", model_kwargs={"num_hidden_layers": 1, "n_embd": 32, "n_head": 2})
    assert aliased.module.config.n_layer == 1  # an alias of the config (attribute_map) is a field


# --------------------------------------------------------------------------------------------------
# user files and packages


@pytest.mark.parametrize("attr", ["Net", "make_net", "instance"], ids=["class", "function", "instance"])
def test_file_factory(factories: Path, attr: str):
    loaded = load_model(f"{factories}:{attr}")
    assert type(loaded.module).__name__ == "Net" and not loaded.module.training
    assert loaded.default_inputs == [InputSpec((3, 8)), InputSpec((2, 5), torch.int64)]  # the file's example_inputs


def test_file_factory_kwargs(factories: Path):
    assert load_model(f"{factories}:make_net", model_kwargs={"width": 5}).module.lin.in_features == 5
    assert load_model(f"{factories}:needs_width", model_kwargs={"width": 6}).module.lin.in_features == 6


def test_verify_builds_both_sides_with_the_model_args(factories: Path):
    """--model-arg reached the reference only: the candidate was built without it (a mismatch between the same
    model, or 'cannot be called without arguments'; QA finding)."""
    from fxforge.api import verify_specs

    spec = f"{factories}:needs_width"
    result = verify_specs(spec, spec, ["2x4"], model_kwargs={"width": 4}, cases=2)
    assert result.ok


def test_file_example_inputs_as_tensors_or_function(tmp_path: Path):
    (tmp_path / "tensors.py").write_text(
        "import torch\nmodel = torch.nn.Linear(4, 2)\nexample_inputs = [torch.zeros(2, 4)]\n"
    )
    (tmp_path / "function.py").write_text(
        "import torch\nmodel = torch.nn.Linear(4, 2)\ndef example_inputs():\n    return '5x4'\n"
    )
    assert load_model(f"{tmp_path / 'tensors.py'}:model").default_inputs == [InputSpec((2, 4))]
    assert load_model(f"{tmp_path / 'function.py'}:model").default_inputs == [InputSpec((5, 4))]


@pytest.mark.parametrize(
    "attr,needle",
    [
        ("not_a_model", "not_a_model is an int, not a model, class or factory"),
        ("returns_int", "returns_int() returned an int, not an nn.Module"),
        ("needs_width", "cannot be called without arguments"),
        ("missing", "factories.py has no attribute 'missing'"),  # the file, not fxforge's module name for it
    ],
)
def test_file_factory_errors(factories: Path, attr: str, needle: str):
    with pytest.raises(ModelSpecError) as info:
        load_model(f"{factories}:{attr}")
    assert needle in info.value.message
    assert_one_line(info.value)


@pytest.mark.parametrize(
    "attr,message,hint",
    [
        ("Net.forward", "forward is a method of the class Net", "name the class: {factories}:Net"),
        ("Net.__init__", "__init__ is a method of the class Net", "name the class: {factories}:Net"),
        ("instance.forward", "forward is a method of the module instance", "name the module: {factories}:instance"),
    ],
)
def test_a_spec_naming_a_method_names_the_class_instead(capsys, factories: Path, attr: str, message: str, hint: str):
    """QA: file.py:Net.forward was called as a factory without its instance, and the hint said
    ``--model-arg self=VALUE``."""
    from fxforge.cli import main

    with pytest.raises(ModelSpecError) as info:
        load_model(f"{factories}:{attr}")
    assert info.value.message.startswith(f"{factories}:{attr}: {message}: a model spec names a model, class or")
    assert info.value.hint.startswith(hint.format(factories=factories)) and "self" not in info.value.hint
    assert_one_line(info.value)
    assert main(["inspect", f"{factories}:{attr}"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"hint: {hint.format(factories=factories)}" in err and "--model-arg" not in err and "Traceback" not in err


def test_a_classmethod_is_a_factory(factories: Path):
    assert load_model(f"{factories}:Net.narrow").module.lin.in_features == 2


def test_a_factory_that_needs_an_argument_says_how_to_give_it(factories: Path):
    """QA: the error named the missing argument, and no hint said --model-arg (or model_kwargs) gives it."""
    with pytest.raises(ModelSpecError) as info:
        load_model(f"{factories}:needs_width")
    assert info.value.hint == "pass model_kwargs={'width': VALUE}"


@pytest.mark.parametrize(
    "example,needle",
    [
        ("(torch.randn(2, 8), None, torch.randn(2, 8))", "example_inputs[1] is None"),
        ("(torch.randn(2, 8), 0.5)", "example_inputs[1] is 0.5"),
        ("({'x': torch.randn(2, 8)},)", "example_inputs[0] is a dict"),
    ],
)
def test_an_example_input_that_is_not_a_tensor_is_refused(tmp_path: Path, example: str, needle: str):
    """Dropping a None moved the next input one argument left: a bias was captured as the mask, and optimize
    --verify said "verified" of the wrong function (QA finding)."""
    path = tmp_path / "gated.py"
    path.write_text(
        "import torch\nfrom torch import nn\n"
        "class Gated(nn.Module):\n"
        "    def forward(self, x, mask=None, bias=None):\n"
        "        return x * (1 if mask is None else mask) + (0 if bias is None else bias)\n"
        f"example_inputs = {example}\n"
    )
    with pytest.raises(ModelSpecError) as info:
        load_model(f"{path}:Gated")
    assert needle in info.value.message and "by position" in info.value.message
    assert "--concrete" in info.value.hint
    assert_one_line(info.value)


@pytest.mark.parametrize(
    "example,needle",
    [
        ("def example_inputs():\n    raise RuntimeError('no data here')", "example_inputs() raised RuntimeError"),
        ("def example_inputs():\n    pass", "example_inputs is None: it must be a list"),
        ("example_inputs = 5", "example_inputs is 5: it must be a list"),
        ("def example_inputs():\n    return {'x': torch.randn(2, 8)}", "example_inputs is a dict"),
    ],
)
def test_example_inputs_that_are_no_list_are_refused_in_one_line(tmp_path: Path, example: str, needle: str):
    """QA: a raising example_inputs() was an internal error (exit 4) with no line, None and 5 too; a dict had its keys
    read as input specs ("cannot parse input spec 'x'")."""
    path = tmp_path / "m.py"
    path.write_text(f"import torch\nfrom torch import nn\nclass M(nn.Module):\n    def forward(self, x):\n"
                    f"        return x * 2\n{example}\n")  # fmt: skip
    with pytest.raises(ModelSpecError) as info:
        load_model(f"{path}:M")
    assert needle in info.value.message
    assert_one_line(info.value)
    if "raised" in needle:
        assert "m.py:7" in info.value.message  # the user's line


def test_integer_example_inputs_keep_their_range(tmp_path: Path):
    """Token ids for an Embedding(4) were redrawn from [0, 10): every command failed with an index error."""
    import fxforge

    path = tmp_path / "ids.py"
    path.write_text(
        "import torch\nfrom torch import nn\n"
        "class Embeds(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.table = nn.Embedding(4, 8)\n"
        "    def forward(self, ids):\n        return self.table(ids).sum(1)\n"
        "example_inputs = (torch.tensor([[0, 1, 2, 3, 1]]),)\n"
    )
    assert load_model(f"{path}:Embeds").default_inputs[0].high == 4
    captured = fxforge.prepare(f"{path}:Embeds")
    assert int(captured.example_inputs[0].max()) < 4
    assert fxforge.verify(captured, captured.graph_module).ok
    assert fxforge.bench(captured, ["eager"], batches=[3], repeats=1, warmup=1, peak=False).rows[0].ok
    # an output directory keeps the range in inputs.txt: verify and bench of it later draw valid ids too
    result = fxforge.optimize(captured, ["fold_bn"], output_dir=tmp_path / "out")
    assert (tmp_path / "out" / "inputs.txt").read_text().split() == ["1x5:int64:max=3"]
    from fxforge.cli.app import main

    assert main(["verify", f"{path}:Embeds", str(tmp_path / "out"), "--input", "1x5:int64:max=3"]) == 0
    reloaded = load_model(str(tmp_path / "out"), trust_pickle=True)  # what bench and verify of the directory draw
    assert reloaded.default_inputs[0].high == 4 and int(make_inputs(reloaded.default_inputs)[0].max()) < 4
    assert "inputs.txt" in result.files


def test_a_file_that_draws_random_numbers_on_import_builds_the_same_weights_every_time(tmp_path: Path):
    """Only the first build from a file imports it; if its import-time draws (``example_inputs`` made with
    torch.randn) came out of the seeded stream, the first build's weights would differ from every later one,
    and ``verify file.py:A file.py:A`` would report a mismatch (QA found exactly that)."""
    path = tmp_path / "draws_on_import.py"
    path.write_text(
        "import torch\nfrom torch import nn\n"
        "example_inputs = (torch.randn(2, 8),)\n"
        "class A(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(8, 8)\n"
        "    def forward(self, x):\n        return self.fc(x)\n"
    )
    first, second = load_model(f"{path}:A").module, load_model(f"{path}:A").module
    assert torch.equal(first.fc.weight, second.fc.weight)
    assert not torch.equal(first.fc.weight, load_model(f"{path}:A", seed=1).module.fc.weight)
    from fxforge.cli import main
    from fxforge.errors import EXIT_OK

    other = tmp_path / "other_file.py"  # a fresh import in this process: the first build of that file
    other.write_text(path.read_text())
    assert main(["verify", f"{other}:A", f"{other}:A"]) == EXIT_OK


def test_file_errors(tmp_path: Path, factories: Path):
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom on import')\n")
    (tmp_path / "syntax.py").write_text("x = 1\ndef f(:\n")
    cases = {
        f"{tmp_path / 'missing.py'}:f": "file not found",
        f"{tmp_path / 'broken.py'}:f": "RuntimeError: boom on import",
        f"{tmp_path / 'syntax.py'}:f": "syntax.py:2: syntax error",
        str(factories): "names a Python file but no factory",
    }
    for spec, needle in cases.items():
        with pytest.raises(ModelSpecError) as info:
            load_model(spec)
        assert needle in info.value.message, spec
        assert_one_line(info.value)


def test_file_model_code_is_importable_for_pickling(factories: Path):
    loaded = load_model(f"{factories}:Net")
    module = sys.modules[type(loaded.module).__module__]
    assert module.__file__ == str(factories)
    assert str(factories.parent) not in sys.path  # the file's directory is not left on sys.path


def test_package_module_attribute():
    loaded = load_model("fxforge.demo:DemoMLP")
    assert isinstance(loaded.module, DemoMLP) and loaded.default_inputs == []
    assert isinstance(load_model("torch.nn:Identity").module, nn.Identity)
    with pytest.raises(ModelSpecError, match=r"cannot import 'no_such_package\.models'"):
        load_model("no_such_package.models:Net")
    with pytest.raises(ModelSpecError, match="has no attribute 'NoSuchClass'"):
        load_model("fxforge.demo:NoSuchClass")


# --------------------------------------------------------------------------------------------------
# saved models


def test_saved_whole_module(tmp_path: Path):
    path = tmp_path / "model.pt"
    original = load_model("demo")
    torch.save(original.module, path)
    loaded = load_model(str(path), trust_pickle=True)  # a whole module is pickled code: an explicit opt-in
    assert isinstance(loaded.module, DemoConvNet) and not loaded.module.training
    assert same_weights(loaded, original)


def test_saved_state_dict_is_a_clear_error(tmp_path: Path):
    path = tmp_path / "weights.pt"
    torch.save(DemoMLP().state_dict(), path)
    with pytest.raises(ModelSpecError, match="holds a state_dict, not a module") as info:
        load_model(str(path))
    assert "file.py:factory" in info.value.hint
    assert_one_line(info.value)


def test_saved_other_object(tmp_path: Path):
    path = tmp_path / "list.pth"
    torch.save([1, 2, 3], path)
    with pytest.raises(ModelSpecError, match=r"holds a list, not an nn\.Module"):
        load_model(str(path))


@pytest.mark.parametrize("seed", range(12))
def test_corrupt_file(tmp_path: Path, seed: int):
    """Random bytes make torch.load raise many different exception types; each must become one clear line."""
    rng = random.Random(seed)
    path = tmp_path / "model.pt"
    path.write_bytes(bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 7, 100, 3000]))))
    with pytest.raises(ModelSpecError) as info:
        load_model(str(path))
    assert_one_line(info.value)
    assert info.value.exit_code == EXIT_USAGE


@pytest.mark.parametrize("seed", [35, 71, 75])
def test_corrupt_file_odd_errors(tmp_path: Path, seed: int):
    """These byte strings made torch.load raise UnicodeDecodeError, ValueError and OverflowError."""
    rng = random.Random(seed)
    n = rng.choice([1, 2, 10, 100, 1000, 5000])
    path = tmp_path / "model.pt"
    path.write_bytes(bytes(rng.getrandbits(8) for _ in range(n)))
    with pytest.raises(ModelSpecError, match="cannot read"):
        load_model(str(path))


def test_a_file_torch_save_did_not_write_says_so(tmp_path: Path):
    """Text in a .pt file made the unpickler fail with KeyError(174812789), reported as 'cannot read: 174812789'."""
    path = tmp_path / "model.pt"
    path.write_text("junk\n")
    for trusted in (False, True):
        with pytest.raises(ModelSpecError, match=r"not a file torch\.save wrote") as info:
            load_model(str(path), trust_pickle=trusted)
        assert_one_line(info.value)
    pickled = tmp_path / "pickled.pt"
    pickled.write_bytes(pickle.dumps({"a": 1}))  # a plain pickle stream: torch.load's own error, with its type
    with pytest.raises(ModelSpecError, match="RuntimeError: Invalid magic number"):
        load_model(str(pickled), trust_pickle=True)


def test_truncated_checkpoint(tmp_path: Path):
    path = tmp_path / "model.pt"
    torch.save(DemoConvNet(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelSpecError, match="cannot read") as info:
        load_model(str(path))
    assert "corrupt" in info.value.hint


def test_pickled_module_whose_code_is_gone(tmp_path: Path):
    code = tmp_path / "gone_model_code.py"
    code.write_text("import torch\nclass Gone(torch.nn.Module):\n    def forward(self, x):\n        return x\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import gone_model_code

        torch.save(gone_model_code.Gone(), tmp_path / "gone.pt")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("gone_model_code", None)
    code.unlink()
    with pytest.raises(ModelSpecError, match="cannot read") as info:
        load_model(str(tmp_path / "gone.pt"), trust_pickle=True)
    assert "importable" in info.value.hint


def test_exported_program(tmp_path: Path):
    path = tmp_path / "mlp.pt2"
    module = DemoMLP().eval()
    example = (torch.randn(2, 64),)
    torch.export.save(torch.export.export(module, example), path)
    loaded = load_model(str(path))
    assert loaded.exported_program is not None
    assert loaded.default_inputs == [InputSpec((2, 64))]
    captured = capture(loaded, example)
    assert captured.record.method == LOADED and captured.record.dialect == ATEN
    assert captured.record.ok
    with torch.no_grad():
        assert torch.allclose(captured.graph_module(*example), module(*example))


def _fresh_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a new interpreter: nothing this test process imported or registered is there."""
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_transformers_program_loads_in_a_fresh_process(tmp_path: Path):
    # A transformers model returns a ModelOutput dataclass, a pytree type registered only once
    # transformers.modeling_outputs is imported; torch.export.load refuses the file before that.
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37, vocab_size=99
    )
    module = transformers.BertModel(config).eval()
    example = (torch.randint(0, 99, (1, 8)),)
    path = tmp_path / "bert.pt2"
    torch.export.save(torch.export.export(module, example, strict=False), path)
    assert program_imports(path) == ["transformers.modeling_outputs"]

    done = _fresh_python(
        f"import fxforge, torch; loaded = fxforge.load_model({str(path)!r}); "
        "print(type(loaded.module(torch.zeros(1, 8, dtype=torch.int64))).__name__)",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == type(module(*example)).__name__
    # the load line fxforge prints for plain torch (its imports first) works too
    done = _fresh_python(f"import transformers.modeling_outputs, torch; torch.export.load({str(path)!r})", tmp_path)
    assert done.returncode == 0, done.stderr


def test_program_with_an_unknown_output_type_names_the_module_to_import(tmp_path: Path):
    (tmp_path / "outtypes.py").write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass

            import torch


            @dataclass
            class Pair:
                first: torch.Tensor
                second: torch.Tensor


            torch.utils._pytree.register_dataclass(Pair, serialized_type_name="outtypes.Pair")


            class Split(torch.nn.Module):
                def forward(self, x):
                    return Pair(x + 1, x * 2)
            """
        )
    )
    path = tmp_path / "split.pt2"
    done = _fresh_python(
        f"import torch, outtypes; torch.export.save(torch.export.export(outtypes.Split(), (torch.ones(2),)), "
        f"{str(path)!r})",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert program_imports(path) == ["outtypes"]

    done = subprocess.run(
        [sys.executable, "-m", "fxforge", "inspect", str(path)], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "outtypes.Pair" in done.stderr and "import outtypes before loading it" in done.stderr
    # fxforge imports only the libraries it knows; with the user's import first, the file loads
    done = _fresh_python(f"import outtypes, fxforge; fxforge.load_model({str(path)!r})", tmp_path)
    assert done.returncode == 0, done.stderr


def test_corrupt_exported_program(tmp_path: Path):
    path = tmp_path / "model.pt2"
    path.write_bytes(b"not a zip archive" * 20)
    with pytest.raises(ModelSpecError, match="cannot read exported program") as info:
        load_model(str(path))
    assert_one_line(info.value)


@pytest.mark.parametrize("name", ["missing.pt", "missing.pt2", "missing.pth"])
def test_missing_saved_file(tmp_path: Path, name: str):
    with pytest.raises(ModelSpecError, match="file not found"):
        load_model(str(tmp_path / name))


def test_directory_without_model(tmp_path: Path):
    with pytest.raises(ModelSpecError, match="holds no model"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("spec", ["", "   ", "bad spec", "foo:", ":bar", "torchvision:", "model.tflite"])
def test_bad_spec(spec: str):
    with pytest.raises(ModelSpecError) as info:
        load_model(spec)
    assert info.value.hint and "demo" in info.value.hint
    assert_one_line(info.value)


# --------------------------------------------------------------------------------------------------
# seeds, RNG hygiene, meta device


def test_same_seed_same_weights_other_seed_other_weights():
    assert same_weights(load_model("demo", seed=0), load_model("demo", seed=0))
    assert same_weights(load_model("demo:mlp", seed=3), load_model("demo:mlp", seed=3))
    assert not same_weights(load_model("demo", seed=0), load_model("demo", seed=1))


def test_same_seed_same_weights_torchvision():
    pytest.importorskip("torchvision")
    assert same_weights(load_model("torchvision:resnet18"), load_model("torchvision:resnet18"))


def test_loading_does_not_touch_the_callers_rng(factories: Path):
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    load_model("demo")
    load_model("demo:mlp", seed=7)
    load_model(f"{factories}:make_net")
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_meta_device():
    loaded = load_model("demo", device="meta")
    assert all(t.device.type == "meta" for t in [*loaded.module.parameters(), *loaded.module.buffers()])


def test_meta_device_when_the_constructor_needs_tensor_data():
    """torchvision's RegNet computes its widths with tensors and ``.tolist()``, which meta tensors cannot do."""
    pytest.importorskip("torchvision")
    loaded = load_model("torchvision:regnet_y_400mf", device="meta")
    tensors = [*loaded.module.parameters(), *loaded.module.buffers()]
    assert tensors and all(t.device.type == "meta" for t in tensors)
    assert sum(p.numel() for p in loaded.module.parameters()) == sum(
        p.numel() for p in load_model("torchvision:regnet_y_400mf").module.parameters()
    )
    # the patch that moves parameters to meta is gone afterwards
    assert nn.Linear(2, 2).weight.device.type == "cpu"


# --------------------------------------------------------------------------------------------------
# missing extras


@pytest.mark.parametrize(
    "spec,package,extra",
    [
        ("torchvision:resnet18", "torchvision", "vision"),
        ("timm:resnet18", "timm", "timm"),
        ("transformers:BertModel", "transformers", "transformers"),
    ],
)
def test_missing_extra_names_the_extra(monkeypatch, spec: str, package: str, extra: str):
    monkeypatch.setitem(sys.modules, package, None)  # `import package` now raises ImportError
    with pytest.raises(MissingExtraError) as info:
        load_model(spec)
    error = info.value
    assert error.package == package and error.extra == extra
    assert f"needs the '{package}' package" in error.message
    assert f"pip install 'fxforge[{extra}]'" in error.hint
    assert error.exit_code == EXIT_USAGE


# --------------------------------------------------------------------------------------------------
# input specs


@pytest.mark.parametrize(
    "text,shape,dtype",
    [
        ("1x3x224x224", (1, 3, 224, 224), torch.float32),
        ("2x16:int64", (2, 16), torch.int64),
        ("2 x 16 : long", (2, 16), torch.int64),
        ("4X8", (4, 8), torch.float32),
        ("4,8", (4, 8), torch.float32),
        ("7", (7,), torch.float32),
        (":int64", (), torch.int64),
        ("scalar", (), torch.float32),  # how str() writes a 0-d spec
        ("1x64:fp16", (1, 64), torch.float16),
        ("1x64:BF16", (1, 64), torch.bfloat16),
        ("3:bool", (3,), torch.bool),
        ("3:float64", (3,), torch.float64),
    ],
)
def test_parse_input_spec(text: str, shape: tuple[int, ...], dtype: torch.dtype):
    spec = parse_input_spec(text)
    assert spec == InputSpec(shape, dtype)
    assert parse_input_spec(str(spec)) == spec  # str() round-trips


@pytest.mark.parametrize(
    "text,needle",
    [
        ("", "cannot parse"),
        ("1xx3", "cannot parse"),
        ("1x3x", "cannot parse"),
        ("-1x3", "cannot parse"),
        ("1.5x3", "cannot parse"),
        ("abc", "cannot parse"),
        ("0x3", "size 0"),
        ("1x3:float99", "unknown dtype 'float99'"),
        ("1x3:int64:int32", "cannot parse"),
        ("1x3:max=3", "max= is for integer inputs"),
        ("1x3:bool:max=1", "max= is for integer inputs"),
        ("1x3:int8:max=128", "does not fit int8"),
        ("1x3:int64:max=-1", "cannot parse"),
        ("1x3:int64:max=\u0663", "cannot parse"),  # an Arabic-Indic 3
    ],
)
def test_bad_input_spec(text: str, needle: str):
    with pytest.raises(InputSpecError) as info:
        parse_input_spec(text)
    assert needle in info.value.message
    assert info.value.hint
    assert_one_line(info.value)


def test_an_integer_range_in_a_spec_is_drawn_and_written_back():
    spec = parse_input_spec("2x64:int64:max=2")
    assert spec.high == 3 and str(spec) == "2x64:int64" and spec.text(with_range=True) == "2x64:int64:max=2"
    (ids,) = make_inputs([spec])
    assert set(ids.unique().tolist()) == {0, 1, 2}
    assert parse_input_spec(spec.text(with_range=True)).high == 3
    assert parse_input_spec("1x8:int64:max=30521").high == 30522  # a vocabulary's ids
    # what is written back is the range drawn from, not the largest id that happened to come up (max=60 of 99)
    for seed in range(5):
        (drawn,) = make_inputs(["1x4:int64:max=99"], seed=seed)
        assert specs_of([drawn])[0].text(with_range=True) == "1x4:int64:max=99"
    with pytest.raises(InputSpecError, match="does not fit"):  # its exclusive bound, max + 1, must fit too
        parse_input_spec(f"1x2:int64:max={2**63 - 1}")
    assert InputSpec.of(torch.tensor([0, 2**63 - 1])).high == 2**63 - 1  # a file's extreme example: drawable
    make_inputs([InputSpec.of(torch.tensor([0, 2**63 - 1]))])
    # the default range is not written: drawn ids of a plain 2x64:int64 give back the plain text
    assert specs_of(make_inputs(["2x64:int64"]))[0].text(with_range=True) == "2x64:int64"


def test_make_inputs():
    specs = [InputSpec((2, 3)), InputSpec((4, 5), torch.int64), InputSpec((6,), torch.bool)]
    a, b = make_inputs(specs, seed=0), make_inputs(specs, seed=0)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(make_inputs(specs, seed=1)[0], a[0])
    assert [t.dtype for t in a] == [torch.float32, torch.int64, torch.bool]
    assert int(a[1].min()) >= 0 and int(a[1].max()) < INT_HIGH
    assert specs_of(a) == specs
    # the batch is the first input's first dimension: inputs of another first dimension are not batched
    assert [t.shape for t in make_inputs(specs, batch=7)] == [(7, 3), (4, 5), (6,)]
    same_batch = [InputSpec((2, 3)), InputSpec((2, 5), torch.int64), InputSpec((2,), torch.bool)]
    assert [t.shape for t in make_inputs(same_batch, batch=7)] == [(7, 3), (7, 5), (7,)]
    meta = make_inputs(specs, device="meta")
    assert all(t.device.type == "meta" for t in meta) and specs_of(meta) == specs
    assert make_inputs([InputSpec((2,), torch.float16)])[0].dtype == torch.float16


def test_make_inputs_leaves_global_rng_alone():
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    make_inputs([InputSpec((3, 3))])
    assert torch.equal(torch.rand(2), expected)


def test_specs_of_rejects_non_tensors_naming_the_argument_and_the_way_out():
    with pytest.raises(InputSpecError, match="argument 1 is of type int") as raised:
        specs_of([torch.zeros(1), 3], "export")
    assert str(raised.value).startswith("export needs tensor inputs") and "concrete_args" in raised.value.hint
    with pytest.raises(InputSpecError, match="one tensor per forward argument; argument 0 is a dict") as raised:
        specs_of([{"a": torch.zeros(1)}])
    assert "wrap the model" in raised.value.hint


def test_split_and_bench_refuse_a_dict_argument_rather_than_baking_it_in():
    """QA: split of a model taking a dict wrote stages whose first took no input (the example's tensors were
    constants), and bench raised "'dict' object has no attribute 'dim'"."""
    import fxforge

    class TakesADict(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 4)

        def forward(self, d):
            return self.linear(d["a"]) - self.linear(d["b"])

    captured = fxforge.capture(TakesADict().eval(), ({"a": torch.randn(2, 8), "b": torch.randn(2, 8)},))
    for step in (lambda: fxforge.split(captured, stages=2), lambda: fxforge.bench(captured, ["eager"], repeats=1)):
        with pytest.raises(InputSpecError, match="one tensor per forward argument; argument 0 is a dict"):
            step()


def test_file_example_inputs_with_bad_spec(tmp_path: Path):
    path = tmp_path / "bad_inputs.py"
    path.write_text(
        textwrap.dedent("""
        import torch
        model = torch.nn.Linear(4, 2)
        example_inputs = ["4xx"]
    """)
    )
    with pytest.raises(InputSpecError, match="cannot parse input spec '4xx'"):
        load_model(f"{path}:model")


def test_transformers_kv_cache_is_off_by_default_so_llama_captures_on_meta():
    pytest.importorskip("transformers")
    tiny = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 2, "vocab_size": 100}  # fmt: skip
    loaded = load_model("transformers:LlamaForCausalLM", model_kwargs=tiny, device="meta")
    assert loaded.module.config.use_cache is False  # a DynamicCache output is not a pytree torch.export flattens
    captured = capture(loaded, (torch.zeros(1, 16, dtype=torch.int64, device="meta"),), check=False)
    assert captured.record.method == "torch.export"
    # torch.fx's "co_varnames is too small" is said in words a user can act on
    (tried,) = captured.record.attempts
    assert tried.error.endswith("co_varnames is too small (its forward takes **kwargs, as in transformers)")
    asked = load_model("transformers:LlamaForCausalLM", model_kwargs={**tiny, "use_cache": True}, device="meta")
    assert asked.module.config.use_cache is True  # the user's explicit choice wins


@pytest.mark.parametrize("spec", ["demo", "torchvision:resnet18", "timm:resnet18", "transformers:MobileNetV2Model"])
def test_built_batchnorms_are_not_the_identity(spec):
    """Built without weights a BatchNorm passes its input through, and a rewrite that dropped it or folded its mean
    or shift wrongly could not fail a check: the loader draws every BatchNorm term (seeded)."""
    if spec != "demo":
        pytest.importorskip(spec.partition(":")[0])
    norms = [m for m in load_model(spec).module.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms
    # transformers' are measured on random images (its 0.02-wide init makes small activations: small means)
    least_mean = 0.0 if spec.startswith("transformers:") else 0.01
    for bn in norms:
        assert bn.running_mean.abs().max() > least_mean
        for tensor, identity in ((bn.running_var, 1.0), (bn.weight, 1.0), (bn.bias, 0.0)):
            assert (tensor - identity).abs().max() > 0.01
    again = [m for m in load_model(spec).module.modules() if isinstance(m, nn.BatchNorm2d)]
    assert torch.equal(again[0].running_mean, norms[0].running_mean)  # the same seed, the same model
    other = next(m for m in load_model(spec, seed=1).module.modules() if isinstance(m, nn.BatchNorm2d))
    assert not torch.equal(other.running_mean, norms[0].running_mean)


def test_verify_fails_a_rewrite_that_drops_the_batchnorms():
    """The rewrite the loader's BatchNorm draw exists for: with identity BatchNorms it passed --verify."""
    import fxforge

    loaded = load_model("torchvision:resnet18")
    x = torch.randn(1, 3, 32, 32)
    captured = capture(loaded, (x,))
    gm = captured.graph_module
    modules = dict(gm.named_modules())
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and isinstance(modules[node.target], nn.BatchNorm2d):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    gm.recompile()
    assert not fxforge.verify(loaded.module, gm, inputs=[x]).ok


def test_an_unknown_device_is_one_line():
    """QA: load_model('demo', device='bogus') raised torch's RuntimeError listing every device type."""
    from fxforge.errors import ModelSpecError

    with pytest.raises(ModelSpecError, match="unknown device 'bogus'"):
        load_model("demo", device="bogus")


def test_a_transformers_models_token_ids_span_its_vocabulary():
    """From [0, 10), every check of a transformers model read 10 rows of its embedding: a wrong row 50 was
    verified as equal (QA)."""
    pytest.importorskip("transformers")
    import copy

    import fxforge

    config = {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64}
    loaded = fxforge.load_model("transformers:BertModel", model_kwargs={**config, "vocab_size": 100})
    assert loaded.default_inputs[0].high == 100
    wrong = copy.deepcopy(loaded.module)
    with torch.no_grad():
        wrong.embeddings.word_embeddings.weight[50] += torch.randn(32)  # a constant would vanish in LayerNorm
    assert not fxforge.verify(loaded.module, wrong, input_specs=loaded.default_inputs).ok


def test_a_program_with_damaged_example_inputs_is_a_corrupt_file(tmp_path, monkeypatch):
    """QA: a crafted .pt2 (loaded with --trust-pickle) whose recorded example inputs were not (args, kwargs) ended in
    an internal error (KeyError: 0, exit 4); it is a damaged file, said in one line."""
    import types

    from fxforge import models

    path = tmp_path / "m.pt2"
    path.write_bytes(b"PK")  # exists; the stand-in loader below reads nothing
    monkeypatch.setattr(models, "load_program", lambda p: types.SimpleNamespace(example_inputs={"x": 1}))
    with pytest.raises(ModelSpecError, match="recorded example inputs are not"):
        load_model(str(path), trust_pickle=True)


def test_two_model_files_importing_their_own_sibling_of_one_name_each_get_their_own(tmp_path):
    """QA: a/model.py and b/model.py each import ``scale`` from their own helpers.py; b got a's from the module
    cache, and ``fxforge verify a/model.py:build b/model.py:build`` said OK for models computing x*2 and x*3."""
    from fxforge.api import verify_specs

    model = (
        "from torch import nn\nfrom helpers import scale\n"
        "class M(nn.Module):\n    def forward(self, x):\n        return scale(x)\n"
        "def build():\n    return M()\n"
    )
    for folder, factor in (("a", 2), ("b", 3)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model.py").write_text(model)
        (tmp_path / folder / "helpers.py").write_text(f"def scale(x):\n    return x * {factor}\n")
    a, b = str(tmp_path / "a" / "model.py:build"), str(tmp_path / "b" / "model.py:build")
    x = torch.ones(1, 2)
    assert torch.equal(load_model(a).module(x), 2 * x) and torch.equal(load_model(b).module(x), 3 * x)
    assert not verify_specs(a, b, ["2x4"]).ok
    assert verify_specs(a, a, ["2x4"]).ok
    assert "torch" in sys.modules and "fxforge" in sys.modules  # installed packages are never dropped


def test_a_package_model_spec_is_found_from_the_folder_above_it(tmp_path, monkeypatch):
    """QA: ``pkg.model:build`` run from pkg's parent said "No module named 'pkg'": the fxforge script's path has its
    own folder, not the current one, as ``python -m`` has it. Relative imports inside the package then work too."""
    package = tmp_path / "qa_pkg_spec"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "ops.py").write_text("def double(x):\n    return x * 2\n")
    (package / "model.py").write_text(
        "from torch import nn\nfrom .ops import double\n"
        "class M(nn.Module):\n    def forward(self, x):\n        return double(x)\n"
        "def build():\n    return M()\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    x = torch.ones(2, 3)
    assert torch.equal(load_model("qa_pkg_spec.model:build").module(x), 2 * x)
    with pytest.raises(ModelSpecError, match="No module named 'no_such_pkg'"):
        load_model("no_such_pkg.model:build")


def test_a_loaded_model_runs_when_called_as_its_module_does():
    loaded = load_model("demo")
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), loaded.module(x))


def test_a_transformers_config_the_model_rejects_is_a_spec_error():
    """QA: a config transformers' constructor refuses (hidden size 65 for 12 heads) was an "internal error"."""
    pytest.importorskip("transformers")
    with pytest.raises(ModelSpecError, match="building the model raised ValueError") as info:
        load_model("transformers:BertModel", model_kwargs={"hidden_size": 65})
    assert "model_kwargs" in info.value.hint


def test_user_sources_copy_only_modules_the_pickle_names_and_only_files_still_there(tmp_path):
    """QA (a flaky CI failure): a module ``helpers`` imported beside an earlier model file was copied into an output
    because the bytes ``helpers`` occurred in the pickle (an attribute name), and its folder had since been deleted:
    FileNotFoundError. Only the modules the pickle's GLOBAL opcodes name are copied, and only files that exist."""
    import shutil

    from fxforge.artifacts import write_user_sources

    folder = tmp_path / "gone"
    folder.mkdir()
    (folder / "helpers.py").write_text("def scale(x):\n    return x * 2\n")
    (folder / "model.py").write_text(
        "from torch import nn\nfrom helpers import scale\n"
        "class M(nn.Module):\n    def forward(self, x):\n        return scale(x)\n"
        "def build():\n    return M()\n"
    )
    user = load_model(f"{folder / 'model.py'}:build").module
    unrelated = nn.Linear(2, 2)
    unrelated.register_buffer("helpers_scale", torch.ones(1))  # the name 'helpers' inside the pickle's bytes
    (tmp_path / "out").mkdir()
    torch.save(unrelated, tmp_path / "out" / "a.pt")
    assert write_user_sources(tmp_path / "out" / "a.pt", tmp_path / "out") == []
    torch.save(user, tmp_path / "out" / "b.pt")  # names fxforge_user_model.M: its file is copied
    assert write_user_sources(tmp_path / "out" / "b.pt", tmp_path / "out") == ["source/fxforge_user_model.py"]
    shutil.rmtree(folder)  # the file is gone: nothing to copy, and no FileNotFoundError
    assert write_user_sources(tmp_path / "out" / "b.pt", tmp_path / "out") == []


def test_a_transformers_mobilenet_v2_has_outputs_that_depend_on_the_input():
    """QA: its 0.02-wide initialisation shrank the signal to 1e-24 (verify then passed anything that small); with
    drawn BatchNorm statistics every input gave the same output (CANNOT VERIFY). Measured statistics keep it."""
    pytest.importorskip("transformers")
    loaded = load_model("transformers:MobileNetV2Model", model_kwargs={"image_size": 32, "depth_multiplier": 0.35})
    with torch.no_grad():
        first, second = (loaded.module(torch.randn(2, 3, 32, 32)).pooler_output for _ in range(2))
    assert first.abs().max() > 1e-2 and (first - second).abs().max() > 1e-2 * first.abs().max()


def test_a_transformers_mobilevit_keeps_finite_outputs_with_measured_statistics():
    """The zoo's MobileViT returned NaN on every case (CANNOT VERIFY): BatchNorm shifts drawn after the statistics
    were measured reached the next BatchNorm, measured on a signal of 1e-6, and each one multiplied them by 300."""
    pytest.importorskip("transformers")
    config = {"image_size": 64, "hidden_sizes": [16, 24, 32], "neck_hidden_sizes": [8, 8, 16, 16, 24, 24, 32]}
    loaded = load_model("transformers:MobileViTModel", model_kwargs=config)
    with torch.no_grad():
        first, second = (loaded.module(torch.randn(2, 3, 64, 64)).last_hidden_state for _ in range(2))
    assert first.isfinite().all() and first.abs().max() < 1e3
    assert (first - second).abs().max() > 1e-2 * first.abs().max()


def test_a_name_that_is_no_transformers_model_class_gets_a_model_class_or_why():
    """Regression QA: "did you mean AutoModel?" for AutoModel, "did you mean BertConfig?" for BertConfig (any capital
    name was a candidate, the refused one too), and "bertmodel" matched HubertModel (case-sensitive)."""
    from fxforge.models import _transformers_class_hint

    names = ["AutoModel", "AutoModelForCausalLM", "BertConfig", "BertModel", "HubertModel", "GPT2LMHeadModel",
             "BertForMaskedLM", "TFBertModel", "pipeline", "Pipeline"]  # fmt: skip
    assert _transformers_class_hint("AutoModel", names).startswith("AutoModel is a factory that needs a checkpoint")
    assert _transformers_class_hint("bertmodel", names) == "did you mean BertModel?"
    assert _transformers_class_hint("GPT2LMHeadModle", names) == "did you mean GPT2LMHeadModel?"
    for refused in ("BertConfig", "pipeline"):  # no model class near: the example, never the name refused
        assert _transformers_class_hint(refused, names) == "e.g. transformers:BertModel"


def test_a_method_asking_for_the_other_dialect_of_a_loaded_graph_is_refused(tmp_path):
    """QA: ``inspect out/model.pt2 --method symbolic_trace`` used the ATen graph as it is, silently: --method was
    ignored. The same dialect is fine (nothing to capture again)."""
    import fxforge
    from fxforge.errors import FxforgeError

    captured = fxforge.prepare("demo", method="export")
    path = tmp_path / "demo.pt2"
    torch.export.save(captured.exported_program, path)
    with pytest.raises(FxforgeError, match=r"asks for a torch-dialect graph, but the model is already an ATen") as info:
        fxforge.prepare(str(path), method="symbolic_trace")
    assert info.value.exit_code == EXIT_USAGE
    assert fxforge.prepare(str(path), method="export").dialect == ATEN


def test_an_encoder_decoder_gets_decoder_inputs_by_default():
    """QA: ``fxforge inspect transformers:T5Model`` failed on its default inputs, "You must specify exactly one of
    input_ids or inputs_embeds" (its decoder's), and inputs are positional: the mask and decoder ids come next."""
    pytest.importorskip("transformers")
    config = {"d_model": 16, "d_ff": 32, "num_layers": 1, "num_heads": 2, "d_kv": 8, "vocab_size": 64}
    loaded = load_model("transformers:T5Model", model_kwargs=config)
    assert [(s.shape, s.dtype, s.high) for s in loaded.default_inputs] == [
        ((1, 16), torch.int64, 64),
        ((1, 16), torch.int64, 2),  # the attention mask: 0 or 1
        ((1, 16), torch.int64, 64),
    ]
    import fxforge

    captured = fxforge.prepare("transformers:T5Model", model_kwargs=config)
    assert captured.graph_module is not None
    encoder_only = load_model(
        "transformers:BertModel",
        model_kwargs={"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32},
    )
    assert len(encoder_only.default_inputs) == 1


@pytest.mark.parametrize(
    "spec,given,hint",
    [
        ("demo", {"bogus": 1}, "it takes num_classes"),
        # torchvision's builder passes **kwargs on to ResNet: its parameters are named too
        ("torchvision:resnet18", {"num_clases": 3}, "did you mean num_classes? it takes weights, progress, block"),
        ("timm:resnet18", {"num_clases": 3}, "did you mean num_classes? it takes pretrained, block"),
    ],
)
def test_a_rejected_model_arg_is_told_what_the_constructor_takes(spec, given, hint, capsys):
    """QA: `--model-arg bogus=1` got the constructor's TypeError and no hint."""
    if spec.startswith("timm"):
        pytest.importorskip("timm")
    with pytest.raises(ModelSpecError) as raised:
        load_model(spec, model_kwargs=given)
    assert "constructor rejected model_kwargs" in str(raised.value) and raised.value.hint.startswith(hint)

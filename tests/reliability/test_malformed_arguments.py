"""Property: every command, given malformed arguments, exits with a documented code and prints no traceback."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fxforge.cli import main
from fxforge.errors import EXIT_CAPTURE, EXIT_FINDINGS, EXIT_OK, EXIT_USAGE

DOCUMENTED = {EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_CAPTURE}
MODELS = str(Path(__file__).parent / "reliability_models.py")

# Text that looks like what users mistype: numbers, negative numbers, YAML fragments, markup, paths, nothing.
junk = st.one_of(
    st.text(min_size=0, max_size=12),
    st.sampled_from(["-1", "0", "1e309", "nan", "[1", "{a: [}", "[bold]x[/]", "..", "/", "x=1", "a.b=c", "1x0", "::"]),
    st.integers(-(10**20), 10**20).map(str),
)
# Mostly a valid model, so that the malformed options are what is exercised, not only the spec.
model_spec = st.one_of(
    st.just("demo"),
    st.just("demo:mlp"),
    st.sampled_from(["demo:nope", "torchvision:nope", "timm:nope", "transformers:Nope", "x.py:f", "x.pt"]),
    st.just(f"{MODELS}:factory_that_raises"),
    junk,
)


@st.composite
def command_line(draw) -> list[str]:
    command = draw(st.sampled_from(["inspect", "lint", "optimize", "verify", "export", "bench", "quantize"]))
    args = [command, draw(model_spec)]
    if command == "verify":
        args.append(draw(model_spec))
    options = {
        "inspect": ["--input", "--depth", "--check-batch", "--model-arg", "--method", "--leaf", "--seed"],
        "lint": ["--input", "--select", "--ignore", "--fail-on", "--model-arg"],
        "optimize": ["--passes", "--option", "--input", "--pipeline", "--model-arg"],
        "verify": ["--input", "--cases", "--rtol", "--atol", "--model-arg"],
        "export": ["--to", "--opset", "--cases", "--input", "--output"],
        "bench": ["--batch", "--threads", "--repeats", "--warmup", "--input"],
        "quantize": ["--mode", "--calib", "--eval", "--keep-float-until", "--random-batches", "--float-layer"],
    }[command]
    for option in draw(st.lists(st.sampled_from(options), max_size=3)):
        args += [option, draw(junk)]
    if command == "bench":
        args += ["--backends", "eager", "--repeats", "1", "--warmup", "1"]  # a valid draw must still be quick
    return args


# derandomize: the same 60 command lines on every run, so the suite's time is predictable
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=command_line())
def test_malformed_arguments_exit_with_a_documented_code_and_no_traceback(args, capsys, tmp_path_factory):
    if "-o" not in args and "--output" not in args and args[0] in ("optimize", "quantize"):
        args += ["-o", str(tmp_path_factory.mktemp("out") / "o")]
    code = main(args)
    _, err = capsys.readouterr()
    assert code in DOCUMENTED, (args, code, err[-500:])
    assert "Traceback" not in err and "internal error" not in err, (args, err[-500:])

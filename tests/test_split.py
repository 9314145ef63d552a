"""fxforge split: the optimal cuts (DP against brute force), crossing bytes, stage modules on real models in both
dialects, plans on meta (resnet50 balance, a 70B Llama in 8 stages), the split_spec torch's pipeline() takes,
and the CLI's JSON contract and exit codes."""

from __future__ import annotations

import collections
import copy
import itertools
import json
import os
import random
import subprocess
import sys
import textwrap
from collections import OrderedDict

import pytest
import torch
from torch import nn

import fxforge
from fxforge.api import prepare
from fxforge.capture import capture
from fxforge.cli import main
from fxforge.errors import EXIT_OK, EXIT_USAGE, FxforgeError
from fxforge.partition import partition
from fxforge.split import (
    PLAN_FILE,
    PLAN_FORMAT,
    PLAN_VERSION,
    SplitPlan,
    cut_options,
    load_plan,
    load_stage,
    plan_split,
    split,
)

# --------------------------------------------------------------------------------------------------
# the DP against brute force


def _brute_force(costs, stages, crossing, allowed):
    """Every choice of stages - 1 allowed cuts: the least (max stage cost, crossing bytes)."""
    n = len(costs)
    best = None
    for cuts in itertools.combinations([j for j in range(1, n) if allowed[j]], stages - 1):
        edges = [0, *cuts, n]
        worst = max(sum(costs[a:b]) for a, b in itertools.pairwise(edges))
        key = (worst, sum(crossing[j] for j in cuts))
        best = key if best is None or key < best else best
    return best


@pytest.mark.parametrize("seed", range(60))
def test_partition_is_optimal_against_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 11)
    stages = rng.randint(1, min(n, 5))
    integer = seed % 2 == 0  # FLOPs and bytes are integers, profiled times floats
    costs = [rng.randint(0, 20) if integer else rng.random() * 10 for _ in range(n)]
    crossing = [rng.randint(0, 50) for _ in range(n + 1)]
    allowed = [rng.random() < 0.8 for _ in range(n + 1)]
    if sum(allowed[1:n]) < stages - 1:
        with pytest.raises(ValueError, match="allowed cut points"):
            partition(costs, stages, crossing=crossing, allowed=allowed)
        return
    result = partition(costs, stages, crossing=crossing, allowed=allowed)
    bottleneck, crossing_bytes = _brute_force(costs, stages, crossing, allowed)
    # prefix differences and slice sums of floats may differ in the last bit; integer costs compare exactly
    assert result.bottleneck == (bottleneck if integer else pytest.approx(bottleneck, rel=1e-12))
    assert result.crossing == crossing_bytes
    assert len(result.cuts) == stages - 1 and all(allowed[j] for j in result.cuts)
    assert list(result.cuts) == sorted(set(result.cuts))
    assert sum(result.stage_costs) == pytest.approx(sum(costs)) and max(result.stage_costs) == result.bottleneck


def test_partition_slack_trades_balance_for_fewer_bytes():
    costs = [10, 10, 10, 10]
    crossing = [0, 0, 100, 0, 0]  # the balanced cut (after 2) is expensive to send
    exact = partition(costs, 2, crossing=crossing)
    assert exact.cuts == (2,) and exact.bottleneck == 20
    relaxed = partition(costs, 2, crossing=crossing, slack=0.5)
    assert relaxed.bottleneck == 30 and relaxed.crossing == 0


def test_partition_refuses_impossible_requests():
    with pytest.raises(ValueError, match="non-empty stages"):
        partition([1, 2], 3)
    with pytest.raises(ValueError, match="at least 1"):
        partition([1, 2], 0)
    with pytest.raises(ValueError, match="negative"):
        partition([1, -2], 1)


def test_partition_is_fast_on_large_graphs():
    import time

    rng = random.Random(0)
    costs = [rng.randint(0, 10**9) for _ in range(50_000)]
    start = time.perf_counter()
    result = partition(costs, 8)
    assert time.perf_counter() - start < 10  # O(S n log n): about a second here; O(n^2 S) would take hours
    assert result.bottleneck <= sum(costs) / 8 + max(costs)


# --------------------------------------------------------------------------------------------------
# crossing bytes


class Skip(nn.Module):
    """A skip connection and a tuple: ``a`` crosses every cut up to the add, and the chunk's tuple may not cross."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.second = nn.Linear(8, 8)
        self.third = nn.Linear(4, 6)

    def forward(self, x):
        a = self.first(x)
        b = torch.relu(a)
        c = self.second(b)
        left, right = (c + a).chunk(2, dim=1)
        return self.third(left * right)


def _naive_crossings(gm, values):
    """Bytes crossing each cut, straight from the definition: values produced at or before it, used after it."""
    # torch.export's input guard (_guards_fn) checks shapes and computes nothing: no stage holds it
    compute = [
        n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module") and n.name != "_guards_fn"
    ]
    order = {n: i for i, n in enumerate(compute)}
    result, allowed = [], []
    for j in range(len(compute) + 1):
        total, ok = 0, 0 < j < len(compute)
        for node in gm.graph.nodes:
            if node.op != "placeholder" and node not in order:
                continue
            produced = node.op == "placeholder" or order[node] < j
            used_later = any(u.op == "output" or (u in order and order[u] >= j) for u in node.users)
            if produced and used_later:
                if isinstance(values[node.name], torch.Tensor):
                    total += values[node.name].numel() * values[node.name].element_size()
                else:
                    ok = False
        result.append(total)
        allowed.append(ok)
    return [n.name for n in compute], result, allowed


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_crossing_bytes_match_the_definition(dialect, capture_as):
    torch.manual_seed(0)
    captured = capture_as(Skip().eval(), (torch.randn(3, 8),), dialect)
    values = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            values[n.name] = super().run_node(n)
            return values[n.name]

    Recorder(captured.graph_module).run(*captured.flat_inputs())
    options = cut_options(captured)
    names, expected, allowed = _naive_crossings(captured.graph_module, values)
    assert options.nodes == names
    n = len(names)  # entries 0 and n are no cut at all: compare the real cuts
    assert options.bytes[1:n] == expected[1:n] and options.allowed[1:n] == allowed[1:n]
    assert not options.allowed[0] and not options.allowed[n]
    assert not all(options.allowed[1:-1])  # the chunk's tuple cannot be sent


def test_plan_never_cuts_where_a_tuple_crosses():
    torch.manual_seed(0)
    captured = capture(Skip().eval(), (torch.randn(3, 8),))
    options = cut_options(captured)
    for stages in range(2, sum(options.allowed) + 2):
        plan = plan_split(captured, stages, "flops")
        cuts = [options.nodes.index(cut.before_node) for cut in plan.cuts]
        assert all(options.allowed[j] for j in cuts)
        assert [cut.bytes for cut in plan.cuts] == [options.bytes[j] for j in cuts]


class ThreeLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        return self.c(torch.relu(self.b(self.a(x))))


def test_split_spec_is_none_when_two_cuts_fall_on_one_module():
    captured = capture(ThreeLayers().eval(), (torch.randn(2, 16),))
    three = plan_split(captured, 3, "flops")
    # b gets a stage of its own: it begins one cut and ends the other, which one split_spec cannot say
    assert [cut.split_spec for cut in three.cuts] == [{"b": "BEGINNING"}, {"b": "END"}]
    assert three.split_spec is None
    assert plan_split(captured, 2, "flops").split_spec is not None


class ViewAcrossTheCut(nn.Module):
    """A view crosses the cut, and its base is written after the cut."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        v = self.a(x)
        w = v[:, :4]
        y = self.b(v)
        v.add_(1.0)  # the original's w sees this write; a stage that received w as a tensor of its own does not
        return y[:, :4] + w


def test_what_crosses_is_sent_contiguous_and_a_split_that_breaks_aliasing_is_refused(tmp_path):
    torch.manual_seed(0)
    captured = capture(ViewAcrossTheCut().eval(), (torch.randn(2, 8),))
    # all the time before b: the only balanced cut sends v and its view w
    profile = {"a": 1.0, "getitem": 10.0, "b": 11.0}
    result = split(captured, 2, "time", profile=profile)
    assert [t.name for t in result.plan.cuts[0].tensors] == ["a", "getitem"]
    sent = result.stages[0](torch.randn(2, 8))
    assert all(t.is_contiguous() for t in sent)  # gloo and NCCL send flat buffers
    assert not result.ok and "max abs error 1" in result.verification.problems[0]
    with pytest.raises(FxforgeError, match=r"do not match the model.*nothing was written") as info:
        split(captured, 2, "time", profile=profile, output_dir=tmp_path / "out")
    assert info.value.exit_code == 1 and not (tmp_path / "out").exists()
    assert split(captured, 2, "flops").ok  # cut before the view: v alone crosses, and the stages are exact


class _AccumulatesThenReadsLater(nn.Module):
    """Adds to a buffer early in its forward and reads it three layers later (a running statistic)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = nn.Linear(8, 64), nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 8)
        self.register_buffer("running", torch.zeros(64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        self.running.add_(h.mean(0))
        return self.d(self.c(self.b(h)) + self.running)


class _ReadsThenWritesLate(nn.Module):
    """Reads a buffer first and writes it last: the next call's first read must see this call's write."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = nn.Linear(8, 64), nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 8)
        self.register_buffer("running", torch.zeros(64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c(self.b(self.a(x) + self.running))
        self.running.mul_(0.5).add_(h.mean(0))
        return self.d(h)


def _three_calls_match(model: nn.Module, directory) -> None:
    """The written stages, reloaded, against the model over three calls (its state carried from one to the next)."""
    loaded = fxforge.load_model(str(directory)).module
    reference = copy.deepcopy(model)  # split restored the model's state: both start from it
    for seed in range(3):
        x = torch.randn(2, 8, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), reference(x), rtol=1e-5, atol=1e-6)  # float32, one op order


def test_a_buffer_written_in_forward_is_sent_to_the_stage_that_reads_it_later(tmp_path):
    """QA: the later stage read its own copy of the buffer, never written: refused as a mismatch, with a hint to
    write the (wrong) stages anyway with --no-verify."""
    torch.manual_seed(0)
    model = _AccumulatesThenReadsLater().eval()
    before = model.running.clone()
    result = split(capture(model, (torch.randn(2, 8),)), 2, "flops", output_dir=tmp_path / "out")
    assert result.ok and torch.equal(model.running, before)  # the user's buffer is left as it was
    assert "running_1" in [t.name for t in result.plan.cuts[0].tensors]  # the read after the write, sent
    _three_calls_match(model, tmp_path / "out")


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_a_buffer_read_before_it_is_written_keeps_its_reads_and_writes_in_one_stage(tmp_path, method):
    torch.manual_seed(0)
    model = _ReadsThenWritesLate().eval()
    captured = capture(model, (torch.randn(2, 8),), method=method)
    options = cut_options(captured)
    first, last = options.nodes.index("add"), options.nodes.index("add_")
    assert not any(options.allowed[first + 1 : last + 1]) and options.allowed[first]
    result = split(captured, 2, "flops", output_dir=tmp_path / "out")
    assert result.ok and any("running is written in place" in note for note in result.plan.notes)
    _three_calls_match(model, tmp_path / "out")


# --------------------------------------------------------------------------------------------------
# real models


@pytest.fixture(scope="module")
def resnet18_captured():
    torchvision = pytest.importorskip("torchvision")
    from model_helpers import randomize_batchnorm

    torch.manual_seed(0)
    model = randomize_batchnorm(torchvision.models.resnet18().eval())
    return capture(model, (torch.randn(1, 3, 224, 224),))


@pytest.mark.slow
def test_resnet18_four_stages_written_verified_and_loadable_with_torch_alone(resnet18_captured, tmp_path):
    captured = resnet18_captured
    result = split(captured, 4, "flops", output_dir=tmp_path / "split")
    plan = result.plan
    assert result.verification is not None and result.verification.ok and result.verification.trials == 16
    assert len(plan.stages) == 4 and plan.imbalance < 1.2
    # the stages hold every parameter once, and their FLOPs add up to the model's
    assert sum(s.params for s in plan.stages) == 11_689_512
    from fxforge.inspect import inspect_graph

    assert sum(s.flops for s in plan.stages) == inspect_graph(captured).totals["flops"]
    assert plan.bottleneck == max(s.cost for s in plan.stages)
    for cut in plan.cuts:
        assert cut.bytes == sum(t.bytes for t in cut.tensors) > 0
        assert all(t.dtype == "float32" and t.shape[0] == 1 for t in cut.tensors)
    # plan.json is plain JSON and reads back as the same plan
    data = json.loads((tmp_path / "split" / PLAN_FILE).read_text())
    assert SplitPlan.from_dict(data) == load_plan(tmp_path / "split") == plan
    # torch alone loads and chains the stages; they compute the model
    x = torch.randn(1, 3, 224, 224)
    values = (x,)
    for stage in plan.stages:
        module = torch.export.load(str(tmp_path / "split" / stage.file)).module()
        values = module(*values)
    with torch.no_grad():
        expected = captured.original(x)
    torch.testing.assert_close(values[0], expected)
    assert isinstance(load_stage(tmp_path / "split", 3), nn.Module)
    # fxforge loads the directory as one tensor out (its model.pt2 gave a 1-tuple), and verify checks the stages
    from fxforge.api import verify_specs

    assert isinstance(fxforge.load_model(tmp_path / "split")(x), torch.Tensor)
    checked = verify_specs(captured.original, str(tmp_path / "split"), ["1x3x224x224"], cases=6)
    assert checked.ok and checked.files["candidate"] == "stage_0.pt2 .. stage_3.pt2, 4 stages chained"
    # torch's own pipeline() splits at the same places from the plan's split_spec
    from torch.distributed.pipelining import SplitPoint, pipeline

    assert plan.split_spec is not None
    spec = {name: SplitPoint[point] for name, point in plan.split_spec.items()}
    pipe = pipeline(captured.original, mb_args=(x,), split_spec=spec)
    assert pipe.num_stages == 4
    for index, stage in enumerate(plan.stages):
        params = sum(p.numel() for p in pipe.get_stage_module(index).parameters())
        assert params == stage.params


def test_resnet50_four_stages_on_meta_balance_flops_within_15_percent():
    captured = prepare("torchvision:resnet50", device="meta")
    result = split(captured, 4, "flops")
    assert result.stages is None and result.plan.on_meta
    assert result.plan.imbalance <= 1.15
    assert any("meta device" in note for note in result.plan.notes)


@pytest.mark.parametrize("balance", ["params", "memory"])
def test_other_balances_balance_their_own_cost(resnet18_captured, balance):
    plan = plan_split(resnet18_captured, 2, balance)
    costs = [s.cost for s in plan.stages]
    assert plan.bottleneck == max(costs) and plan.total_cost == pytest.approx(sum(costs))
    if balance == "params":
        # resnet18 keeps most weights in layer4 and fc: the balanced cut lies deep inside the network
        assert plan.stages[1].first_module.startswith("layer4")
        assert sum(s.param_bytes for s in plan.stages) == plan.total_cost
    else:
        assert all(s.memory_bytes >= s.param_bytes + s.activation_bytes for s in plan.stages)


def test_time_balance_follows_the_profile(resnet18_captured, tmp_path):
    names = [n.name for n in resnet18_captured.graph_module.graph.nodes if n.op == "call_module"]
    computing = [n.name for n in resnet18_captured.graph_module.graph.nodes if n.op not in ("placeholder", "output")]
    # every millisecond in the first two nodes: the only balanced cut is between them; the last two nodes untimed
    times = {name: 0.0 for name in computing[:-2]} | {names[0]: 10.0, names[1]: 10.0}
    profile = {"total_ms": 20.0, "nodes": [{"name": name, "time_ms": ms} for name, ms in times.items()]}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    plan = plan_split(resnet18_captured, 2, "time", profile=path)
    assert plan.cuts[0].before_node == names[1]
    assert [s.time_ms for s in plan.stages] == [10.0, 10.0] and plan.imbalance == 1.0
    assert any(note.startswith("2 of ") and "no time in the profile" in note for note in plan.notes)
    with pytest.raises(FxforgeError, match="pass profile="):
        plan_split(resnet18_captured, 2, "time")
    # with another balance the profile was read and then ignored: the cuts balanced FLOPs
    with pytest.raises(FxforgeError, match=r"^profile applies to balance='time': with balance='flops' the profile"):
        plan_split(resnet18_captured, 2, "flops", profile=path)
    path.write_text(json.dumps({"nodes": [{"name": "elsewhere", "time_ms": 1.0}]}))
    with pytest.raises(FxforgeError, match="none of this graph's nodes"):
        plan_split(resnet18_captured, 2, "time", profile=path)
    # another model's or capture's profile that happens to share a few names (resnet18's for resnet34) is refused
    path.write_text(json.dumps({"nodes": [{"name": names[0], "time_ms": 10.0}, {"name": names[1], "time_ms": 1.0}]}))
    with pytest.raises(FxforgeError, match=f"the profile times only 2 of this graph's {len(computing)} nodes"):
        plan_split(resnet18_captured, 2, "time", profile=path)
    path.write_text(json.dumps({"nodes": [{"name": names[0], "time_ms": "fast"}]}))
    with pytest.raises(FxforgeError, match="not a time >= 0"):
        plan_split(resnet18_captured, 2, "time", profile=path)


transformers = pytest.importorskip("transformers")


def _tiny_gpt2() -> nn.Module:
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64)
    config._attn_implementation = "eager"
    config.use_cache = False
    torch.manual_seed(0)
    return transformers.GPT2Model(config).eval()


def test_small_transformer_in_the_aten_dialect(tmp_path):
    stages = 4  # 2 stages: tests/test_run_pipeline.py splits and runs both
    captured = prepare(_tiny_gpt2(), ["2x16:int64"])
    assert captured.dialect == "aten"
    result = split(captured, stages, "flops", output_dir=tmp_path / "gpt2", cases=8)
    assert result.verification.ok and result.verification.trials == 8
    plan = result.plan
    assert [s.inputs[0].name for s in plan.stages[:1]] == ["input_ids"] and plan.stages[0].inputs[0].dtype == "int64"
    # the attention mask is computed once in stage 0 and sent on while later stages need it
    assert any(len(cut.tensors) > 1 for cut in plan.cuts)
    assert all(cut.pipe_split.startswith("before") for cut in plan.cuts)
    chained = result.chained()
    ids = torch.randint(0, 100, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(chained(ids).last_hidden_state, captured.original(ids).last_hidden_state)


def test_a_dynamic_batch_leaves_few_cuts_and_says_why():
    captured = prepare(_tiny_gpt2(), ["2x16:int64"], check_batch=3)  # torch.export with a symbolic batch
    plan = plan_split(captured, 2, "flops")
    assert any("blocked by values that are not tensors" in note and "sym_size" in note for note in plan.notes)
    assert all(t.dtype for cut in plan.cuts for t in cut.tensors)  # what does cross is tensors


# --------------------------------------------------------------------------------------------------
# a 70B Llama on meta

# Llama-2-70B's widths (grouped-query attention: 8 key/value heads of 64); 16 of its 80 layers in the suite. All 80
# (68,976,648,192 parameters, 5,751 nodes) planned the same way in about 15 s of CPU and 0.9 GB; 16 take a fifth.
_LLAMA_70B = {
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 16,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}


def _llama_params(config: dict) -> int:
    """Llama's parameter count: untied embeddings, attention with grouped key/value heads, gated MLP, RMSNorms."""
    h, i, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = h * config["num_key_value_heads"] // config["num_attention_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
    return 2 * vocab * h + config["num_hidden_layers"] * per_layer + h


_PLAN_70B = textwrap.dedent(
    """
    import json, sys
    import fxforge
    captured = fxforge.prepare("transformers:LlamaForCausalLM", ["1x128:int64"], device="meta",
                               model_kwargs=json.loads(sys.argv[1]))
    plan = fxforge.split(captured, stages=8, balance="flops").plan
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across execve, so a child of a 4 GB pytest worker reports 4 GB
    with open("/proc/self/status") as status:
        peak_kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    print(json.dumps({"maxrss_mib": peak_kib / 1024, "plan": plan.to_dict()}))
    """
)


@pytest.mark.slow
def test_llama_70b_layers_planned_on_meta_into_8_stages_without_their_weights():
    """Imports, building on meta, capture (torch.export), inspect and the plan, in a fresh process whose peak memory
    is its own: far below the 27 GB of these 16 layers' weights in fp32."""
    assert _llama_params({**_LLAMA_70B, "num_hidden_layers": 80}) == 68_976_648_192  # Llama-2-70B's count
    process = subprocess.run(
        [sys.executable, "-c", _PLAN_70B, json.dumps(_LLAMA_70B)], capture_output=True, text=True, timeout=600
    )
    assert process.returncode == 0, process.stderr[-2000:]
    data = json.loads(process.stdout.strip().splitlines()[-1])
    assert data["maxrss_mib"] < 2048, data
    plan = data["plan"]
    assert len(plan["stages"]) == 8 and plan["imbalance"] < 1.10
    assert sum(s["params"] for s in plan["stages"]) == _llama_params(_LLAMA_70B)
    # every stage's memory is shown: two of these layers in fp32 are 6.4 GiB
    assert all(s["memory_bytes"] > 6 * 2**30 for s in plan["stages"])
    assert plan["split_spec"] and "model.layers.10" in plan["split_spec"]


# --------------------------------------------------------------------------------------------------
# the command line


def _run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_json_contract(capsys, tmp_path):
    code, out, _ = _run(capsys, "split", "demo", "--stages", "2", "-o", str(tmp_path / "demo"), "--json")
    assert code == EXIT_OK
    data = json.loads(out)
    plan = data["plan"]
    assert plan["format"] == "fxforge-split" and plan["balance"] == "flops" and len(plan["stages"]) == 2
    assert set(plan["stages"][0]) >= {"nodes", "params", "param_bytes", "flops", "activation_bytes", "memory_bytes"}
    assert set(plan["cuts"][0]) >= {"tensors", "bytes", "split_spec", "pipe_split"}
    assert data["verification"]["ok"] and data["files"][0] == PLAN_FILE
    assert sorted(os.listdir(tmp_path / "demo")) == sorted(data["files"])


def test_cli_tables(capsys):
    code, out, _ = _run(capsys, "split", "demo", "--stages", "3")
    assert code == EXIT_OK
    assert "3 stages, balanced by flops" in out and "imbalance" in out and "verified" in out
    # one stage is singular (it said "1 stages" and "the 1 stage chained in one process match")
    code, out, _ = _run(capsys, "split", "demo", "--stages", "1", "--cases", "1")
    assert code == EXIT_OK
    assert "1 stage, balanced by flops" in out and "verified: the single stage matches the model" in out
    # a split not compared with the model says so
    code, out, _ = _run(capsys, "split", "demo", "--stages", "2", "--no-verify")
    assert code == EXIT_OK and "not verified (--no-verify)" in out and "verified:" not in out


class SizeKeptToTheEnd(nn.Module):
    """``x.size(0)``, a Python int, is alive from the first node to the last: no cut is possible."""

    def forward(self, x):
        batch = x.size(0)
        return torch.relu(x).reshape(batch, -1)


def test_too_many_stages_for_the_possible_cuts_says_how_many_in_good_english():
    captured = capture(SizeKeptToTheEnd(), (torch.randn(2, 3, 4),))
    with pytest.raises(FxforgeError, match=r"can be cut in only 0 places") as info:
        plan_split(captured, 2)
    assert info.value.hint == "at most 1 stage"  # it said "at most 1 stages"


def test_force_replaces_an_earlier_split_or_an_empty_directory_never_a_project(capsys, tmp_path):
    # --force used to delete whatever -o named: a project folder with .git and sources went with it
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / "src").mkdir()
    (project / "src" / "main.py").write_text("x\n")
    args = ["split", "demo", "--stages", "2", "--no-verify", "--force", "-o"]
    code, out, err = _run(capsys, *args, str(project))
    assert code == EXIT_USAGE and "replacing it would delete files fxforge did not write" in out + err
    assert (project / "src" / "main.py").read_text() == "x\n" and (project / ".git").is_dir()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _run(capsys, *args, str(empty))[0] == EXIT_OK and (empty / PLAN_FILE).is_file()
    (empty / "notes.txt").write_text("an earlier split is replaced whole, whatever was added to it")
    assert _run(capsys, *args, str(empty))[0] == EXIT_OK and not (empty / "notes.txt").exists()


def test_a_stage_file_that_is_not_the_plans_stage_is_refused_by_name(tmp_path):
    # swapped stage files ran and failed deep in the schedule with "KeyError: 2"
    torch.manual_seed(0)
    captured = capture(ThreeLayers().eval(), (torch.randn(2, 16),))
    directory = tmp_path / "three"
    split(captured, 3, "flops", output_dir=directory, verify_stages=False)
    assert isinstance(load_stage(directory, 1), nn.Module)  # the written files match their plan
    (directory / "stage_0.pt2").rename(tmp_path / "stage_0.pt2")
    (directory / "stage_1.pt2").rename(directory / "stage_0.pt2")
    (tmp_path / "stage_0.pt2").rename(directory / "stage_1.pt2")
    plan = load_plan(directory)
    with pytest.raises(FxforgeError) as info:
        load_stage(directory, 1)
    expected = (
        f"stage_1.pt2 does not match stage 1 of plan.json (it takes x 2x16 float32; the plan says "
        f"{plan.stages[1].inputs[0].name} 2x16 float32)"
    )
    assert info.value.message == expected and "swapped" in info.value.hint


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--stages", "0"], "0 is not in the range x>=1"),
        (["--stages", "100000"], "more than the graph's"),
        (["--stages", "2", "--balance", "speed"], "'speed' is not one of"),
        (["--stages", "2", "--balance", "time"], "needs node times: pass --profile"),
        (["--stages", "2", "--profile", "/nonexistent/profile.json", "--balance", "time"], "cannot read profile"),
        # a profile with another balance was read and then ignored: the cuts balanced FLOPs
        (["--stages", "2", "--profile", "/nonexistent/profile.json"], "--profile applies to --balance time"),
        (["--stages", "2", "--profile", "p.json", "--balance", "memory"], "with --balance memory the profile would"),
        # silently ignored before: the stages were not verified, on 64 cases or any
        (["--stages", "2", "--no-verify", "--cases", "64"], "--cases has no effect with --no-verify"),
    ],
)
def test_cli_bad_input_exits_2(capsys, args, needle):
    code, out, err = _run(capsys, "split", "demo", *args)
    assert code == EXIT_USAGE and needle in out + err


def test_cli_meta_plan_writes_only_the_plan(capsys, tmp_path):
    out_dir = tmp_path / "meta"
    args = ["split", "torchvision:resnet18", "--device", "meta", "--stages", "2", "-o", str(out_dir)]
    code, out, _ = _run(capsys, *args)
    assert code == EXIT_OK and os.listdir(out_dir) == [PLAN_FILE]
    assert "planned only" in out
    assert load_plan(out_dir).on_meta
    # verify says what the directory is, not "holds no model: is it an fxforge output?" (QA)
    code, _, err = _run(capsys, "verify", "torchvision:resnet18", str(out_dir))
    assert code != EXIT_OK and "the plan was made on the meta device" in err


def test_load_plan_errors(tmp_path):
    with pytest.raises(FxforgeError, match="is not a directory"):
        load_plan(tmp_path / "missing")
    with pytest.raises(FxforgeError, match=r"has no plan\.json"):
        load_plan(tmp_path)
    (tmp_path / PLAN_FILE).write_text("{not json")
    with pytest.raises(FxforgeError, match="is corrupt"):
        load_plan(tmp_path)
    (tmp_path / PLAN_FILE).write_text(json.dumps({"format": PLAN_FORMAT, "version": PLAN_VERSION}))
    with pytest.raises(FxforgeError, match="is corrupt: it has no 'stages'"):
        load_plan(tmp_path)


@pytest.mark.parametrize(
    "structure",
    [
        {"bogus": 1},
        {"tuple": ["tensor", "tensor"]},
        {"namedtuple": "Out", "items": ["tensor"]},  # QA: KeyError 'fields' read as a MISMATCH
        {"dict": [["a", "tensor"], ["a", {"value": 1}]]},
    ],
)
def test_an_edited_output_structure_is_a_corrupt_plan(tmp_path, structure):
    """QA: {"bogus": 1} as output_structure read as a MISMATCH (the stages' run failed: "'NoneType' object is not
    iterable"), and fxforge.load_model returned a tuple where the split returns a tensor."""
    out = tmp_path / "split"
    split(prepare("demo"), stages=2, output_dir=out, verify_stages=False)
    data = json.loads((out / PLAN_FILE).read_text())
    assert data["output_structure"] == "tensor"
    data["output_structure"] = structure
    (out / PLAN_FILE).write_text(json.dumps(data))
    problem = "(not an output structure|holds 2 tensors|fields|key twice)"
    with pytest.raises(FxforgeError, match=rf"plan\.json is corrupt: .*{problem}"):
        load_plan(out)


def test_device_auto_takes_gpus_only_when_every_local_stage_gets_one(monkeypatch):
    # the documented rule: one GPU per stage with NCCL when the machine has one for each, else the CPU with gloo
    # (auto used to pick CUDA on any GPU and then refuse 4 stages on a 1-GPU machine the user never asked to use)
    from fxforge import distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert distributed._backend_and_device("auto", 0, 2) == ("gloo", torch.device("cpu"))
    assert distributed._backend_and_device("auto", 0, 1) == ("nccl", torch.device("cuda", 0))
    assert distributed._backend_and_device("cpu", 0, 1) == ("gloo", torch.device("cpu"))
    assert distributed._backend_and_device("cuda", 1, 2) == ("nccl", torch.device("cuda", 0))  # asked: used
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(FxforgeError, match="sees no GPU"):
        distributed._backend_and_device("cuda", 0, 1)


def test_gpu_stages_compute_float32_in_float32():
    # cuDNN runs float32 convs in TF32 by default on Ampere and later: a resnet18 stage on an H200 then missed the
    # float32 check by 100x; the ranks turn it off (settable without a GPU, so checked here)
    from fxforge import distributed

    cudnn, cublas = torch.backends.cudnn, torch.backends.cuda.matmul
    new_api = hasattr(cudnn, "conv") and hasattr(cudnn.conv, "fp32_precision")
    saved = (cudnn.conv.fp32_precision, cublas.fp32_precision) if new_api else (cudnn.allow_tf32, cublas.allow_tf32)
    try:
        if new_api:
            cudnn.conv.fp32_precision = cublas.fp32_precision = "tf32"
            distributed.full_fp32_on_gpu()
            assert (cudnn.conv.fp32_precision, cublas.fp32_precision) == ("ieee", "ieee")
        else:
            cudnn.allow_tf32 = cublas.allow_tf32 = True
            distributed.full_fp32_on_gpu()
            assert not cudnn.allow_tf32 and not cublas.allow_tf32
    finally:
        if new_api:
            cudnn.conv.fp32_precision, cublas.fp32_precision = saved
        else:
            cudnn.allow_tf32, cublas.allow_tf32 = saved


def test_stages_that_cost_nothing_are_noted():
    """More stages than nodes with FLOPs gave stages of one ReLU or add, silently (resnet18 in 69 stages: 48)."""
    plan = split(prepare("demo"), stages=8, verify_stages=False).plan
    idle = [stage for stage in plan.stages if stage.cost == 0]
    assert idle and any(note.startswith(f"{len(idle)} of 8 stages cost nothing by flops") for note in plan.notes)
    assert not any("cost nothing" in note for note in split(prepare("demo"), stages=2).plan.notes)


class _TiedHead(nn.Module):
    """GPT-2's pattern: the output layer reuses the embedding's weight."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.body = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.body(self.embed(ids)))


def test_a_weight_two_stages_hold_is_counted_in_both():
    """--balance params charged a tied weight to its first stage only: GPT-2's plan said imbalance 1.09 where the
    stages' own weights were 1.5 apart."""
    captured = capture(_TiedHead().eval(), (torch.randint(0, 50, (2, 4)),))
    plan = split(captured, stages=2, balance="params", verify_stages=False).plan
    assert [stage.cost for stage in plan.stages] == [float(stage.param_bytes) for stage in plan.stages]
    assert plan.imbalance == pytest.approx(max(s.cost for s in plan.stages) / (sum(s.cost for s in plan.stages) / 2))
    assert any("used by more than one stage (tied weights)" in note for note in plan.notes)


def test_gpt2s_tied_embedding_is_counted_in_each_stage_that_holds_it():
    """The QA case: GPT-2's output layer reuses its token embedding; split by params, the last stage holds it too."""
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=1000, n_positions=64)
    config._attn_implementation, config.use_cache = "eager", False
    torch.manual_seed(0)
    captured = prepare(transformers.GPT2LMHeadModel(config).eval(), ["2x16:int64"])
    plan = split(captured, 3, "params", verify_stages=False).plan
    assert [stage.cost for stage in plan.stages] == [float(stage.param_bytes) for stage in plan.stages]
    embedding_bytes = 1000 * 64 * 4
    assert sum(stage.param_bytes for stage in plan.stages) >= plan.total_cost >= embedding_bytes * 2
    assert any("used by more than one stage (tied weights)" in note for note in plan.notes)


class _TrainingNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def test_split_leaves_the_users_model_in_its_mode():
    """QA: the stages share their submodules with the user's model, and stage.eval() switched a model in training
    to eval mode (its BatchNorm then used running statistics), silently."""
    model = _TrainingNet().train()
    captured = capture(model, (torch.randn(2, 3, 16, 16),))
    split(captured, 2)
    assert all(module.training for module in model.modules())


class _AcrossTheBatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        return self.b(h - h.mean(0))  # batch statistics: each sample's output depends on the others


def test_split_notes_a_model_whose_output_mixes_samples():
    """QA: split wrote and verified such a model without a word; every run-pipeline with microbatches then failed.
    Split now says so where it can tell (a batch of two examples against each on its own)."""
    torch.manual_seed(0)
    plan = split(capture(_AcrossTheBatch().eval(), (torch.randn(3, 4),)), stages=2).plan
    assert any("--microbatches 1" in note and "joined along dim 0" in note for note in plan.notes)
    per_sample = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)).eval()
    assert not any("--microbatches" in note for note in split(capture(per_sample, (torch.randn(3, 4),)), 2).plan.notes)
    # dropout in training mode: outputs differ run to run, which says nothing about mixing samples
    dropping = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 4)).train()
    plan = split(capture(dropping, (torch.randn(3, 4),)), 2, verify_stages=False).plan
    assert not any("--microbatches" in note for note in plan.notes)


def test_resnet18_is_judged_per_sample(resnet18_captured):
    """A real conv net in eval mode: its BatchNorm uses running statistics, so no microbatch note."""
    plan = split(resnet18_captured, stages=2, verify_stages=False).plan
    assert not any("--microbatches" in note for note in plan.notes)


def test_the_pipe_split_hint_never_names_a_line_outside_the_models_call(capsys):
    """QA: for a model defined in fxforge's own files (demo), the recorded line was the CLI's caller, click's."""
    from fxforge.cli import main

    assert main(["split", "demo", "--stages", "3", "--no-verify", "--json"]) == 0
    hints = [cut["pipe_split"] for cut in json.loads(capsys.readouterr().out)["plan"]["cuts"]]
    assert hints and not any("click" in hint for hint in hints)


def test_a_model_that_cannot_be_checked_is_not_said_to_mismatch_its_split(tmp_path):
    """QA: a model whose output does not depend on its input: split said "the split stages do not match the
    model", where export says CANNOT VERIFY."""

    class Constant(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.b(self.a(torch.ones_like(x)))

    captured = capture(Constant(), [torch.randn(2, 4)])
    with pytest.raises(FxforgeError, match="cannot verify the split stages: the model itself cannot be checked"):
        split(captured, stages=2, output_dir=tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_a_graph_that_computes_nothing_is_not_offered_zero_stages():
    """QA: a model returning its input was told "at most 0 stages"."""

    class Passthrough(nn.Module):
        def forward(self, x):
            return x

    captured = capture(Passthrough(), (torch.randn(2, 4),))
    with pytest.raises(FxforgeError) as raised:
        plan_split(captured, 2)
    assert "0 compute nodes" in str(raised.value)
    assert raised.value.hint == "a graph that computes nothing cannot be split"


class _TwoHeadsBody(nn.Module):
    """A body and two heads; the tests' subclasses return the heads in the container they test."""

    def __init__(self):
        super().__init__()
        self.body, self.out, self.aux = nn.Linear(4, 8), nn.Linear(8, 3), nn.Linear(8, 2)


@pytest.mark.parametrize("container", [dict, OrderedDict])
def test_a_split_directory_of_a_model_returning_a_dict_verifies_against_the_model(tmp_path, container):
    """QA: the directory's model.pt2 returns the output tensors flat; verify read MISMATCH, "expected a mapping, got
    tuple", for a model returning a dict (torchvision's segmentation models return an OrderedDict)."""
    from fxforge.api import verify_specs

    class TwoHeads(_TwoHeadsBody):
        def forward(self, x):
            h = torch.relu(self.body(x))
            return container(out=self.out(h), aux=self.aux(h))

    class Swapped(TwoHeads):  # the same tensors under each other's keys
        def forward(self, x):
            h = torch.relu(self.body(x))
            return container(out=self.aux(h), aux=self.out(h))

    model = TwoHeads().eval()
    split(capture(model, (torch.randn(2, 4),)), stages=2, output_dir=tmp_path / "s")
    result = verify_specs(model, str(tmp_path / "s"), ["2x4"])
    assert result.ok and result.files == {"candidate": "stage_0.pt2 .. stage_1.pt2, 2 stages chained"}
    assert verify_specs(str(tmp_path / "s"), model, ["2x4"]).ok  # the directory as the reference too
    loaded = fxforge.load_model(tmp_path / "s")(torch.randn(2, 4))
    assert type(loaded) is container and list(loaded) == ["out", "aux"]
    # and still a real check: a model whose heads differ is a mismatch, and so is one whose keys are swapped (QA:
    # the flat outputs were put into the other side's structure by position, and that read OK)
    assert not verify_specs(TwoHeads().eval(), str(tmp_path / "s"), ["2x4"]).ok
    swapped = Swapped().eval()
    swapped.load_state_dict(model.state_dict())
    assert not verify_specs(swapped, str(tmp_path / "s"), ["2x4"]).ok


_Heads = collections.namedtuple("_Heads", ["out", "aux"])
_Nested = collections.namedtuple("_Nested", ["out", "rest"])


def test_a_model_returning_a_namedtuple_splits_and_returns_it():
    """QA: split refused a model returning a namedtuple ("not a tensor"): symbolic_trace records the namedtuple's
    construction as a call in the graph, which was taken for an output value. The call only builds the output:
    the stages send its tensors, and the chained stages return the namedtuple again."""

    class TwoHeads(_TwoHeadsBody):
        def forward(self, x):
            h = torch.relu(self.body(x))
            return _Heads(self.out(h), self.aux(h))

    model = TwoHeads().eval()
    result = split(capture(model, (torch.randn(2, 4),)), stages=2)
    assert result.verification is not None and result.verification.ok
    assert all(isinstance(stage.graph, torch.fx.Graph) for stage in result.stages)
    last = result.stages[-1]
    assert not any(node.target is _Heads for node in last.graph.nodes)  # the stages return tensors only
    x = torch.randn(5, 4)
    got, expected = result.chained()(x), model(x)
    assert type(got) is _Heads and torch.equal(got.out, expected.out) and torch.equal(got.aux, expected.aux)

    class NestedHeads(TwoHeads):  # QA: the list inside came back as fx's immutable_list
        def forward(self, x):
            h = torch.relu(self.body(x))
            return _Nested(self.out(h), [self.aux(h), {"h": h}])

    got = split(capture(NestedHeads().eval(), (torch.randn(2, 4),)), stages=2).chained()(x)
    assert type(got) is _Nested and type(got.rest) is list and type(got.rest[1]) is dict


def test_verify_of_a_split_directory_checks_its_stages_not_the_unsplit_copy(tmp_path):
    """`fxforge verify MODEL SPLIT_DIR` compared model.pt2, the unsplit copy kept for run-pipeline's check, so a
    damaged stage read OK. The stages themselves run chained now: a stage whose weights changed is a mismatch
    while model.pt2 still matches."""
    from fxforge.api import verify_specs

    model = ThreeLayers().eval()
    split(capture(model, (torch.randn(2, 16),)), stages=2, output_dir=tmp_path / "s")
    assert verify_specs(model, str(tmp_path / "s"), ["2x16"]).ok
    stage = torch.export.load(tmp_path / "s" / "stage_1.pt2")
    weight = next(name for name in stage.state_dict if name.endswith("weight"))
    with torch.no_grad():
        stage.state_dict[weight].add_(0.5)
    torch.export.save(stage, tmp_path / "s" / "stage_1.pt2")
    damaged = verify_specs(model, str(tmp_path / "s"), ["2x16"])
    assert not damaged.ok and "stage_1.pt2" in damaged.files["candidate"]
    x = torch.randn(2, 16)
    unsplit = fxforge.load_model(tmp_path / "s")  # model.pt2, the unsplit copy: intact, and one tensor out (QA)
    assert unsplit.file == "model.pt2" and torch.allclose(unsplit(x), model(x))


WRAPPED_HELPER_MODEL = """
from torch import nn


def helper(x):
    if x.sum() > 0:  # a branch on a value: capture keeps the helper as one call
        return x * 2
    return x - 1


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre, self.mid, self.post = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.post(self.mid(helper(self.pre(x))))
"""


def test_a_stage_calling_a_wrapped_helper_is_pickled_so_that_it_loads(tmp_path, monkeypatch):
    """QA: the stage that does not export (it calls the helper) was pickled plainly, and torch.load traced into the
    helper when it rebuilt the stage: split aborted with "cannot read stage_1.pt ... is the file corrupt?". And a
    pickled stage inspected on its own could not find the model's classes (the copy is source/net.py)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(WRAPPED_HELPER_MODEL)
    assert main(["split", "net.py:Net", "-i", "2x8", "--stages", "2", "-o", "out"]) == EXIT_OK
    pickled = sorted(p.name for p in (tmp_path / "out").glob("stage_*.pt"))
    assert pickled, "the helper's stage exports after all: this test no longer covers a pickled stage"
    (tmp_path / "net.py").unlink()  # the copy in source/ is all there is
    code = subprocess.run(
        [sys.executable, "-m", "fxforge", "inspect", f"out/{pickled[0]}", "--trust-pickle", "-i", "2x8", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert code.returncode == EXIT_OK, code.stderr


class TakesKeywords(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x, **kwargs):  # transformers' forwards end in **kwargs (GPT-Neo)
        return self.b(torch.relu(self.a(x)))


def test_a_forward_taking_kwargs_splits_and_its_files_load(tmp_path):
    """QA: the **kwargs placeholder was counted as a stage input (`_kwargs scalar`): the written stage files were
    refused as "renamed, swapped or mixed from two splits", and without -o the chained stages read MISMATCH."""
    captured = capture(TakesKeywords().eval(), (torch.randn(1, 8),))
    result = split(captured, 2, "flops", output_dir=tmp_path / "split")
    assert result.verification is not None and result.verification.ok
    assert [t.name for t in result.plan.stages[0].inputs] == ["x"]
    assert isinstance(load_stage(tmp_path / "split", 0), nn.Module)


def test_a_split_directory_is_captured_as_its_unsplit_program(tmp_path):
    """QA: `fxforge inspect SPLIT_DIR` (and graph, export) was refused as "a TorchScript module": the wrapper
    that gives model.pt2's flat outputs their structure back was taken for TorchScript."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    split(capture(model, (torch.randn(1, 8),)), 2, "flops", output_dir=tmp_path / "split")
    captured = capture(fxforge.load_model(tmp_path / "split"))
    assert captured.dialect == "aten"
    assert sum(n.op == "call_function" and "linear" in str(n.target) for n in captured.graph_module.graph.nodes) == 2
    # splitting it again read the new stages' outputs as a tuple of the model's tensor (MISMATCH): refused, named
    with pytest.raises(FxforgeError, match="a split directory cannot be split again"):
        split(captured, 2, "flops")


class ReturnsNothing(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        self.a(x)
        return None


def test_a_program_that_fails_to_save_leaves_no_partial_pt2(tmp_path):
    """QA: torch.export.save of a stage (and of the unsplit model) returning no tensor raised after writing part of
    its archive; the pickled fallbacks were written beside the partial stage_0.pt2 and model.pt2, and loading the
    directory read the partial model.pt2: "cannot read exported program .../model.pt2 ... is the file corrupt?"."""
    model = ReturnsNothing().eval()
    with pytest.raises(FxforgeError, match="returns None on every case"):  # nothing to verify: said, not "verified"
        split(capture(model, (torch.randn(2, 4),)), 1, "flops", output_dir=tmp_path / "refused")
    split(capture(model, (torch.randn(2, 4),)), 1, "flops", output_dir=tmp_path / "split", verify_stages=False)
    names = sorted(p.name for p in (tmp_path / "split").iterdir())
    plan = json.loads((tmp_path / "split" / PLAN_FILE).read_text())
    assert plan["stages"][0]["file"] == "stage_0.pt"
    assert "stage_0.pt2" not in names and "model.pt2" not in names, names
    assert "stage_0.pt" in names and "model.pt" in names


class _TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("called_before", [True, False])
def test_split_leaves_the_callers_noise_stream_where_it_was(tmp_path, called_before):
    """split runs the caller's graph (stage examples, verification): insert_after's noise module kept its generator
    bound (preserved_state) but advanced, so the caller's next call drew other noise than without the split."""
    from fxforge.passes import apply_pass

    torch.manual_seed(0)
    graph = capture(_TwoLinears().eval(), (torch.randn(2, 8),)).graph_module
    options = {"select": "kind:relu", "insert": "noise", "sigma": 0.5, "seed": 0}
    noisy = apply_pass(graph, "insert_after", options).graph_module.eval()
    x = torch.ones(2, 8)
    if called_before:
        noisy(x)  # its generator exists, and has drawn
    untouched = copy.deepcopy(noisy)  # the same stream, never split
    captured = prepare(noisy, "2x8")
    prepare(untouched, "2x8")  # (capture's check runs each alike)
    result = split(captured, 2, "flops")
    assert not result.verification.ok  # noise cannot be verified; the point is what it leaves behind
    with pytest.raises(FxforgeError):  # refused after writing and running the stages
        split(captured, 2, "flops", output_dir=tmp_path / "out")
    assert torch.equal(noisy(x), untouched(x))
    assert torch.equal(noisy(x), untouched(x))  # and the stream goes on alike

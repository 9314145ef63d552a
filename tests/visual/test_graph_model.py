"""The graph model: node counts, module nesting, diff classification (fold_bn on resnet18 in both dialects),
the first diverging node of a broken pass, profiles, and pages that need no network."""

from __future__ import annotations

import re

import pytest
import torch

import fxforge
from fxforge.errors import FxforgeError
from fxforge.visual import diff_model, graph_model
from fxforge.visual.graph import default_depth, visible_count
from fxforge.visual.page import describe, graph_document
from fxforge.visual.render import load_output_dir


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_every_node_and_edge_of_the_graph_is_in_the_model(resnet_captures, dialect):
    captured = resnet_captures[dialect]
    model = graph_model(captured)
    names = [n.name for n in captured.graph_module.graph.nodes]
    assert [n["n"] for n in model["nodes"]] == names
    edges = sum(len(n.all_input_nodes) for n in captured.graph_module.graph.nodes)
    assert len(model["edges"]) == edges
    convs = [n for n in model["nodes"] if n["c"] == "conv"]
    assert len(convs) == 20 and all(n.get("f", 0) > 0 and n.get("sh") for n in convs)
    assert sum(n.get("f", 0) for n in model["nodes"]) == fxforge.inspect_graph(captured).totals["flops"]


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_modules_nest_as_the_model_does(resnet_captures, dialect):
    model = graph_model(resnet_captures[dialect])
    paths = {m["path"]: m for m in model["modules"]}
    block = paths["layer2.0"]
    assert block["type"] == "BasicBlock" and model["modules"][block["parent"]]["path"] == "layer2"
    assert block["depth"] == 2 and paths["layer2"]["parent"] == -1
    index = model["modules"].index(paths["layer2.0.downsample"])
    members = [n for n in model["nodes"] if n["m"] == index and not n.get("h")]
    assert {n["c"] for n in members} >= {"conv", "norm"}
    # a parent counts its children's nodes and parameters
    assert paths["layer2"]["nodes"] == sum(paths[f"layer2.{i}"]["nodes"] for i in (0, 1))
    assert paths["layer2"]["p"] == sum(p.numel() for p in resnet_captures["torch"].original.layer2.parameters())


def test_a_large_model_opens_collapsed_and_a_small_one_open(resnet_captures):
    model = graph_model(resnet_captures["aten"])
    depth = default_depth(model, budget=40)
    assert visible_count(model, depth) <= 40 < visible_count(model, depth + 1)
    assert default_depth(model, budget=10_000) == max(m["depth"] for m in model["modules"])


def test_source_lines_point_at_the_users_code(resnet_captures):
    aten = graph_model(resnet_captures["aten"])
    conv = next(n for n in aten["nodes"] if n["c"] == "conv")
    assert conv["src"]["exact"] and conv["src"]["file"].endswith("torchvision/models/resnet.py") and conv["src"]["code"]
    torch_model = graph_model(resnet_captures["torch"])
    add = next(n for n in torch_model["nodes"] if n["n"] == "add")
    assert add["src"]["fn"] == "BasicBlock.forward" and not add["src"]["exact"]


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_fold_bn_diff_names_every_change_and_its_pass(resnet_captures, dialect):
    captured = resnet_captures[dialect]
    result = fxforge.optimize(captured, ["fold_bn"])
    model = diff_model(captured, result.pipeline.graph_module, passes=["fold_bn"])
    removed = [n for n in model["nodes"] if n.get("st") == "removed"]
    changed = [n for n in model["nodes"] if n.get("st") == "changed"]
    assert model["counts"]["removed"] == len([n for n in removed if not n.get("h")]) > 0  # drawn ones
    assert all(n["c"] == "norm" or n["op"] in ("get_attr", "call_function") for n in removed)
    assert len([n for n in removed if n["c"] == "norm"]) == 20
    assert all(n.get("ps") == "fold_bn" for n in removed + changed)
    assert len([n for n in changed if n["c"] == "conv"]) == 20
    # the relu after a folded batch norm reads the same value as before: unchanged
    unchanged = {n["n"] for n in model["nodes"] if n.get("st") == "unchanged"}
    assert any("relu" in name for name in unchanged)
    rewritten = {n.name for n in result.pipeline.graph_module.graph.nodes}
    assert {n["n"] for n in model["nodes"] if n.get("st") != "removed"} == rewritten
    # the header counts the nodes of both graphs and totals the rewritten one: it says so (it read like one graph)
    header = describe(model)
    assert "nodes of both graphs" in header and "after the passes: " in header
    assert f"{sum(p.numel() for p in result.pipeline.graph_module.parameters()):,} parameters" in header


def test_a_diff_against_a_rewrite_of_the_other_dialect_captures_the_original_again(resnet_captures):
    """The CLI's graph --diff captured the model in the rewritten graph's dialect; the API refused instead."""
    rewritten = fxforge.optimize(resnet_captures["aten"], ["fold_bn"], verify=False)
    model = fxforge.diff_html(resnet_captures["torch"], rewritten).model
    statuses = {n.get("st") for n in model["nodes"]}
    assert {"removed", "unchanged"} <= statuses  # batch norms folded away, the rest matched node for node
    assert sum(n.get("st") == "unchanged" for n in model["nodes"]) > 20
    assert resnet_captures["torch"].record.dialect == "torch"  # the caller's capture is left as it was


def test_a_broken_pass_highlights_the_first_diverging_node(resnet_captures, broken_pass):
    captured = resnet_captures["torch"]
    result = fxforge.optimize(captured, ["fold_bn", broken_pass], verify=True)
    assert not result.pipeline.ok
    view = fxforge.diff_html(captured, result)
    divergence = view.model["divergence"]
    assert (
        divergence["pass_name"] == broken_pass and divergence["reference_node"] == "layer2_0_bn1"
    )  # fold_bn ran first: the conv computes bn1
    marked = [n for n in view.model["nodes"] if n.get("div")]
    assert [n["n"] for n in marked] == [divergence["node"]] and marked[0]["st"] == "inserted"


def test_profile_times_colour_their_nodes(resnet_captures):
    captured = resnet_captures["torch"]
    computing = [n.name for n in captured.graph_module.graph.nodes if n.op.startswith("call_")]
    # a profile must time most of the graph's nodes (one of another model is refused: see test_notebook_and_cli)
    rows = [{"name": "conv1", "time_ms": 4.0, "share": 0.4}, {"name": "nosuch", "time_ms": 1.0, "share": 0.1}]
    rows += [{"name": name, "time_ms": 0.0, "share": 0.0} for name in computing[1:]]
    profile = {"total_ms": 10.0, "nodes": rows, "modules": [{"path": "layer1", "time_ms": 2.0, "share": 0.2}]}
    model = graph_model(captured, profile=profile, run_lint=False)
    conv = next(n for n in model["nodes"] if n["n"] == "conv1")
    assert conv["ms"] == 4.0 and conv["share"] == 0.4
    assert model["profile"] == {"total_ms": 10.0, "matched": len(computing), "nodes": len(computing) + 1}
    assert next(m for m in model["modules"] if m["path"] == "layer1")["share"] == 0.2
    with pytest.raises(FxforgeError, match="profile"):
        graph_model(captured, profile={"total_ms": 1}, run_lint=False)


def test_pages_are_self_contained(resnet_captures, tmp_path):
    model = graph_model(resnet_captures["torch"])
    page = graph_document(model, "resnet18")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "default-src 'none'" in page and "<script src" not in page and "<link" not in page
    assert page.count("</script>") == 4  # the model and three inlined scripts, none cut short by the data
    view = fxforge.graph_html(resnet_captures["torch"], tmp_path / "g.html")
    assert (tmp_path / "g.html").read_text() == view.html


class _PartlyFoldable(torch.nn.Module):
    """conv -> bn (folds) -> relu -> bn (stays: no conv before it) -> conv -> bn (folds), plus aranges (fold)."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.post = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.BatchNorm2d(8)
        self.conv2, self.bn2, self.drop = torch.nn.Conv2d(8, 8, 1), torch.nn.BatchNorm2d(8), torch.nn.Dropout(0.1)
        for bn in (self.bn, self.post, self.bn2):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        y = self.post(torch.relu(self.bn(self.conv(x))))
        scale = torch.arange(8, dtype=x.dtype).view(1, 8, 1, 1) * 0.1
        return self.drop(self.bn2(self.conv2(y))) + scale + torch.arange(8, dtype=x.dtype).view(1, 8, 1, 1)


@pytest.mark.parametrize("passes", [["fold_bn"], ["fold_bn", "fold_constants", "remove_dropout"]])
def test_a_diff_of_an_output_directory_labels_the_nodes_the_passes_removed(tmp_path, passes):
    """model.pt2 is a re-export that numbers nodes afresh (the kept ``batch_norm_1`` comes back as
    ``batch_norm``); the saved names are restored, so the diff read from the directory is the in-memory one."""
    torch.manual_seed(0)
    captured = fxforge.capture(_PartlyFoldable().eval(), (torch.randn(2, 3, 16, 16),), method="export")
    result = fxforge.optimize(captured, passes, output_dir=tmp_path / "out", verify=True)
    assert result.pipeline.ok
    reloaded = torch.export.load(str(tmp_path / "out" / "model.pt2")).module()
    assert "batch_norm_1" not in {n.name for n in reloaded.graph.nodes}  # what the restore is for
    graph, saved_passes = load_output_dir(tmp_path / "out")
    assert saved_passes == passes
    from_disk = diff_model(captured, graph, passes=saved_passes, run_inspect=False)
    in_memory = diff_model(
        captured,
        result.pipeline.graph_module,
        steps=[(step.result.name, step.result.graph_module) for step in result.pipeline.steps],
        passes=passes,
        run_inspect=False,
    )

    def changes(model):
        return {n["n"]: (n["st"], n.get("ps")) for n in model["nodes"] if not n.get("h")}

    disk, memory = changes(from_disk), changes(in_memory)
    assert {name: st for name, (st, _) in disk.items()} == {name: st for name, (st, _) in memory.items()}
    assert from_disk["counts"] == in_memory["counts"]
    assert disk["batch_norm"] == ("removed", "fold_bn") and disk["batch_norm_1"] == ("unchanged", None)
    assert disk["conv2d"] == ("changed", "fold_bn")
    if passes == ["fold_bn"]:
        assert disk == memory and disk["batch_norm_2"] == ("removed", "fold_bn")
    else:
        assert {disk[name] for name in ("arange", "arange_1", "mul")} == {("removed", "fold_constants")}
        assert disk["dropout"] == ("removed", "remove_dropout")
        # Provenance keeps one pass per node: remove_dropout re-marked the conv that fold_bn had made compute
        # batch_norm_2, so the directory cannot say which pass removed batch_norm_2 -- it says none, never a wrong one.
        assert {name: value for name, value in disk.items() if value != memory[name]} == {
            "batch_norm_2": ("removed", None)
        }
    # the html page of the directory diff says the same
    view = fxforge.diff_html(captured, tmp_path / "out")
    assert changes(view.model) == disk


def test_a_report_of_a_failing_pass_shows_the_first_diverging_node(resnet_captures, broken_pass, tmp_path):
    captured = resnet_captures["torch"]
    view = fxforge.report(captured, tmp_path / "r.html", passes=["fold_bn", broken_pass], spec="resnet18")
    divergence = view.model["divergence"]
    assert divergence["pass_name"] == broken_pass and divergence["i"] >= 0
    node = view.model["nodes"][divergence["i"]]
    assert node["div"] == 1 and node["st"] == "inserted" and node["ps"] == broken_pass
    assert [n["n"] for n in view.model["nodes"] if n.get("div")] == [node["n"]]
    assert f"first divergence at {node['n']}" in view.html
    assert "failed" in view.html and broken_pass in view.html


class _Flat(torch.nn.Module):
    """A graph with no modules: ``length`` elementwise ops in one forward."""

    def __init__(self, length):
        super().__init__()
        self.length = length

    def forward(self, x):
        for i in range(self.length):
            x = x + 0.5 if i % 3 == 0 else (x * 0.5 if i % 3 == 1 else torch.relu(x))
        return x


def _flat(length):
    return fxforge.capture(_Flat(length), (torch.randn(2, 4),), method="symbolic_trace", check=False)


def test_a_flat_graph_opens_as_boxes_of_consecutive_nodes():
    from fxforge.visual.graph import GROUP_SIZE, OPEN_BUDGET

    model = graph_model(_flat(9_998), run_lint=False)  # + input and output: 10,000 nodes, no module
    groups = model["modules"]
    assert len(groups) == 100 and all(g["g"] and g["depth"] == 1 and g["parent"] == -1 for g in groups)
    assert [g["nodes"] for g in groups] == [GROUP_SIZE] * 100
    assert groups[0]["path"] == "nodes 1-100" and groups[0]["type"] == "x \u2026 relu_32"
    assert all(n["m"] >= 0 for n in model["nodes"])
    # nodes stay in graph order: group k holds the k-th hundred
    assert [n["n"] for n in model["nodes"] if n["m"] == 1][:2] == ["add_33", "mul_33"]
    assert model["depth"] == 0 and visible_count(model, 0) == 100 <= OPEN_BUDGET
    assert "10000 nodes · 0 modules" in graph_document(model, "flat")
    # more than 100 boxes: boxes of boxes
    big = graph_model(_flat(25_000), run_inspect=False, run_lint=False)
    top = [g for g in big["modules"] if g["parent"] == -1]
    assert [g["path"] for g in top] == ["nodes 1-10000", "nodes 10001-20000", "nodes 20001-25002"]
    inner = [g for g in big["modules"] if g["parent"] == 0]
    assert len(inner) == 100 and inner[0]["path"] == "nodes 1-10000.nodes 1-100" and inner[0]["depth"] == 2
    assert big["depth"] == 0 and visible_count(big, 0) == 3
    assert top[0]["nodes"] == 10_000 and sum(g["nodes"] for g in inner) == 10_000


def test_a_module_with_few_direct_nodes_is_not_grouped(resnet_captures):
    model = graph_model(resnet_captures["aten"], run_lint=False)
    assert not any(m.get("g") for m in model["modules"])


def test_removed_nodes_of_a_flat_diff_join_the_box_of_their_neighbours():
    captured = _flat(600)
    rewritten = torch.fx.GraphModule(captured.graph_module, captured.graph_module.graph.__deepcopy__())
    gone = [node for node in rewritten.graph.nodes if node.name in ("relu_50", "relu_150")]
    for node in gone:
        node.replace_all_uses_with(node.args[0])
        rewritten.graph.erase_node(node)
    rewritten.recompile()
    model = diff_model(captured, rewritten, run_inspect=False)
    removed = [n for n in model["nodes"] if n.get("st") == "removed"]
    assert [n["n"] for n in removed] == ["relu_50", "relu_150"]
    for entry in removed:
        group = model["modules"][entry["m"]]
        assert group.get("g") and group["parent"] == -1
        members = [n["n"] for n in model["nodes"] if n["m"] == entry["m"] and n.get("st") != "removed"]
        neighbour = "mul_" + entry["n"].split("_")[1]  # what it read
        assert neighbour in members


def test_the_diff_of_a_quantize_result_names_quantize_for_every_change(resnet_captures):
    captured = resnet_captures["torch"]
    result = fxforge.quantize(captured, "dynamic")
    model = fxforge.diff_html(captured, result).model
    assert model["passes"] == ["quantize (dynamic)"]
    changes = [n for n in model["nodes"] if n.get("st") not in (None, "unchanged")]
    assert model["counts"]["removed"] > 0 and model["counts"]["changed"] > 0
    assert {n.get("ps") for n in changes} == {"quantize (dynamic)"}
    assert len([n for n in changes if n["st"] == "removed" and n["c"] == "norm"]) == 20  # folded into the convs


def test_the_page_header_counts_and_flops_read_naturally():
    """QA: "1 modules" and "0.000111 GFLOPs" (110.66K FLOPs) in the header under a page's title."""
    from fxforge.visual.page import describe

    header = describe({"dialect": "torch", "nodes": [], "modules": [{}], "totals": {"params": 10, "flops": 110_660}})
    assert "1 module ·" in header and "110.66K FLOPs" in header
    big = describe({"dialect": "aten", "nodes": [], "modules": [], "totals": {"flops": 1_820_000_000}})
    assert "1.82G FLOPs" in big


class _LoopOverLayers(torch.nn.Module):
    """A ModuleList whose loop does work of its own between the layers: every edge crosses its border."""

    def __init__(self, count):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(count))
        self.head = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x)) + 1
        return self.head(x)


def test_a_module_a_path_leaves_and_reenters_is_drawn_open_without_a_box(resnet_captures):
    """Drawn as boxes, such modules made ELK take minutes (a 2k-node loop over a ModuleList, every module open)."""
    from fxforge.visual.render import svg_of

    captured = fxforge.capture(_LoopOverLayers(150), (torch.randn(1, 4),), method="symbolic_trace", check=False)
    model = graph_model(captured, run_lint=False)
    marked = {m["path"] for m in model["modules"] if m.get("il")}
    # the layers, whose linears are boxed with the relus and adds around them (test_..._with_the_nodes_around_them),
    # and the last box, which the head interleaves with (the output comes after it)
    assert marked == {"layers", "nodes 401-452"}
    assert not any(m.get("il") for m in graph_model(resnet_captures["torch"], run_lint=False)["modules"])
    # ATen: one ReLU module called after each of a block's two convs
    aten = {m["path"] for m in graph_model(resnet_captures["aten"], run_lint=False)["modules"] if m.get("il")}
    assert "layer1.0.relu" in aten and "layer1.0" not in aten
    pytest.importorskip("py_mini_racer")
    svg = svg_of(graph_model(fxforge.capture(_LoopOverLayers(20), (torch.randn(1, 4),), check=False)), depth=99)
    assert svg.count('class="mod') == 1  # head: a box; the layers' linears sit among the relus and adds
    assert svg.count('class="node') == 20 * 3 + 2 + 2


def _drawn_edges(model, depth):
    """The edges the page lays out with every module up to ``depth`` open: each end is the node or its outermost
    collapsed module (graphview.js's ``representative``), edges inside one box left out."""
    modules, nodes = model["modules"], model["nodes"]

    def representative(i):
        chain, module = [], nodes[i]["m"]
        while module >= 0:
            chain.append(module)
            module = modules[module]["parent"]
        return next((f"m{m}" for m in reversed(chain) if modules[m]["depth"] > depth), f"n{i}")

    drawn = set()
    for source, target, *_ in model["edges"]:
        if not nodes[source].get("h") and not nodes[target].get("h"):
            ends = representative(source), representative(target)
            if ends[0] != ends[1]:
                drawn.add(ends)
    return drawn


def _on_cycles(edges):
    """How many ends of ``edges`` lie on a cycle or after one (a topological sort cannot place them)."""
    waiting, users = {}, {}
    for source, target in edges:
        waiting.setdefault(source, 0)
        waiting[target] = waiting.get(target, 0) + 1
        users.setdefault(source, []).append(target)
    ready = [end for end, count in waiting.items() if not count]
    placed = 0
    while ready:
        placed += 1
        for user in users.get(ready.pop(), []):
            waiting[user] -= 1
            if not waiting[user]:
                ready.append(user)
    return len(waiting) - placed


class _CalledInALoop(torch.nn.Module):
    """A module of two ops of its own, called once per step of a long loop: interleaved, and not one node."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        return torch.relu(x) * self.scale


class _LoopWithACalledModule(torch.nn.Module):
    def __init__(self, count):
        super().__init__()
        self.count, self.act = count, _CalledInALoop()

    def forward(self, x):
        for _ in range(self.count):
            x = self.act(x) + 1
        return x


def test_an_interleaved_modules_nodes_are_boxed_with_the_nodes_around_them():
    """Boxed on their own, the 400 linears of a ModuleList looped over with a relu and an add between them were 4
    boxes that every step of the loop left and re-entered: at depth 1 (those boxes closed, the relus and adds open)
    807 of the 1,203 drawn things lay on cycles, and ELK took 44 s on the 3k-node version (benchmarks/graph_html.py's
    ``loop`` model). Boxed with the relus and adds, in graph order, the boxes are a chain."""
    captured = fxforge.capture(_LoopOverLayers(400), (torch.randn(1, 4),), method="symbolic_trace", check=False)
    model = graph_model(captured, run_inspect=False, run_lint=False)
    modules, nodes = model["modules"], model["nodes"]
    boxes = [i for i, m in enumerate(modules) if m.get("g")]
    assert [modules[i]["path"] for i in boxes[:2]] == ["nodes 1-100", "nodes 101-200"]  # none inside "layers"
    assert all(modules[i]["parent"] == -1 and modules[i]["depth"] == 1 for i in boxes)
    first = [n["n"] for n in nodes if n["m"] == boxes[0]]
    assert first[:4] == ["x", "layers_0", "relu", "add"]  # each linear in the box of the relu it feeds
    linear = next(n for n in nodes if n["n"] == "layers_7")
    assert linear["im"] == "layers" and linear["t"] == "layers.7"  # the page still names its module
    # "layers" keeps its record (type, totals) but draws nothing: no box of its own at any depth
    layers = next(i for i, m in enumerate(modules) if m["path"] == "layers")
    assert modules[layers]["nodes"] == 400 and not any(n["m"] == layers for n in nodes)
    assert visible_count(model, 0) == len(boxes) + 1  # the boxes and the head
    for depth in (1, 2):
        assert _on_cycles(_drawn_edges(model, depth)) == 0
    # closed, only the last box and the head (which the output comes back from) form a cycle
    assert _on_cycles(_drawn_edges(model, 0)) == 2
    # a module of several nodes called in the loop: its nodes are boxed too, and name it
    looped = graph_model(
        fxforge.capture(_LoopWithACalledModule(150), (torch.randn(1, 4),), method="symbolic_trace", check=False),
        run_inspect=False,
        run_lint=False,
    )
    relu = next(n for n in looped["nodes"] if n["n"] == "relu_5")
    assert looped["modules"][relu["m"]].get("g") and relu["im"] == "act"
    assert all(_on_cycles(_drawn_edges(looped, depth)) == 0 for depth in (0, 1))


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        return self.q(x) * self.k(x) + self.v(x)


class _WithAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = _Attention()

    def forward(self, x):
        return torch.relu(self.attn(x))


def test_a_merged_linear_is_drawn_in_the_module_of_the_linears_it_replaces():
    captured = fxforge.capture(_WithAttention().eval(), (torch.randn(2, 4),), method="export", check=False)
    result = fxforge.optimize(captured, ["merge_parallel_linears"])
    model = diff_model(captured, result.pipeline.graph_module, passes=["merge_parallel_linears"])
    modules = model["modules"]
    inserted = [n for n in model["nodes"] if n.get("st") == "inserted" and not n.get("h")]
    assert inserted and all(n["m"] >= 0 and modules[n["m"]]["path"].startswith("attn") for n in inserted)
    merged = next(n for n in inserted if n["c"] == "matmul")
    assert modules[merged["m"]]["path"] == "attn"  # not the top level
    # a module's totals are those of the rewritten graph: the removed linears' FLOPs are not counted again
    attn = next(m for m in modules if m["path"] == "attn")
    assert attn["f"] == sum(n.get("f", 0) for n in model["nodes"] if n.get("st") != "removed")


class _CountsCalls(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count += 1
        return self.lin(x) * self.count + torch.tensor([1.0, 2.0, 3.0, 4.0])


def test_held_values_are_drawn_as_what_they_are():
    """QA: a buffer the forward updates was drawn as a "weight", as was any constant the graph holds."""
    captured = fxforge.capture(_CountsCalls().eval(), (torch.randn(2, 4),), method="export", check=False)
    labels = {n["n"]: n["l"] for n in graph_model(captured, run_lint=False)["nodes"]}
    held = [node for node in captured.graph_module.graph.nodes if node.op == "get_attr"]
    by_target = {str(node.target): labels[node.name] for node in held}
    assert by_target["count"] == "buffer" and by_target["lin.weight"] == by_target["lin.bias"] == "weight"
    others = [label for target, label in by_target.items() if target not in ("count", "lin.weight", "lin.bias")]
    assert others == ["constant"]


class _WithASequential(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())

    def forward(self, x):
        return self.blocks(x) + 1


def test_a_layer_in_a_sequential_points_at_the_users_forward_not_torchs_container():
    """QA: the layers of an nn.Sequential pointed at torch/nn/modules/container.py's Sequential.forward."""
    model = graph_model(fxforge.capture(_WithASequential().eval(), (torch.randn(2, 4),)), run_lint=False)
    sources = {n["n"]: n.get("src") for n in model["nodes"]}
    assert sources["blocks_0"]["fn"] == sources["add"]["fn"] == "_WithASequential.forward"
    assert sources["blocks_0"]["file"].endswith("test_graph_model.py")

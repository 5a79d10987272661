"""Execution graphs: nodes, edges, depth, roll, failures, DOT, rendering.

Oracles: the table's labels, and the data flow of nets whose structure is
known by construction (a residual add reads the block input and the last
layer; a chain reads its predecessor).
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
import unicodedata

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import Recorder
from scio_recorder.graph import ExecutionGraph, GraphError, graph_of
from scio_recorder.graph._dot import INSTALL_DOT, INSTALL_PACKAGE, to_dot
from scio_recorder.graph._nodes import Cluster, Edge, Node
from scio_recorder.models import demo_model, resnet18_cifar, transformer_encoder
from tests.test_properties import cases, oracle


def titles(graph: ExecutionGraph, kind: str | None = None) -> list[str]:
    return [n.title() for n in graph.nodes if kind is None or n.kind == kind]


def edges_by_title(graph: ExecutionGraph) -> set[tuple[str, str]]:
    return {
        (graph.nodes[e.source].title(), graph.nodes[e.target].title())
        for e in graph.edges
    }


def leftovers(net: nn.Module) -> list[str]:
    """Anything the graph pass could leave behind on ``net`` (hooks: counted)."""
    found = []
    for name, module in net.named_modules():
        if "forward" in module.__dict__:
            found.append(f"{name}: forward patched")
        hooks = len(module._forward_hooks) + len(module._forward_pre_hooks)
        if hooks:
            found.append(f"{name}: {hooks} hooks")
    if torch._C._is_torch_function_mode_enabled():
        found.append("a torch function mode is active")
    return found


class Block(nn.Module):
    """``relu(bn(conv(x)) + x)``: a residual block."""

    def __init__(self, c: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)) + x)


class ResNetLike(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(x.mean((2, 3)))


# ---------------------------------------------------------------- structure
def test_chain_nodes_are_the_table_labels_in_order():
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    graph = Recorder(net, input_size=(1, 4)).graph(torch.ones(5, 4))
    assert titles(graph) == [
        "input", "Linear (0): 1-1", "ReLU (1): 1-2", "Linear (2): 1-3", "output"
    ]  # fmt: skip
    assert [(e.source, e.target, e.shape) for e in graph.edges] == [
        (0, 1, (5, 4)), (1, 2, (5, 3)), (2, 3, (5, 3)), (3, 4, (5, 2))
    ]  # fmt: skip
    assert graph.nodes[1].type == "Linear"
    assert graph.nodes[3].shapes == ((5, 2),)


def test_residual_add_has_two_in_edges_and_labels_match_the_table():
    net = ResNetLike().eval()
    rnet = Recorder(net, input_size=(1, 3, 8, 8))
    graph = rnet.graph()
    adds = [i for i, n in enumerate(graph.nodes) if n.name == "add"]
    assert len(adds) == 2
    first = adds[0]
    sources = {graph.nodes[i].title() for i in graph.predecessors(first)}
    assert sources == {"BatchNorm2d (blocks.0.bn): 3-2", "Conv2d (stem): 1-1"}
    for node in graph.nodes:
        if node.kind == "module":
            assert rnet.table[node.label].name == node.name
    # `x.mean((2, 3))` between the blocks and the head is a function node
    assert ("ReLU (blocks.1.relu): 3-6", "mean") in edges_by_title(graph)
    assert ("mean", "Linear (head): 1-3") in edges_by_title(graph)


def test_python_tensor_methods_are_function_nodes():
    class Methods(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(6, 2)

        def forward(self, x):
            y = x.view(x.shape[0], 6) * 2
            return self.fc(y)[0] + torch.cat([y, y], 1).sum()

    graph = Recorder(Methods(), input_size=(3, 2, 3)).graph()
    names = titles(graph, "function")
    assert names == ["view", "mul", "getitem", "cat", "sum", "add"]
    assert graph.nodes[names.index("view") + 1].shapes == ((3, 6),)


def test_module_reused_three_times_rolls_into_one_node():
    class Reuse(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell = nn.Linear(3, 3)

        def forward(self, x):
            for _ in range(3):
                x = torch.tanh(self.cell(x))
            return x

    rnet = Recorder(Reuse(), input_size=(1, 3))
    graph = rnet.graph()
    cells = [n for n in graph.nodes if n.kind == "module"]
    assert [n.label for n in cells] == [(1, 1), (1, 2), (1, 3)]
    rolled = graph.rolled()
    (cell,) = [n for n in rolled.nodes if n.kind == "module"]
    assert cell.calls == 3
    assert cell.label == (1, 1)
    assert "x3" in rolled.to_dot()
    assert rnet.graph(roll=True).nodes == rolled.nodes
    # the recurrence shows as a cycle through tanh
    assert (cell.title(), "tanh") in edges_by_title(rolled)
    assert ("tanh", cell.title()) in edges_by_title(rolled)


def test_shared_activation_across_blocks_has_one_node_per_call():
    relu = nn.ReLU()

    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.act = nn.Linear(2, 2), nn.Linear(2, 2), relu

        def forward(self, x):
            return self.act(self.b(self.act(self.a(x))))

    rnet = Recorder(Two(), input_size=(1, 2))
    graph = rnet.graph()
    acts = [n.label for n in graph.nodes if n.type == "ReLU"]
    assert acts == [row.label for row in rnet.table.calls_of(relu)]
    assert len(acts) == 2


def test_tuple_and_dict_outputs_and_keyword_inputs():
    class HFStyle(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.fc = nn.Linear(4, 3)

        def forward(self, input_ids, attention_mask=None):
            h = self.embed(input_ids) * attention_mask[..., None]
            return {"logits": self.fc(h), "hidden": (h, h.sum(1))}

    ids = torch.randint(0, 10, (2, 5))
    mask = torch.ones(2, 5)
    rnet = Recorder(HFStyle(), input_data={"input_ids": ids, "attention_mask": mask})
    graph = rnet.graph(input_ids=ids, attention_mask=mask)
    assert titles(graph, "input") == ["input_ids", "attention_mask"]
    assert titles(graph, "output") == [
        "output.logits",
        "output.hidden.0",
        "output.hidden.1",
    ]
    flow = edges_by_title(graph)
    assert ("attention_mask", "getitem") in flow
    assert ("Linear (fc): 1-2", "output.logits") in flow
    assert ("sum", "output.hidden.1") in flow


def test_hugging_face_model_with_keyword_inputs():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16,
    )  # fmt: skip
    model = transformers.BertModel(config).eval()
    inputs = {
        "input_ids": torch.randint(0, 50, (2, 6)),
        "attention_mask": torch.ones(2, 6, dtype=torch.long),
    }
    rnet = Recorder(model, input_data=inputs, force_static_flow=False)
    graph = rnet.graph(**inputs)
    outputs = titles(graph, "output")
    assert "output.last_hidden_state" in outputs
    dense = [n for n in graph.nodes if n.name == "encoder.layer.1.output.dense"]
    assert len(dense) == 1
    assert (
        dense[0].label
        == rnet.table.calls_of(model.encoder.layer[1].output.dense)[0].label
    )
    assert leftovers(model) == []


# --------------------------------------------------------- fused kernels kept
def test_transformer_encoder_keeps_its_fused_fast_path(monkeypatch):
    """The graph pass runs the same fused kernel, as often, as a plain pass."""
    net = transformer_encoder().eval()
    rnet = Recorder(net, input_size=(2, 8, 256), force_static_flow=False)
    fused = torch._transformer_encoder_layer_fwd
    calls = []

    def spy(*args, **kwargs):
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(torch, "_transformer_encoder_layer_fwd", spy)
    x = torch.randn(2, 8, 256)
    with torch.no_grad():
        net(x)
        plain = len(calls)
        graph = rnet.graph(x)
    assert plain == 4
    assert len(calls) == 2 * plain
    layers = [n for n in graph.nodes if n.kind == "module"]
    assert [n.type for n in layers] == ["TransformerEncoderLayer"] * 4
    assert [n.label for n in layers] == [(3, 1), (3, 2), (3, 3), (3, 4)]
    assert [e[:2] for e in graph.edges] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]


def test_padding_masked_encoder_nested_region_keeps_the_flow():
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2).eval()
    x = torch.randn(2, 4, 8)
    mask = torch.tensor([[False, False, True, True], [False] * 4])
    rnet = Recorder(
        encoder, input_data=[x], src_key_padding_mask=mask, force_static_flow=False
    )
    with torch.no_grad():
        graph = rnet.graph(x, src_key_padding_mask=mask)
    layers = [i for i, n in enumerate(graph.nodes) if n.kind == "module"]
    assert len(layers) == 2
    assert repr(graph.nodes[layers[0]].shapes[0]) == "(2, <=4, 8)"
    assert graph.predecessors(layers[0]) == [0, 1]  # the input and its mask
    assert graph.predecessors(layers[1]) == [layers[0]]
    assert graph.predecessors(len(graph.nodes) - 1) == [layers[1]]


# ------------------------------------------------------------------ the pass
def test_the_pass_changes_nothing():
    """No record, no output, autograd untouched, nothing left behind."""
    net = ResNetLike()
    rnet = Recorder(net, input_size=(1, 3, 8, 8))
    rnet.record("head")
    x = torch.randn(1, 3, 8, 8)
    rnet(x)
    before = rnet.activations[(1, 3)]
    hooks = leftovers(net)  # the recorder's own hook on `head`
    graph = rnet.graph(torch.randn(2, 3, 8, 8))
    assert rnet.activations[(1, 3)] is before  # the latest pass is still there
    assert not x.requires_grad
    assert all(p.grad is None for p in net.parameters())
    assert leftovers(net) == hooks == ["head: 1 hooks"]
    assert net.training  # the mode is the net's own
    with torch.no_grad():
        assert len(rnet.graph(x).nodes) == len(graph.nodes)
    assert [n.title() for n in graph.nodes if n.recorded] == ["Linear (head): 1-3"]


def test_an_open_scope_is_not_fed_by_the_graph_pass():
    net = nn.Sequential(nn.Linear(2, 2))
    rnet = Recorder(net, input_size=(1, 2))
    rnet.record((1, 1))
    with rnet.scope() as scope:
        net(torch.ones(1, 2))
        rnet.graph()
        net(torch.ones(1, 2))
    assert scope.passes == 2


def test_a_failing_model_gives_the_partial_graph():
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2), nn.Tanh())
    rnet = Recorder(net, input_size=(1, 4))
    net[2] = nn.Linear(5, 2)  # a shape error, as after a bad edit
    with pytest.raises(GraphError) as caught:
        rnet.graph()
    error = caught.value
    assert isinstance(error.__cause__, RuntimeError)
    assert "mat1 and mat2 shapes cannot be multiplied" in str(error)
    assert str(error).startswith("The forward pass raised at Linear (2)")
    graph = error.graph
    assert titles(graph) == ["input", "Linear (0): 1-1", "ReLU (1): 1-2", "Linear (2)"]
    assert graph.failed is graph.nodes[3]
    assert [n.failed for n in graph.nodes] == [False, False, False, True]
    assert graph.predecessors(3) == [2]
    assert 'color="#c00000"' in graph.to_dot()
    assert leftovers(net) == []


def test_a_failure_in_a_container_marks_its_cluster():
    class Bad(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            self.fc(x)
            msg = "checked in Python"
            raise ValueError(msg)

    net = nn.Sequential(nn.Linear(2, 2), Bad())
    rnet = Recorder(nn.Sequential(nn.Linear(2, 2), nn.Identity()), input_size=(1, 2))
    rnet._net = net  # a net that fails where the table's ran
    with pytest.raises(GraphError, match="outside any module call") as caught:
        rnet.graph(torch.ones(1, 2))
    assert caught.value.graph.failed is None
    assert any(c.failed for c in caught.value.graph.clusters.values())


# ---------------------------------------------------------------- depth
def test_depth_folds_calls_into_their_ancestor_with_its_label():
    net = resnet18_cifar(num_classes=10).eval()
    rnet = Recorder(net, input_size=(1, 3, 32, 32))
    graph = rnet.graph()
    shallow = graph.at_depth(1)
    assert titles(shallow, "module") == [
        f"{row.module.__class__.__name__} ({row.name}): 1-{row.label[1]}"
        for row in rnet.table.values()
        if row.label[0] == 1
    ]
    assert titles(shallow, "function") == ["flatten"]  # adds are inside blocks
    assert graph.at_depth(0).nodes[1].label == (0, 1)
    assert len(graph.at_depth(0).nodes) == 3
    leaves = [n for n in graph.nodes if n.kind == "module"]
    assert len(leaves) == sum(
        1 for row in rnet.table.values()
        if row.recordable and not any(True for _ in row.module.children())
    )  # fmt: skip
    assert rnet.graph(depth=2).nodes == graph.at_depth(2).nodes
    with pytest.raises(
        ValueError, match=r"^depth must be None or an int >= 0, got -1$"
    ):
        rnet.graph(depth=-1)


def test_expand_nested_draws_containers_as_clusters():
    rnet = Recorder(ResNetLike(), input_size=(1, 3, 8, 8))
    rnet.record("blocks.1")
    graph = rnet.graph()
    assert [c.title() for c in graph.clusters.values() if c.recorded] == [
        "Block (blocks.1): 2-2"
    ]
    dot = graph.to_dot(expand_nested=True)
    assert 'color="#d4a000"; penwidth=2' in dot
    assert 'label="Sequential (blocks): 1-2"' in dot
    assert 'label="Block (blocks.0): 2-1"' in dot
    assert dot.count("subgraph cluster_") == 3
    assert "subgraph" not in graph.to_dot()


# ------------------------------------------------------------- property
@settings(max_examples=30, deadline=None)
@given(cases(allow_shared=False))
def test_full_depth_nodes_are_the_leaf_calls_and_edges_follow_the_tensors(case):
    """Module nodes are the recordable leaf calls; each edge joins the
    producer and a consumer of the same tensor (checked by value)."""
    net, rnet, x, _ = case
    graph = rnet.graph(x)
    leaf_labels = [
        row.label
        for row in rnet.table.values()
        if row.recordable and not isinstance(row.module, nn.Sequential)
    ]
    assert [n.label for n in graph.nodes if n.kind == "module"] == leaf_labels
    run = oracle(net, x)
    order = [n.label for n in graph.nodes if n.kind == "module"]
    inputs = {}  # label -> the tensor the call read: its predecessor's output
    previous = x
    for label in order:
        inputs[label] = previous
        previous = run.outputs[label]

    def value(node_index, produced):
        node = graph.nodes[node_index]
        if node.kind == "input":
            return x
        if node.kind == "output":
            return run.final
        return run.outputs[node.label] if produced else inputs[node.label]

    for edge in graph.edges:
        torch.testing.assert_close(value(edge.source, True), value(edge.target, False))
        assert edge.shape == tuple(value(edge.source, True).shape)


# ---------------------------------------------------------------- DOT files
def small_nets():
    torch.manual_seed(0)
    return {
        "chain": (nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), (1, 4)),
        "residual": (ResNetLike().eval(), (1, 3, 8, 8)),
        "demo": (demo_model().eval(), (1, 3, 32, 32)),
    }


@pytest.mark.parametrize("name", ["chain", "residual", "demo"])
def test_dot_of_small_nets_matches_the_golden_file(name, expected):
    net, size = small_nets()[name]
    rnet = Recorder(net, input_size=size)
    rnet.record(lambda row: row.label == (1, 2))
    graph = rnet.graph(torch.zeros(size))
    expected(f"graph/{name}.dot", graph.to_dot())
    expected(f"graph/{name}-nested.dot", graph.to_dot(expand_nested=True))


# ------------------------------------------------------------- DOT legend
def legend_rows(dot: str) -> list[str]:
    (line,) = [row for row in dot.splitlines() if row.strip().startswith("legend ")]
    return re.findall(r'<td bgcolor="([^"]+)"[^>]*>([^<]+)</td>', line)


def test_the_dot_legend_explains_the_highlights_it_uses():
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    rnet = Recorder(net, input_size=(1, 4))
    plain = rnet.graph().to_dot()
    assert "legend" not in plain  # nothing highlighted: nothing to explain
    rnet.record("0")
    recorded = rnet.graph().to_dot()
    assert legend_rows(recorded) == [("#ffd966", "recorded (by the selection)")]
    assert 'fillcolor="#ffd966"' in recorded  # the colour the legend names
    assert legend_rows(rnet.graph().to_dot(expand_nested=True)) == legend_rows(recorded)
    net[2] = nn.Linear(5, 2)
    with pytest.raises(GraphError) as caught:
        rnet.graph()
    dot = caught.value.graph.to_dot()
    assert legend_rows(dot) == [
        ("#ffd966", "recorded (by the selection)"),
        ("#f4a0a0", "failed (the pass raised here)"),
    ]
    assert 'fillcolor="#f4a0a0"' in dot
    rnet.record()  # nothing recorded
    with pytest.raises(GraphError) as caught:
        rnet.graph()
    assert legend_rows(caught.value.graph.to_dot()) == [
        ("#f4a0a0", "failed (the pass raised here)")
    ]
    program = shutil.which("dot")
    if program is not None:  # Graphviz reads it (an HTML label)
        svg = subprocess.run(  # noqa: S603 (our DOT text, Graphviz from PATH)
            [program, "-Tsvg"], input=dot, capture_output=True, text=True, check=True
        ).stdout
        assert "recorded (by the selection)" in svg


# ------------------------------------------------------------- DOT escaping
DOT_STRING = re.compile(r'label=("(?:[^"\\]|\\.)*")', re.DOTALL)
ENTITY = re.compile(r"&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);")


def entity_text(match: re.Match[str]) -> str:
    """Decode an entity as Graphviz does: numeric ones to their code point.

    (``html.unescape`` follows HTML5, which drops control characters.)
    """
    entity = match[0]
    if entity.startswith(("&#x", "&#X")):
        return chr(int(entity[3:-1], 16))
    if entity.startswith("&#"):
        return chr(int(entity[2:-1]))
    return html.unescape(entity)


def drawn_text(quoted: str) -> str:
    """The text Graphviz draws for a quoted label, read as Graphviz reads it.

    1. the DOT lexer: ``\\"`` is a quote, backslash-newline is nothing, any
       other backslash pair is kept;
    2. the object escapes ``\\N``, ``\\G``, ... would be replaced by names:
       there must be none;
    3. the HTML entities of every label (``&amp;``, ``&#13;``) are decoded;
    4. the label escapes: ``\\n``, ``\\l``, ``\\r`` end a line, ``\\x`` is ``x``.
    """
    assert quoted.startswith('"')
    assert quoted.endswith('"')
    lexed = re.sub(
        r"\\(.)",
        lambda m: {'"': '"', "\n": ""}.get(m[1], m[0]),
        quoted[1:-1],
        flags=re.DOTALL,
    )
    pairs = re.findall(r"\\.", lexed, flags=re.DOTALL)
    assert not [p for p in pairs if p[1] in "NGETHL"], (quoted, pairs)
    decoded = ENTITY.sub(entity_text, lexed)
    return re.sub(
        r"\\(.)",
        lambda m: "\n" if m[1] in "nlr" else m[1],
        decoded,
        flags=re.DOTALL,
    )


def test_dot_labels_escape_ampersands_and_entities():
    """A module named `&amp;` is drawn as `&amp;`, not as `&`."""
    node = Node(kind="module", name="&amp;", type="A<b>", label=(1, 1))
    dot = to_dot([node], [], {})
    assert 'label="A&lt;b&gt; (&amp;amp;): 1-1"' in dot
    assert drawn_text(DOT_STRING.search(dot)[1]) == "A<b> (&amp;): 1-1"


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    name=st.text(),
    kind=st.text(),
    container=st.text(),
    container_kind=st.text(),
)
def test_any_module_and_class_name_round_trips_through_dot(
    name, kind, container, container_kind
):
    """Every label of the DOT source decodes back to the words it shows."""
    cluster = Cluster(
        key="c", label=(1, 1), name=container, type=container_kind, parent=None
    )
    nodes = [
        Node(kind="input", name=name, shapes=((1, 2),)),
        Node(kind="module", name=name, type=kind, label=(2, 1), scope=("c",)),
        Node(kind="function", name=kind, calls=2),
    ]
    edges = [Edge(0, 1, (1, 2)), Edge(1, 2, (1, "<=3"))]
    # the words are the titles the table writes: ``Type (name): 2-1``
    nested = {cluster.title()}
    want = {
        nodes[0].title() + "\n[1, 2]",
        nodes[1].title(),
        nodes[2].title() + " x2",
        "[1, 2]",
        "[1, <=3]",
    }
    for expand in (False, True):
        dot = to_dot(nodes, edges, {"c": cluster}, expand_nested=expand)
        drawn = {drawn_text(q) for q in DOT_STRING.findall(dot)}
        assert drawn == (want | nested if expand else want)
        # no raw control character: a name cannot break the DOT structure
        assert not [c for c in dot if c != "\n" and unicodedata.category(c) == "Cc"]
        if shutil.which("dot") is not None:
            done = subprocess.run(
                ["dot", "-Tcanon"],  # noqa: S607 (found on PATH above)
                input=dot.encode(),
                capture_output=True,
                check=False,
            )
            assert done.returncode == 0, done.stderr.decode(errors="replace")


# ---------------------------------------------------------------- rendering
@pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz's dot is not installed"
)
@pytest.mark.parametrize("suffix", ["svg", "png", "pdf"])
def test_render_writes_the_picture(tmp_path, suffix):
    pytest.importorskip("graphviz")
    graph = Recorder(ResNetLike(), input_size=(1, 3, 8, 8)).graph()
    path = graph.render(tmp_path / f"g.{suffix}", expand_nested=True)
    data = path.read_bytes()
    assert data.startswith({"svg": b"<?xml", "png": b"\x89PNG", "pdf": b"%PDF"}[suffix])
    svg = graph._repr_svg_()
    assert svg is not None
    assert "Conv2d (stem): 1&#45;1" in svg  # SVG escapes the hyphen
    assert graph._repr_mimebundle_()["image/svg+xml"] == svg


def test_render_without_dot_names_how_to_install_it(tmp_path, monkeypatch):
    pytest.importorskip("graphviz")
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` there
    graph = Recorder(nn.Sequential(nn.Linear(2, 2)), input_size=(1, 2)).graph()
    with pytest.raises(RuntimeError, match=f"^{re.escape(INSTALL_DOT)}$"):
        graph.render(tmp_path / "g.svg")
    assert graph._repr_svg_() is None
    assert set(graph._repr_mimebundle_()) == {"text/plain"}
    assert graph.to_dot().startswith("digraph")


def test_render_without_the_graphviz_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "graphviz", None)
    graph = Recorder(nn.Sequential(nn.Linear(2, 2)), input_size=(1, 2)).graph()
    with pytest.raises(RuntimeError, match=f"^{re.escape(INSTALL_PACKAGE)}$"):
        graph.render(tmp_path / "g.svg")


def test_render_refuses_an_unknown_format(tmp_path):
    graph = Recorder(nn.Sequential(nn.Linear(2, 2)), input_size=(1, 2)).graph()
    with pytest.raises(ValueError, match=r"^Cannot render to 'jpg'"):
        graph.render(tmp_path / "g.jpg")


def test_text_form_lists_nodes_and_their_sources():
    graph = Recorder(nn.Sequential(nn.Linear(2, 3)), input_size=(1, 2)).graph()
    assert str(graph).splitlines() == [
        "ExecutionGraph(3 nodes, 2 edges, depth=None)",
        "   0  input    input  [1, 2]",
        "   1  module   Linear (0): 1-1  [1, 3]  <- 0",
        "   2  output   output  [1, 3]  <- 1",
    ]


def test_graph_of_draws_a_net_broken_from_the_start_without_a_recorder():
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(5, 2), nn.Tanh())
    with pytest.raises(RuntimeError, match="Failed to run torchinfo"):
        Recorder(net, input_size=(1, 4))  # no table, so no Recorder.graph
    with pytest.raises(GraphError) as caught:
        graph_of(net, torch.ones(1, 4))
    error = caught.value
    assert str(error).startswith("The forward pass raised at Linear (2): 1-3")
    assert "mat1 and mat2 shapes cannot be multiplied" in str(error)
    assert isinstance(error.__cause__, RuntimeError)
    graph = error.graph
    assert titles(graph) == [
        "input", "Linear (0): 1-1", "ReLU (1): 1-2", "Linear (2): 1-3"
    ]  # fmt: skip
    assert graph.failed is graph.nodes[3]
    assert graph.predecessors(3) == [2]
    assert 'color="#c00000"' in graph.to_dot()
    assert leftovers(net) == []


@pytest.mark.parametrize(
    ("make", "size"),
    [
        (demo_model, (1, 3, 32, 32)),
        (resnet18_cifar, (1, 3, 32, 32)),
        (transformer_encoder, (1, 16, 256)),  # an uncalled ModuleList has a row
    ],
)
def test_graph_of_labels_calls_as_the_table_does(make, size):
    net = make().eval()
    x = torch.randn(size)
    expected = Recorder(net, input_size=size).graph(x)
    graph = graph_of(net, x)
    assert titles(graph) == titles(expected)
    assert graph.edges == expected.edges
    assert titles(graph_of(net, x, depth=1)) == titles(expected.at_depth(1))


@settings(max_examples=40, deadline=None)
@given(cases(allow_shared=False))
def test_graph_of_labels_random_nets_as_the_recorder_does(case):
    # a module registered at several paths and called at several depths can
    # be named otherwise than in the table (documented in graph_of)
    net, rnet, x, _ = case
    assert titles(graph_of(net, x)) == titles(rnet.graph(x))

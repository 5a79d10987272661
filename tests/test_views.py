"""The interactive views: their data against oracles, and their pages in a browser.

The browser tests open each view's page in headless Chromium (``tests/
browser.py``; skipped, saying so, when no browser starts), check that it
reports no console error, that its screenshot is not blank, and that
hovering a cell shows what the data holds: the value shown is read from the
page's DOM and compared with an oracle computed here from the inputs (the
softmax and top-k of the logits, a numpy histogram of the scores,
scikit-learn's ROC curve, the layer table's rows), not with the view's own
data. A value is shown to four significant digits (``fmt`` in
``_static/base.js``), hence the relative tolerance of ``5e-4``.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from torch import nn

from scio_recorder import Recorder
from scio_recorder.views import (
    View,
    attention_from_qk,
    attention_view,
    layer_view,
    lens_view,
    ood_view,
    patching_view,
)
from tests import browser

SHOWN = 5e-4  # four significant digits: |shown - value| <= 5e-4 |value|


def close(shown: str, value: float) -> bool:
    """Whether a number shown to four significant digits is ``value``."""
    return math.isclose(float(shown), value, rel_tol=SHOWN, abs_tol=1e-12)


# -- the data, without a browser -----------------------------------------------


def gpt2_attention() -> tuple[torch.Tensor, torch.Tensor, int]:
    """A tiny GPT-2's first layer: its ``c_attn`` output and its eager weights."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1,
        n_embd=16,
        n_head=4,
        vocab_size=50,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    model.config._attn_implementation = "eager"
    rnet = Recorder(model, input_data=[torch.zeros(1, 6, dtype=torch.long)])
    rnet.record("transformer.h.0.attn.c_attn")
    ids = torch.randint(0, 50, (2, 6))
    out = rnet(ids, output_attentions=True)
    return rnet.activations[rnet.recording[0]], out.attentions[0], 4


@pytest.mark.slow
def test_attention_from_qk_is_gpt2s_eager_attention():
    """Recomputed from the recorded queries and keys: the weights GPT-2 returns.

    Both sides take the softmax of the same ``q k^T / sqrt(d)`` products, each
    a dot product of ``d = 4`` float32 terms, possibly by another kernel: a
    logit differs by a few roundings, ``~ d * eps32 * |q| |k|``, and a weight
    (at most 1) by as much relatively; ``atol=1e-6`` covers it.
    """
    qkv, weights, heads = gpt2_attention()
    q, k, _ = qkv.split(qkv.shape[-1] // 3, dim=-1)
    torch.testing.assert_close(
        attention_from_qk(q, k, num_heads=heads), weights, atol=1e-6, rtol=1e-5
    )


def test_attention_from_qk_with_the_rotary_embedding_is_llamas_eager_attention():
    """q_proj, k_proj and the rotary embedding, recorded: the weights Llama returns.

    Without ``position_embeddings`` (the old docstring's advice: q and k
    "before their rotary embedding") the weights are off by order 1. With
    them, both sides rotate with the same float32 operations and take the
    softmax of ``q k^T / sqrt(8)``, dot products of ``d = 8`` terms possibly
    blocked by another kernel: a logit differs by ``~ d * eps32 * |q| |k| /
    sqrt(d)`` (|q|, |k| < 8 here: 2e-5 at most), a weight by as much.
    """
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=50,
        attn_implementation="eager",
        initializer_range=0.3,  # sharp attention, so that a wrong rotation shows
    )
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(1, 50, (2, 12))
    rnet = Recorder(model, input_data={"input_ids": ids})
    names = [f"model.layers.0.self_attn.{p}_proj" for p in "qk"]
    rnet.record(*names, "model.rotary_emb")
    with torch.no_grad():
        weights = rnet(input_ids=ids, output_attentions=True).attentions[0]
    q, k = (rnet.activations_of(name)[0] for name in names)
    assert max(float(q.abs().max()), float(k.abs().max())) < 8
    cos_sin = rnet.activations_of("model.rotary_emb")[0]
    got = attention_from_qk(
        q, k, num_heads=4, num_kv_heads=2, position_embeddings=cos_sin
    )
    torch.testing.assert_close(got, weights, atol=2e-5, rtol=0)
    unrotated = attention_from_qk(q, k, num_heads=4, num_kv_heads=2)
    assert float((unrotated - weights).abs().max()) > 0.5


def test_attention_from_qk_rotates_each_pair_of_a_heads_halves_by_its_angle():
    """RoPE as rotations: pair ``(i, i + D/2)`` at position ``t`` turned by ``a[t, i]``.

    An oracle written apart from transformers' ``rotate_half`` form.
    """
    torch.manual_seed(0)
    q, k = torch.randn(1, 4, 2 * 6), torch.randn(1, 4, 6)  # 2 query heads, 1 kv
    angles = torch.rand(4, 3) * 6  # per position and pair
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)
    got = attention_from_qk(
        q, k, num_heads=2, num_kv_heads=1, position_embeddings=(cos, sin)
    )

    def turned(x: torch.Tensor) -> torch.Tensor:  # [tokens, 6]: pairs (i, i + 3)
        out = torch.empty_like(x)
        for t in range(4):
            for i in range(3):
                c, s = math.cos(angles[t, i]), math.sin(angles[t, i])
                a, b = float(x[t, i]), float(x[t, i + 3])
                out[t, i], out[t, i + 3] = a * c - b * s, b * c + a * s
        return out

    key = turned(k[0])
    for h in range(2):
        logits = turned(q[0, :, h * 6 : h * 6 + 6]) @ key.T / math.sqrt(6)
        causal = torch.ones(4, 4, dtype=torch.bool).triu(1)
        expected = torch.softmax(logits.masked_fill(causal, -math.inf), dim=-1)
        # the same rotation computed in another order (float64 cos and sin
        # here): a few float32 roundings of |q||k| < 10 products, 1e-5
        torch.testing.assert_close(got[0, h], expected, atol=1e-5, rtol=0)


def test_attention_from_qk_refuses_a_rotation_of_part_of_each_head():
    """GPT-NeoX's ``rotary_pct``: cos narrower than a head, which it cannot apply."""
    q, k = torch.zeros(1, 3, 8), torch.zeros(1, 3, 8)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "attention_from_qk: `position_embeddings` rotate 2 dimensions of heads "
            "of 4; this function rotates whole heads of an even size, by halves "
            "(transformers' `apply_rotary_pos_emb`). For a model that rotates a "
            "part of each head (GPT-NeoX's `rotary_pct`), record the eager "
            "attention weights instead (`output_attentions=True` with "
            '`attn_implementation="eager"`).'
        ),
    ):
        attention_from_qk(
            q, k, num_heads=2, position_embeddings=(torch.ones(3, 2), torch.zeros(3, 2))
        )


def test_attention_from_qk_grouped_heads_and_padding_as_a_loop_of_heads():
    """Grouped-query heads share their group's keys; padded keys get no weight."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 5, 4 * 3), torch.randn(2, 5, 2 * 3)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    got = attention_from_qk(q, k, num_heads=4, num_kv_heads=2, mask=mask)
    for b in range(2):
        for h in range(4):
            qh, kh = (
                q[b, :, h * 3 : h * 3 + 3],
                k[b, :, (h // 2) * 3 : (h // 2) * 3 + 3],
            )
            logits = qh @ kh.T / math.sqrt(3)
            blocked = torch.ones(5, 5, dtype=torch.bool).triu(1) | (mask[b] == 0)
            expected = torch.softmax(logits.masked_fill(blocked, -math.inf), dim=-1)
            expected = expected.nan_to_num(0.0)  # every key masked: a row of zeros
            # the same products, in another batching: a few float32 roundings
            torch.testing.assert_close(got[b, h], expected, atol=1e-6, rtol=1e-5)
    assert torch.all(got[1, :, :, 0] == 0)


def test_attention_from_qk_refuses_heads_that_do_not_divide():
    with pytest.raises(
        ValueError,
        match=re.escape(
            "attention_from_qk: `q` must be [batch, tokens, heads * head_size] or "
            "[batch, heads, tokens, head_size]; got [1, 3, 10] for 4 heads"
        ),
    ):
        attention_from_qk(torch.zeros(1, 3, 10), torch.zeros(1, 3, 10), num_heads=4)


@pytest.mark.slow
def test_a_view_saves_its_page_and_its_picture_and_refuses_other_files(tmp_path):
    view = patching_view(torch.tensor([[1.0, -2.0]]))
    page = view.save(tmp_path / "grid.html").read_text(encoding="utf-8")
    assert page == view.html()
    assert "http://" not in page
    assert "https://" not in page  # nothing from the network
    png = view.save(tmp_path / "grid.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    assert 'srcdoc="&lt;!DOCTYPE html&gt;' in view._repr_html_()
    with pytest.raises(
        ValueError, match=re.escape("save('grid.txt'): name an .html file")
    ):
        view.save("grid.txt")


@pytest.mark.slow
def test_every_static_picture_is_drawn(tmp_path):
    """Each view's ``figure()`` gives a matplotlib figure with something in it."""
    pytest.importorskip("matplotlib")
    for view in views().values():
        figure = view.figure()
        assert figure.axes or figure.texts, view.kind


def test_layer_tree_parents_are_the_rows_one_level_up_that_hold_them():
    """Each row's parent is a row one level up whose name prefixes its name."""
    rnet = Recorder(deep_net(3, 4), input_size=(1, 4))
    rows = layer_view(rnet).data["rows"]
    assert rows[0][10] == -1
    for row in rows[1:]:
        parent = rows[row[10]]
        assert int(parent[0].split("-")[0]) == int(row[0].split("-")[0]) - 1
        assert row[1].startswith(parent[1] + ".") or parent[1] == ""


def test_layer_view_marks_what_the_recorder_records_and_refuses_unknown_labels():
    rnet = Recorder(deep_net(2, 2), input_size=(1, 4))
    rnet.record((3, 2), (1, 1))
    rows = layer_view(rnet).data["rows"]
    assert [row[0] for row in rows if row[9]] == ["1-1", "3-2"]
    with pytest.raises(
        KeyError, match=re.escape("layer_view: no row labelled [(9, 9)]")
    ):
        layer_view(rnet, recorded=[(9, 9)])


def test_layer_view_shows_an_empty_shape_as_a_dash_as_the_compact_table_does():
    """Inputs passed by keyword leave the net's row no input shape: "-", not "[]"."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x)

    rnet = Recorder(Net(), input_data={"x": torch.randn(1, 3)})
    table = rnet.table
    assert table.rows[0].input_size == []  # the case: no shape in the table
    rows = layer_view(rnet).data["rows"]
    assert rows[0][4:6] == ["-", "[1, 2]"]
    assert rows[1][4:6] == ["[1, 3]", "[1, 2]"]


def test_ood_view_histograms_count_every_score_once_clipped_or_not():
    """Clipped tails land in the end bins: the counts sum to each set's size."""
    torch.manual_seed(0)
    ev = evaluation()
    for clip in (None, (0.05, 0.95)):
        data = ood_view(ev, clip=clip).data
        for panel in data["sets"][0]["panels"]:
            assert sum(panel["id"]) == 200
            assert sum(panel["ood"]) == 150
            assert panel["clipped"] == (clip is not None)


def far_scores():
    """Scores of 3e5 spread over 1.5: bins 0.05 wide, six digits apart."""
    from scio_recorder.ood import Evaluation  # noqa: PLC0415

    gen = torch.Generator().manual_seed(0)
    inside = 3e5 + torch.rand(200, generator=gen, dtype=torch.float64)
    outside = 3e5 + 0.5 + torch.rand(200, generator=gen, dtype=torch.float64)
    return Evaluation({"Maha": inside}, {"Maha": outside}, "far")


def far_edges(ev) -> np.ndarray:
    """The oracle: numpy's even edges between the pooled 1% and 99% quantiles."""
    pooled = np.concatenate([ev.id_scores["Maha"], ev.ood_scores["Maha"]])
    return np.linspace(*np.quantile(pooled, [0.01, 0.99]), 31)


def test_ood_view_keeps_bins_of_large_scores_apart_in_the_data_and_figure():
    """Edges of 3e5 in bins of 0.05: six digits made them all 300000.0 (one bin)."""
    pytest.importorskip("matplotlib")
    ev = far_scores()
    edges = far_edges(ev)
    width = edges[1] - edges[0]
    view = ood_view(ev)
    shown = np.array(view.data["sets"][0]["panels"][0]["edges"])
    # the edges rounded to 13 digits: within 1e-7 of 3e5, 2e-6 of a bin
    np.testing.assert_allclose(shown, edges, rtol=0, atol=width * 1e-5)
    figure = view.figure()
    stairs = [p for p in figure.axes[0].patches if hasattr(p, "get_data")]
    assert len(stairs) == 2  # in-distribution and OoD
    for patch in stairs:
        np.testing.assert_allclose(patch.get_data().edges, edges, atol=width * 1e-5)


# -- the pages, in a browser -------------------------------------------------------


def deep_net(blocks: int, width: int) -> nn.Module:
    """Blocks of blocks of (Linear, ReLU): a net of about 3 * blocks * width rows."""
    return nn.Sequential(
        *[
            nn.Sequential(
                *[nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(width)]
            )
            for _ in range(blocks)
        ]
    )


def evaluation():
    from scio_recorder.ood import Evaluation, OoDResults  # noqa: PLC0415

    gen = torch.Generator().manual_seed(1)
    inside = {
        "MSP": torch.randn(200, generator=gen),
        "Mahalanobis": torch.randn(200, generator=gen).exp() * 10,
    }
    far = {
        "MSP": torch.randn(150, generator=gen) + 1,
        # a few huge scores: the clipped histogram keeps the bulk readable
        "Mahalanobis": torch.cat(
            [torch.rand(145, generator=gen) * 30, torch.full((5,), 3e5)]
        ),
    }
    near = {key: value[:150] + 0.2 for key, value in inside.items()}
    return OoDResults(
        {
            "far": Evaluation(inside, far, "far"),
            "near": Evaluation(inside, near, "near"),
        }
    )


LENS = torch.randn(3, 1, 5, 20, generator=torch.Generator().manual_seed(2))
GRID = torch.randn(4, 6, generator=torch.Generator().manual_seed(3))
WEIGHTS = torch.softmax(
    torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(4)), -1
)


def views() -> dict[str, View]:
    rnet = Recorder(deep_net(2, 3), input_size=(1, 4))
    rnet.record((3, 2))
    return {
        "patching": patching_view(
            GRID, layers=[f"h.{i}" for i in range(4)], positions=list("abcdef")
        ),
        "attention": attention_view(WEIGHTS, list("abcdef"), layer="h.0.attn"),
        "lens": lens_view(LENS, list("abcde"), decode=lambda i: f"t{i}"),
        "layers": layer_view(rnet),
        "ood": ood_view(evaluation()),
    }


@pytest.fixture(scope="module")
def chromium():
    found = browser.start()
    if found is None:
        pytest.skip(
            "no headless Chromium starts here (install Debian's `chromium` or "
            "`chromium-headless-shell`; .ci/run does): the browser tests are skipped"
        )
    yield found
    found.close()


def opened(chromium, view: View, tmp_path, width: int = 1000) -> browser.Page:
    """Load the view's page; check it reports no error and is not blank."""
    path = view.save(tmp_path / f"{view.kind}.html")
    page = chromium.page(width, 700)
    page.load(path.as_uri())
    assert page.errors() == []
    assert page.requested() == [path.as_uri()]  # nothing else, from anywhere
    assert browser.inked(page.screenshot()) > 0.01
    return page


def tip(page: browser.Page) -> str | None:
    """The tooltip's text, or ``None`` when it is hidden."""
    return page.evaluate(
        "(() => { const t = document.getElementById('sv-tip');"
        " return t.hidden ? null : t.textContent; })()"
    )


def hover_cell(page: browser.Page, canvas: str, i: int, j: int) -> str | None:
    """Hover cell ``(i, j)`` of the heat map ``canvas``; return the tooltip."""
    box = page.evaluate(
        f"(() => {{ const c = document.querySelector({json.dumps(canvas)});"
        " const r = c.getBoundingClientRect();"
        " const d = c.dataset;"
        " return [r.left, r.top, r.width / d.cols, r.height / d.rows]; })()"
    )
    page.hover(box[0] + (j + 0.5) * box[2], box[1] + (i + 0.5) * box[3])
    return tip(page)


def last_value(text: str | None) -> str:
    assert text is not None, "hovering showed nothing"
    return text.splitlines()[-1].rsplit(": ", 1)[1]


def test_patching_page_shows_each_cells_value_on_hover(chromium, tmp_path):
    page = opened(chromium, views()["patching"], tmp_path)
    for i, j in [(0, 0), (2, 5), (3, 1)]:
        shown = hover_cell(page, "canvas.sv-heat", i, j)
        assert shown is not None
        assert shown.startswith(f"layer h.{i}\nposition {j}: {'abcdef'[j]}\n")
        assert close(last_value(shown), float(GRID[i, j]))
    page.hover(1, 1)
    assert tip(page) is None
    # left-aligned: the row names hug the grid, at the page's left (a grid
    # whose name column stretched pushed the map to the frame's right edge)
    names, grid = page.evaluate(
        "[Math.max(...[...document.querySelectorAll('.sv-row')].map((e) => e"
        ".getBoundingClientRect().width)), document.querySelector('canvas.sv-heat')"
        ".getBoundingClientRect().left]"
    )
    assert grid <= 8 + names + 8  # the body's padding, the widest name, the gap


def test_a_page_whose_data_is_wrong_fails_the_hover_check(chromium, tmp_path):
    """The check has teeth: a page showing another value than the data fails it."""
    view = views()["patching"]
    view.data["values"][2][5] += 1.0  # what a bug in the view would do
    page = opened(chromium, view, tmp_path)
    assert not close(
        last_value(hover_cell(page, "canvas.sv-heat", 2, 5)), float(GRID[2, 5])
    )


@pytest.mark.slow
def test_a_page_with_a_script_error_is_caught(chromium, tmp_path):
    """A console error or an exception in the page's script is reported."""
    view = views()["patching"]
    view.data["values"] = None  # the script reads values.length
    path = view.save(tmp_path / "broken.html")
    page = chromium.page()
    page.load(path.as_uri())
    assert any("TypeError" in error for error in page.errors())


@pytest.mark.slow
def test_attention_page_shows_weights_per_head_and_a_tokens_row(chromium, tmp_path):
    page = opened(chromium, views()["attention"], tmp_path)
    # all heads as small multiples: a cell of head 2
    shown = hover_cell(page, 'canvas[data-head="2"]', 4, 1)
    assert shown is not None
    assert shown.startswith("head 2\nquery 4: e\nkey 1: b\nweight: ")
    assert close(shown.splitlines()[3].split()[1], float(WEIGHTS[0, 2, 4, 1]))
    # one head: pick head 1 from the list, hover the query token 3
    page.evaluate(
        "(() => { const s = document.querySelector('select');"
        " s.value = '2'; s.dispatchEvent(new Event('change')); })()"
    )
    assert page.evaluate("document.querySelectorAll('canvas.sv-heat').length") == 1
    page.hover(*page.center('.sv-row[data-row="3"]'))
    shown = tip(page)
    assert shown is not None
    assert shown.startswith("head 1, query 3: d\nattends to:\n")
    order = torch.argsort(WEIGHTS[0, 1, 3], descending=True)
    first = shown.splitlines()[2].split()
    assert first[2] == f"{int(order[0])}:"  # the key it attends to most
    assert close(first[0], float(WEIGHTS[0, 1, 3, order[0]]))
    assert page.errors() == []


@pytest.mark.slow
def test_lens_page_shows_the_top_k_tokens_and_probabilities(chromium, tmp_path):
    page = opened(chromium, views()["lens"], tmp_path)
    probs = torch.softmax(LENS[:, 0].double(), dim=-1)
    for i, j in [(0, 0), (2, 4)]:
        cell = f'td[data-i="{i}"][data-j="{j}"]'
        top = probs[i, j].topk(5)
        assert page.evaluate(f"document.querySelector('{cell}').textContent") == (
            f"t{int(top.indices[0])}"
        )
        page.hover(*page.center(cell))
        shown = tip(page)
        assert shown is not None
        lines = shown.splitlines()
        assert lines[0] == f'layer {i}, position {j}: "{"abcde"[j]}"'
        for rank, line in enumerate(lines[1:]):
            number, p, token = line.split()
            assert number == f"{rank + 1}."
            assert token == f'"t{int(top.indices[rank])}"'
            assert close(p, float(top.values[rank]))


@pytest.mark.slow
def test_layer_tree_of_2000_rows_opens_lazily_and_shows_shapes(chromium, tmp_path):
    """A net of about 2,000 rows: a small page at first, rows drawn as opened."""
    rnet = Recorder(deep_net(60, 11), input_size=(1, 4), force_static_flow=False)
    rnet.record((3, 5), (3, 700))
    table = rnet.table
    assert len(table) > 1900
    page = opened(chromium, layer_view(rnet), tmp_path)
    assert page.evaluate("document.querySelectorAll('.sv-tree li').length") == 61
    # open 1-2, then its 2-15 (the 4th block of the 2nd group)
    page.click(*page.center('li[data-label="1-2"] > .sv-node'))
    assert page.evaluate("document.querySelectorAll('.sv-tree li').length") == 61 + 11
    page.click(*page.center('li[data-label="2-15"] > .sv-node'))
    row = table[(3, 29)]  # the Linear of 2-15
    page.hover(*page.center('li[data-label="3-29"] > .sv-node'))
    shown = tip(page)
    assert shown is not None
    assert shown.splitlines() == [
        f"3-29  {row.name}  Linear",
        "call 0 of this module",
        f"input  {row.input_size}",
        f"output {row.output_size}",
        f"parameters {row.num_params}",
    ]
    # the recorded rows: marked once their path is opened
    page.click(*page.center("button:nth-of-type(3)"))  # show recorded
    marked = page.evaluate(
        "[...document.querySelectorAll('li[data-recorded=\"1\"]')]"
        ".map(li => li.dataset.label)"
    )
    assert sorted(marked) == ["3-5", "3-700"]
    page.click(*page.center("button:nth-of-type(1)"))  # expand all
    assert page.evaluate("document.querySelectorAll('.sv-tree li').length") == len(
        table
    )
    assert page.errors() == []


@pytest.mark.slow
def test_ood_page_shows_bin_counts_and_roc_points_of_the_detector_picked(
    chromium, tmp_path
):
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    results = evaluation()
    page = opened(chromium, ood_view(results), tmp_path)
    for detector, index in (("MSP", 0), ("Mahalanobis", 1)):
        page.evaluate(
            "(() => { const s = document.querySelector('select');"
            f" s.value = '{index}'; s.dispatchEvent(new Event('change')); }})()"
        )
        inside = results["far"].id_scores[detector].double().numpy()
        outside = results["far"].ood_scores[detector].double().numpy()
        pooled = np.concatenate([inside, outside])
        low, high = np.quantile(pooled, [0.01, 0.99])
        edges = np.linspace(low, high, 31)
        for b in (0, 13, 29):
            page.hover(*page.center(f'rect.sv-bin[data-bin="{b}"]'))
            shown = tip(page)
            assert shown is not None
            lines = shown.splitlines()
            ends = re.findall(r"-?[\d.]+(?:e[-+]?\d+)?", lines[0].split(": ", 1)[1])
            assert close(ends[0], edges[b])
            assert close(ends[1], edges[b + 1])
            n_id = int(np.histogram(np.clip(inside, low, high), edges)[0][b])
            n_ood = int(np.histogram(np.clip(outside, low, high), edges)[0][b])
            assert lines[1].startswith(f"in-distribution {n_id} ")
            assert lines[2].startswith(f"far {n_ood} ")
        # the ROC: the point shown is one of scikit-learn's (OoD positive)
        labels = np.r_[np.zeros(inside.size), np.ones(outside.size)]
        fpr, tpr, _ = sklearn_metrics.roc_curve(labels, pooled, drop_intermediate=False)
        x, y = page.center("rect.sv-roc-hit")
        page.hover(x + 20, y)
        lines = (tip(page) or "").splitlines()
        point = float(lines[0].split()[1]), float(lines[1].split()[1])
        assert np.any(
            np.isclose(fpr, point[0], rtol=SHOWN, atol=1e-9)
            & np.isclose(tpr, point[1], rtol=SHOWN, atol=1e-9)
        ), point
    assert page.errors() == []


@pytest.mark.slow
def test_ood_page_tells_the_bins_of_large_scores_apart(chromium, tmp_path):
    """Hovering a bin of scores near 3e5 shows its own edges (fmt: 3.000e+5 each)."""
    ev = far_scores()
    edges = far_edges(ev)
    width = edges[1] - edges[0]
    page = opened(chromium, ood_view(ev), tmp_path)

    def near(shown: str, value: float) -> bool:
        """``value`` rounded to the digits shown, which resolve a hundredth of a bin."""
        unit = 10.0 ** -len(shown.partition(".")[2])  # the last digit shown
        return unit <= width / 100 and abs(float(shown) - value) <= unit / 2 + 1e-9

    lefts = []
    for b in (0, 1, 14, 29):
        page.hover(*page.center(f'rect.sv-bin[data-bin="{b}"]'))
        shown = tip(page)
        assert shown is not None
        ends = re.findall(r"-?[\d.]+", shown.splitlines()[0].split(": ", 1)[1])
        assert near(ends[0], edges[b]), (b, ends, edges[b])
        assert near(ends[1], edges[b + 1]), (b, ends, edges[b + 1])
        lefts.append(ends[0])
    assert len(set(lefts)) == 4  # four bins, four left edges
    axis = page.evaluate(
        "[...document.querySelectorAll('.sv-histogram svg text')]"
        ".map(t => t.textContent)"
    )
    assert near(axis[0], edges[0])
    assert near(axis[1], edges[-1])
    assert page.errors() == []


def test_a_sample_outside_the_batch_is_refused_naming_the_batch():
    with pytest.raises(
        IndexError,
        match=re.escape(
            "lens_view: sample=3, but the batch has 1 samples; pick one of 0 to 0"
        ),
    ):
        lens_view(LENS, sample=3)


@pytest.mark.parametrize(
    ("make", "msg"),
    [
        (
            lambda: attention_view(torch.ones(2, 3)),
            (
                "attention_view: `weights` must be [batch, heads, queries, keys] "
                "or [heads, queries, keys]; got [2, 3]"
            ),
        ),
        (
            lambda: lens_view(torch.ones(2, 3, 4, 5, 6)),
            (
                "lens_view: `lens` must be [layers, batch, positions, vocabulary] "
                "or [layers, positions, vocabulary]; got [2, 3, 4, 5, 6]"
            ),
        ),
    ],
    ids=["attention", "lens"],
)
def test_values_of_another_shape_are_refused_naming_both_shapes(make, msg):
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        make()


# -- hostile text and empty inputs (issue 42, items 5 and 6) --------------------

HOSTILE = "<!--<script>"  # enters the HTML parser's "double escaped" state


def test_the_pages_data_holds_no_markup_at_all():
    """Every ``<``, ``>`` and ``&`` of the data is written ``\\uXXXX`` in the page."""
    tokens = [HOSTILE, "</script>", "a&b", "x>y"]
    view = patching_view(torch.ones(1, 4), positions=tokens)
    page = view.html()
    data = page.split('id="sv-data">', 1)[1].split("</script>", 1)[0]
    assert not set("<>&") & set(data)
    assert json.loads(data)["positions"] == tokens


@pytest.mark.slow
def test_a_token_that_opens_a_comment_and_a_script_is_drawn_as_text(chromium, tmp_path):
    """``<!--<script>`` in a token: each view's script runs and shows it as text.

    With only ``</`` escaped, the parser reads the rest of the page as script
    data (the page's own ``</script>`` no longer ends it): nothing is drawn.
    """
    tokens = [HOSTILE, "</script>", "b", "c", "d", "e"]
    made = {
        "patching": patching_view(GRID, positions=tokens),
        "attention": attention_view(WEIGHTS[:, :1], tokens),  # one head: labelled
        "lens": lens_view(LENS, tokens[:5], decode=lambda i: HOSTILE),
    }
    for kind, view in made.items():
        page = opened(chromium, view, tmp_path)
        shown = page.evaluate(
            "[...document.querySelectorAll('#sv-root *')]"
            ".filter((e) => e.children.length === 0).map((e) => e.textContent)"
        )
        assert HOSTILE in shown, kind
        assert page.evaluate("document.querySelectorAll('script').length") == 2, kind
        assert page.errors() == [], kind


@pytest.mark.parametrize(
    ("make", "msg"),
    [
        (
            lambda: attention_view(torch.zeros(1, 2, 0, 0), []),
            (
                "attention_view: `weights` has no queries and no keys (its shape is "
                "[1, 2, 0, 0] for [batch, heads, queries, keys]); give at least one "
                "of each"
            ),
        ),
        (
            lambda: attention_view(torch.zeros(0, 3, 3)),
            (
                "attention_view: `weights` has no heads (its shape is [0, 3, 3] for "
                "[heads, queries, keys]); give at least one of each"
            ),
        ),
        (
            lambda: attention_view(torch.zeros(0, 1, 3, 3)),
            (
                "attention_view: `weights` has no samples (its shape is [0, 1, 3, 3] "
                "for [batch, heads, queries, keys]); give at least one of each"
            ),
        ),
        (
            lambda: patching_view(torch.zeros(2, 0)),
            (
                "patching_view: `grid` has no positions (its shape is [2, 0] for "
                "[layers, positions]); give at least one of each"
            ),
        ),
        (
            lambda: patching_view(torch.zeros(0, 3)),
            (
                "patching_view: `grid` has no layers (its shape is [0, 3] for "
                "[layers, positions]); give at least one of each"
            ),
        ),
        (
            lambda: lens_view(torch.zeros(2, 1, 0, 5)),
            (
                "lens_view: `lens` has no positions (its shape is [2, 1, 0, 5] for "
                "[layers, batch, positions, vocabulary]); give at least one of each"
            ),
        ),
        (
            lambda: lens_view(torch.zeros(0, 3, 5)),
            (
                "lens_view: `lens` has no layers (its shape is [0, 3, 5] for "
                "[layers, positions, vocabulary]); give at least one of each"
            ),
        ),
    ],
    ids=[
        "attention-tokens",
        "attention-heads",
        "attention-batch",
        "patching-positions",
        "patching-layers",
        "lens-positions",
        "lens-layers",
    ],
)
def test_an_empty_input_is_refused_naming_its_shape(make, msg):
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        make()


def test_an_ood_view_of_empty_scores_is_refused():
    from scio_recorder.ood import Evaluation  # noqa: PLC0415

    with pytest.raises(ValueError, match="empty"):
        ood_view(Evaluation({"a": torch.zeros(0)}, {"a": torch.ones(3)}, "far"))


# -- issue 47: encodings that say what they mean --------------------------------


@pytest.mark.slow
def test_ood_list_names_each_detector_with_the_auroc_of_the_set_picked(
    chromium, tmp_path
):
    results = evaluation()
    page = opened(chromium, ood_view(results), tmp_path)
    listed = "[...document.querySelector('select').options].map((o) => o.textContent)"
    for index, name in enumerate(["far", "near"]):
        page.evaluate(
            "(() => { const s = document.querySelectorAll('select')[1];"
            f" s.value = '{index}'; s.dispatchEvent(new Event('change')); }})()"
        )
        for detector, option in zip(
            ["MSP", "Mahalanobis"], page.evaluate(listed), strict=True
        ):
            shown = re.fullmatch(rf"{detector} \(AUROC ([\d.]+)\)", option)
            assert shown is not None, option
            assert close(shown.group(1), results[name][detector]["AUROC"]), name
    assert page.errors() == []


class _Blocks(nn.Module):
    """GPT-2's shape: a ModuleList (never called: a container) of called blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.h = nn.ModuleList(
            nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.h:
            x = block(x)
        return x


@pytest.mark.slow
def test_layer_view_styles_a_container_by_its_own_class_not_its_ancestors(
    chromium, tmp_path
):
    rnet = Recorder(_Blocks(), input_size=(1, 4))
    rows = {row.name: row for row in rnet.table.values()}
    assert not rows["h"].recordable
    assert rows["h.0"].recordable
    page = opened(chromium, layer_view(rnet), tmp_path)
    page.evaluate(
        "[...document.querySelectorAll('.sv-controls button')][0].click()"
    )  # expand all
    styles = page.evaluate(
        "Object.fromEntries([...document.querySelectorAll('.sv-tree li')].map((li) =>"
        " [li.dataset.label, getComputedStyle(li.querySelector(':scope > .sv-node"
        " > .sv-type')).fontStyle]))"
    )
    for row in rnet.table.values():
        expected = "normal" if row.recordable else "italic"
        label = "-".join(map(str, row.label))
        assert styles[label] == expected, (row.name, styles[label])


def pixel(page: browser.Page, canvas: str, i: int, j: int) -> list[int]:
    """The colour at the centre of cell ``(i, j)`` of the heat map ``canvas``."""
    return page.evaluate(
        f"(() => {{ const c = document.querySelector({json.dumps(canvas)});"
        " const s = Number(c.dataset.cell);"
        f" return [...c.getContext('2d').getImageData(({j} + 0.5) * s, ({i} + 0.5) * s,"
        " 1, 1).data].slice(0, 3); })()"
    )


@pytest.mark.slow
def test_patching_grid_of_one_sign_draws_its_lowest_cell_in_colour(chromium, tmp_path):
    """White is 0, not the minimum: a grid of positive values has no white cell."""
    grid = torch.tensor([[0.5, 1.0, 2.0], [3.0, 4.0, 0.25]])
    page = opened(chromium, patching_view(grid), tmp_path)
    lowest = pixel(page, "canvas.sv-heat", 1, 2)
    assert lowest != [255, 255, 255]
    assert lowest[0] > lowest[2]  # red: above 0
    signed = patching_view(torch.tensor([[-2.0, 0.0, 1.0]]))
    page = opened(chromium, signed, tmp_path)
    assert pixel(page, "canvas.sv-heat", 0, 1) == [255, 255, 255]  # 0 is white
    low = pixel(page, "canvas.sv-heat", 0, 0)
    assert low[2] > low[0]  # blue: below 0


def causal_weights(heads: int, tokens: int, seed: int = 5) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, tokens, 8 * heads, generator=gen)
    k = torch.randn(1, tokens, 8 * heads, generator=gen)
    return attention_from_qk(q, k, num_heads=heads)


@pytest.mark.slow
def test_attention_tooltips_list_only_the_keys_drawn_and_masks_are_not_zeros(
    chromium, tmp_path
):
    weights = causal_weights(1, 6)
    view = attention_view(weights, list("abcdef"))
    assert view.data["causal"]
    page = opened(chromium, view, tmp_path)
    page.hover(*page.center('.sv-row[data-row="1"]'))
    lines = (tip(page) or "").splitlines()
    assert lines[0] == "head 0, query 1: b"
    listed = [line for line in lines if "key " in line]
    assert sorted(int(line.split("key ")[1].split(":")[0]) for line in listed) == [0, 1]
    assert lines[-1] == "(4 later keys masked)"
    masked = hover_cell(page, "canvas.sv-heat", 1, 4)
    assert masked is not None
    assert masked.endswith("masked (a key after the query)")
    # a masked cell is hatched: grey lines on a light ground, not a white zero
    colours = page.evaluate(
        "(() => { const c = document.querySelector('canvas.sv-heat');"
        " const s = Number(c.dataset.cell);"
        " const d = c.getContext('2d').getImageData(4 * s, 1 * s, s, s).data;"
        " const seen = new Set(); for (let p = 0; p < d.length; p += 4)"
        " seen.add(d.slice(p, p + 3).join(',')); return [...seen]; })()"
    )
    assert "255,255,255" not in colours
    assert len(colours) == 2


def test_a_causal_pattern_is_stored_as_its_lower_half_and_read_back():
    from scio_recorder.views._attention import weights_of  # noqa: PLC0415

    weights = causal_weights(3, 40)
    view = attention_view(weights)
    full = attention_view(weights + 1e-9)  # no exact zero after the diagonal
    assert view.data["causal"]
    assert not full.data["causal"]
    ratio = len(view.data["weights"]) / len(full.data["weights"])
    assert ratio == pytest.approx(41 / 80, abs=0.01)  # 40 * 41 / 2 of 40 * 40
    back = weights_of(view.data)
    later = torch.ones(40, 40, dtype=torch.bool).triu(1)
    assert np.isnan(back[:, later.numpy()]).all()
    # float32 storage: the float32 weights, exactly
    assert np.array_equal(back[:, ~later.numpy()], weights[0][:, ~later].numpy())


def test_a_page_over_the_size_limit_is_refused_naming_its_size():
    weights = causal_weights(2, 64)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "attention_view: 2 heads x 64 queries x 64 keys make a page of "
            "0.0222 MB (4 bytes a weight, the masked half left out), over "
            "max_mb=0.015; pick fewer heads"
        ),
    ):
        attention_view(weights, max_mb=0.015)  # 2 * 64 * 65 / 2 * 4 * 4 / 3 bytes
    assert attention_view(weights, heads=[1], max_mb=0.015).data["heads"] == [1]
    with pytest.raises(ValueError, match=r"heads=\[2\]; pick at least one of 0 to 1"):
        attention_view(weights, heads=[2])


# -- issue 47: phones and keyboards ------------------------------------------------

LONG = [f"{i:03d} a token label of forty characters.."[:40] for i in range(12)]


def long_views() -> dict[str, View]:
    """Every view with 40-character labels (and a lens with every probability)."""
    made = views()
    made["patching"] = patching_view(GRID[:, :6], layers=LONG[:4], positions=LONG[:6])
    made["attention"] = attention_view(causal_weights(3, 12), LONG)
    # top probabilities from 0.3 to 0.98: the cells' text colours all change
    p = torch.linspace(0.3, 0.98, 15).reshape(3, 5, 1)
    lens = torch.cat([p.log(), (1 - p).log()], -1)
    made["lens"] = lens_view(lens, LONG[:5], decode=lambda i: LONG[i], k=2)
    return made


@pytest.mark.slow
def test_every_view_has_a_viewport_and_fits_a_phone(chromium, tmp_path):
    for kind, view in long_views().items():
        assert '<meta name="viewport" content="width=device-width' in view.html()
        path = view.save(tmp_path / f"{kind}.html")
        page = chromium.page(390, 844, mobile=True)
        page.load(path.as_uri())
        assert page.errors() == [], kind
        width = page.evaluate(
            "[window.innerWidth, document.documentElement.scrollWidth]"
        )
        assert width == [390, 390], (kind, width)  # laid out at 390, no side scroll
        shot = page.screenshot()
        (tmp_path / f"{kind}-390.png").write_bytes(shot)
        assert browser.inked(shot) > 0.01, kind


INTERACTIVE = (
    "select, button:not([tabindex='-1']), input,"
    " canvas.sv-heat:not([tabindex='-1']), .sv-head, table.sv-grid td[tabindex='0'],"
    " svg.sv-plot, .sv-node, .sv-row[tabindex]"
)

NAME = """(e) => (e.getAttribute('aria-label') || e.textContent
  || (e.labels && e.labels[0] && e.labels[0].textContent) || '').trim()"""


@pytest.mark.slow
def test_every_control_is_reached_by_tab_and_has_a_name(chromium, tmp_path):
    for kind, view in long_views().items():
        page = opened(chromium, view, tmp_path)
        count = page.evaluate(
            "(() => { const all = [...document.querySelectorAll("
            f"{json.dumps(INTERACTIVE)})];"
            " all.forEach((e, k) => { e.dataset.k = k; }); return all.length; })()"
        )
        assert count > 0, kind
        reached = set()
        for _ in range(count + 3):
            page.press("Tab")
            k = page.evaluate("document.activeElement.dataset.k ?? null")
            if k is not None:
                reached.add(int(k))
        assert reached == set(range(count)), (kind, count, sorted(reached))
        # nothing focusable is nameless (a leaf's empty button was)
        nameless = page.evaluate(
            "[...document.querySelectorAll('button, [tabindex]')]"
            ".filter((e) => e.tabIndex >= 0 && e.id !== 'sv-tip')"
            f".filter((e) => !({NAME})(e)).map((e) => e.outerHTML.slice(0, 80))"
        )
        assert nameless == [], kind
        assert page.errors() == [], kind


@pytest.mark.slow
def test_the_keyboard_shows_what_the_mouse_shows(chromium, tmp_path):
    page = opened(chromium, views()["patching"], tmp_path)
    page.evaluate("document.querySelector('canvas.sv-heat').focus()")
    for key in ("ArrowRight", "ArrowRight", "ArrowDown"):
        page.press(key)
    shown = tip(page)
    assert shown is not None
    assert shown.startswith("layer h.1\nposition 2: c\n")
    assert close(last_value(shown), float(GRID[1, 2]))
    # the OoD histogram: a bin by the arrow keys
    page = opened(chromium, views()["ood"], tmp_path)
    page.evaluate("document.querySelector('.sv-histogram svg').focus()")
    page.press("ArrowRight")
    assert (tip(page) or "").startswith("bin 1: [")
    # the layer tree: Enter opens a row
    page = opened(chromium, views()["layers"], tmp_path)
    before = page.evaluate("document.querySelectorAll('.sv-tree li').length")
    page.evaluate("document.querySelector('li[data-label=\"1-2\"] > .sv-node').focus()")
    page.press("Enter")
    assert page.evaluate("document.querySelectorAll('.sv-tree li').length") > before
    # the attention thumbnails: Enter opens the head
    page = opened(chromium, views()["attention"], tmp_path)
    page.evaluate("document.querySelectorAll('.sv-head')[2].focus()")
    page.press("Enter")
    assert page.evaluate("document.querySelector('select').value") == "3"
    assert page.evaluate("document.querySelectorAll('canvas.sv-heat').length") == 1


# WCAG 2's relative luminance and contrast ratio, written out for the test
CONTRAST = """(() => {
  const lum = (c) => { const [r, g, b] = c.map((v) => { v /= 255;
    return v <= 0.04045 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const rgb = (s) => (s.match(/[\\d.]+/g) || []).map(Number);
  const ground = (e) => { for (; e; e = e.parentElement) {
    const c = rgb(getComputedStyle(e).backgroundColor);
    if (c.length === 3 || (c.length === 4 && c[3] > 0)) return c.slice(0, 3); }
    return [255, 255, 255]; };
  const worst = [];
  for (const e of document.querySelectorAll('#sv-root *, .sv-title')) {
    const own = [...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    if (!own || !e.getClientRects().length) continue;
    const style = getComputedStyle(e);
    const ink = rgb(e instanceof SVGElement ? style.fill : style.color).slice(0, 3);
    const [a, b] = [lum(ink), lum(ground(e))].sort((x, y) => y - x);
    const ratio = (a + 0.05) / (b + 0.05);
    if (ratio < 4.5) worst.push([e.textContent.slice(0, 30), ratio]);
  }
  return worst; })()"""


@pytest.mark.slow
def test_every_text_has_a_contrast_of_at_least_4_5(chromium, tmp_path):
    for kind, view in long_views().items():
        page = opened(chromium, view, tmp_path)
        if kind == "layers":
            page.evaluate("document.querySelector('.sv-controls button').click()")
        assert page.evaluate(CONTRAST) == [], kind


# -- issue 47: attention at real sizes ----------------------------------------------

OVERLAPS = """((selector, vertical) => {
  const boxes = [...document.querySelectorAll(selector)]
    .map((e) => e.getBoundingClientRect());
  const bad = [];
  for (let k = 1; k < boxes.length; k++) {
    const [a, b] = [boxes[k - 1], boxes[k]];
    const gap = vertical ? b.top - a.bottom : b.left - a.right;
    const room = vertical ? b.height : b.width;
    if (gap < -0.5 || room < 11) bad.push([k, gap, room]);
  }
  return [boxes.length, bad]; })"""


@pytest.mark.slow
@pytest.mark.parametrize("tokens", [512, 2048])
def test_attention_at_real_sizes_keeps_labels_apart_in_a_window(
    chromium, tmp_path, tokens
):
    """12 px cells under 11 px labels, in a window the fields move."""
    weights = causal_weights(1, tokens)
    labels = [f"{i}:" + LONG[i % 12] for i in range(tokens)]
    page = opened(chromium, attention_view(weights, labels), tmp_path)
    count, bad = page.evaluate(OVERLAPS + "('.sv-col', false)")
    assert 4 <= count < tokens
    assert bad == []
    count, bad = page.evaluate(OVERLAPS + "('.sv-row', true)")
    assert bad == []
    # move the window: query 300 on, the keys along the diagonal
    page.evaluate(
        "(() => { const f = document.querySelector("
        "'input[aria-label=\"queries from\"]');"
        " f.value = '300'; f.dispatchEvent(new Event('change')); })()"
    )
    canvas = "canvas.sv-heat"
    assert page.evaluate(f"document.querySelector('{canvas}').dataset.q0") == "300"
    k0 = int(page.evaluate(f"document.querySelector('{canvas}').dataset.k0"))
    assert k0 == 300
    shown = hover_cell(page, canvas, 2, 1)
    assert shown is not None
    assert shown.startswith(f"head 0\nquery 302: {labels[302]}\nkey 301: ")
    assert close(shown.splitlines()[3].split()[1], float(weights[0, 0, 302, 301]))
    assert page.errors() == []


@pytest.mark.slow
def test_attention_colour_scale_is_picked_and_shows_its_values(chromium, tmp_path):
    weights = causal_weights(2, 24)
    page = opened(chromium, attention_view(weights), tmp_path)
    ends = (
        "[...document.querySelectorAll('.sv-scale > span')].map((s) => s.textContent)"
    )
    low, high, label = page.evaluate(ends)[:3]
    assert float(low) == 0
    assert close(high, float(weights.max()))
    for index, word in ((1, "log scale"), (2, "99th percentile")):
        page.evaluate(
            "(() => { const s = document.querySelectorAll('select')[1];"
            f" s.value = '{index}'; s.dispatchEvent(new Event('change')); }})()"
        )
        low, high, label = page.evaluate(ends)[:3]
        assert word in label
    shown = [w for w in weights[0].flatten().tolist() if w > 0]
    assert float(high) <= max(shown) + 1e-6
    assert page.errors() == []


# -- issue 47: the static pictures, readable at real sizes ------------------------


def undrawn_ticks(fig) -> set[int]:
    """The ids of tick labels outside their axis' limits (made, not drawn)."""
    found = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            drawn = {id(tick) for tick in axis._update_ticks()}
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if id(tick) not in drawn:
                    found |= {id(tick.label1), id(tick.label2)}
    return found


def texts_apart(fig) -> list[str]:
    """Every pair of visible texts of ``fig`` that overlap, and any text outside it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.text import Text  # noqa: PLC0415 (the plot extra)

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    page = fig.bbox.padded(1)
    undrawn = undrawn_ticks(fig)
    boxes = [
        (text.get_text(), text.get_window_extent(renderer))
        for text in fig.findobj(Text)
        if id(text) not in undrawn and text.get_visible() and text.get_text().strip()
    ]
    boxes = [(name, box) for name, box in boxes if box.width > 0 and box.height > 0]
    found = [
        f"outside: {name!r}"
        for name, box in boxes
        if not (page.contains(box.x0, box.y0) and page.contains(box.x1, box.y1))
    ]
    for k, (name, box) in enumerate(boxes):
        found += [
            f"{name!r} overlaps {other!r}"
            for other, second in boxes[k + 1 :]
            if box.padded(-0.5).overlaps(second.padded(-0.5))
        ]
    return found


def big_views() -> dict[str, View]:
    """Each view at 512 positions with 40-character labels, and small."""
    tokens = [f"{i:03d}" + LONG[i % 12][3:] for i in range(512)]
    gen = torch.Generator().manual_seed(6)
    rnet = Recorder(deep_net(3, 18), input_size=(1, 4))
    return {
        "attention-512": attention_view(causal_weights(2, 512), tokens),
        "attention-12": attention_view(causal_weights(12, 12), LONG),
        "patching-512": patching_view(
            torch.randn(12, 512, generator=gen), layers=LONG, positions=tokens
        ),
        "patching-6": patching_view(GRID, layers=LONG[:4], positions=LONG[:6]),
        "lens-512": lens_view(
            torch.randn(12, 512, 20, generator=gen), tokens, layers=LONG
        ),
        "lens-5": lens_view(LENS, LONG[:5], decode=lambda i: LONG[i % 12]),
        "layers": layer_view(rnet),
        "ood": ood_view(evaluation()),
    }


@pytest.mark.slow
def test_every_picture_is_readable_at_real_sizes(tmp_path):
    """No two texts overlap, none leaves the picture; the PNGs are kept in tmp_path."""
    pytest.importorskip("matplotlib")
    for name, view in big_views().items():
        fig = view.figure()
        fig.savefig(tmp_path / f"{name}.png", dpi=100)
        assert texts_apart(fig) == [], name


def test_the_layer_picture_draws_every_row_asked_for():
    pytest.importorskip("matplotlib")
    rnet = Recorder(deep_net(3, 18), input_size=(1, 4))
    view = layer_view(rnet)
    fig = view.figure()
    drawn = max(fig.texts, key=lambda t: len(t.get_text())).get_text().splitlines()
    assert len(drawn) == len(rnet.table)  # every row, at every depth
    assert [line.split()[0] for line in drawn] == [
        "-".join(map(str, label)) for label in rnet.table
    ]
    fig = view.figure(depth=1)
    drawn = max(fig.texts, key=lambda t: len(t.get_text())).get_text().splitlines()
    assert len(drawn) == 1 + 3 + 1  # the net, its 3 blocks, the line of the rest
    assert (
        drawn[-1]
        == f"({len(rnet.table) - 4} deeper rows: figure(depth=...) or the HTML view)"
    )

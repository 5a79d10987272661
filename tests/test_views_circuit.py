"""The circuit view: its data from the scores, its page in a browser."""

from __future__ import annotations

import pytest
import torch

from scio_recorder.explain import EdgeScores
from scio_recorder.views import circuit_view
from tests import browser
from tests.test_views import opened, tip


def scores() -> EdgeScores:
    values = torch.tensor(
        [[0.5, -2.0, 0.1, 1.0], [0.0, 0.0, 0.75, -0.25], [0.0, 0.0, 0.0, 3.0]],
        dtype=torch.float64,
    )
    real = torch.tensor(
        [[True] * 4, [False, False, True, True], [False, False, False, True]]
    )
    return EdgeScores(
        values, ["input", "a0.h0", "m0"], ["a0.h0<q>", "a0.h0<k>", "m0", "logits"], real
    )


def test_circuit_data_places_nodes_by_layer_and_keeps_scores() -> None:
    view = circuit_view(scores(), n=4)
    names = [node["name"] for node in view.data["nodes"]]
    assert names == ["input", "a0.h0", "m0", "logits"]
    assert [node["col"] for node in view.data["nodes"]] == [0, 1, 2, 3]
    got = {(e["source"], e["destination"]): e["value"] for e in view.data["edges"]}
    assert got == {
        ("m0", "logits"): 3.0,
        ("input", "a0.h0<k>"): -2.0,
        ("input", "logits"): 1.0,
        ("a0.h0", "m0"): 0.75,
    }
    assert view.data["largest"] == 3.0
    chosen = circuit_view(scores(), [("input", "a0.h0<q>")])
    assert [e["to"] for e in chosen.data["edges"]] == [1]  # the head's node
    with pytest.raises(KeyError):
        circuit_view(scores(), [("m0", "a0.h0<q>")])


@pytest.fixture(scope="module")
def chromium():
    found = browser.start()
    if found is None:
        pytest.skip("no headless Chromium starts here: the browser tests are skipped")
    yield found
    found.close()


@pytest.mark.slow
def test_circuit_page_shows_each_edges_score_on_hover(chromium, tmp_path) -> None:
    view = circuit_view(scores(), n=5)
    page = opened(chromium, view, tmp_path)
    count = page.evaluate("document.querySelectorAll('path.sv-edge').length")
    assert count == len(view.data["edges"]) == 5
    for i, edge in enumerate(view.data["edges"]):
        box = page.evaluate(
            "(() => { const p = document.querySelector("
            f"'path.sv-edge[data-i=\"{i}\"]');"
            " const n = p.getTotalLength(); const q = p.getPointAtLength(n / 2);"
            " const r = p.ownerSVGElement.getBoundingClientRect();"
            " return [r.left + q.x, r.top + q.y]; })()"
        )
        page.hover(*box)
        shown = tip(page)
        assert shown is not None
        assert shown.startswith(f"{edge['source']} \u2192 {edge['destination']}\n")
        assert float(shown.rsplit(": ", 1)[1]) == pytest.approx(edge["value"], rel=1e-3)
    page.hover(1, 1)
    assert tip(page) is None


@pytest.mark.slow
def test_circuit_picture_and_page_are_saved(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    view = circuit_view(scores(), n=3)
    assert view.figure().axes
    assert view.save(tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")
    page = view.save(tmp_path / "c.html").read_text(encoding="utf-8")
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")

"""The token view: its data against the scores, and its page in a browser.

As ``tests/test_views.py``: the page opens in headless Chromium (skipped,
saying so, when none starts), reports no error, loads nothing, and
hovering a token shows that token's score.
"""

from __future__ import annotations

import math

import pytest
import torch

from scio_recorder.views import View, token_view
from tests import browser

TOKENS = ["The", " cat", " sat", " on", " the", " mat", "<pad>"]
NAN = float("nan")
SCORES = {
    "surprisal": torch.tensor([NAN, 2.5, 0.25, 1.0, 0.125, 4.0, NAN]),
    "mahalanobis": torch.tensor([10.0, 12.5, 11.0, 30.0, 9.5, 14.0, NAN]),
}


def view() -> View:
    return token_view(TOKENS, SCORES, title="two scores")


def test_token_view_data_holds_every_score_and_its_range() -> None:
    data = view().data
    assert data["tokens"] == TOKENS
    assert [s["name"] for s in data["scores"]] == list(SCORES)
    for panel, values in zip(data["scores"], SCORES.values(), strict=True):
        finite = values[values.isfinite()]
        assert panel["low"] == float(finite.min())
        assert panel["high"] == float(finite.max())
        for shown, value in zip(panel["values"], values.tolist(), strict=True):
            assert (shown is None) == math.isnan(value)
            assert shown is None or shown == value


def test_token_view_refusals_and_one_score() -> None:
    with pytest.raises(ValueError, match="has 2 values for 7 tokens"):
        token_view(TOKENS, {"x": torch.zeros(2)})
    with pytest.raises(ValueError, match="scores is empty"):
        token_view(TOKENS, {})
    one = token_view(TOKENS[:2], torch.tensor([1.0, 2.0]))
    assert one.data["scores"][0]["name"] == "score"


@pytest.mark.slow
def test_token_view_picture_is_drawn(tmp_path: object) -> None:
    pytest.importorskip("matplotlib")
    path = view().save(f"{tmp_path}/tokens.png")
    assert path.stat().st_size > 1000


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


def tip(page: browser.Page) -> str | None:
    return page.evaluate(
        "(() => { const t = document.getElementById('sv-tip');"
        " return t.hidden ? null : t.textContent; })()"
    )


@pytest.mark.slow
def test_token_page_shows_each_tokens_score_on_hover(chromium, tmp_path) -> None:
    page_view = view()
    path = page_view.save(tmp_path / "tokens.html")
    page = chromium.page(1000, 700)
    page.load(path.as_uri())
    assert page.errors() == []
    assert page.requested() == [path.as_uri()]  # nothing else, from anywhere
    assert browser.inked(page.screenshot()) > 0.01
    for k, (name, values) in enumerate(SCORES.items()):
        for i in (0, 1, 3, 6):
            x, y = page.center(
                f".sv-token-panel[data-score='{k}'] .sv-token[data-index='{i}']"
            )
            page.hover(x, y)
            shown = tip(page)
            assert shown is not None
            lines = shown.splitlines()
            assert lines[0] == name
            assert lines[1] == f'token {i}: "{TOKENS[i]}"'
            value = float(values[i])
            if math.isnan(value):
                assert lines[2] == "score: no score"
            else:
                got = float(lines[2].rsplit(": ", 1)[1])
                assert math.isclose(got, value, rel_tol=5e-4)
    # the panels sit side by side, and the most surprising token is the reddest
    lefts = page.evaluate(
        "[...document.querySelectorAll('.sv-token-panel')]"
        ".map((e) => e.getBoundingClientRect().left)"
    )
    assert lefts[1] > lefts[0]
    alpha = page.evaluate(
        "[...document.querySelectorAll(\".sv-token-panel[data-score='0'] .sv-token\")]"
        ".map((e) => getComputedStyle(e).backgroundColor)"
    )
    assert alpha[5].startswith("rgba(214, 39, 40, 0.85")
    page.hover(1, 1)
    assert tip(page) is None

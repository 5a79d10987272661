"""Shared fixtures: the seed, the reference toy net and golden-file checks.

The tests run torch on one thread unless ``OMP_NUM_THREADS`` says otherwise:
on a machine whose cores are busy with other work, torch's threads spin
waiting for each other, and a test doing small matrix products took 10 to
100 times longer on two threads than on one (the whole run: 13 minutes on
two cores shared with a dozen jobs). ``OMP_NUM_THREADS=2 python -m pytest``
runs them on two.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from torch import nn

if TYPE_CHECKING:
    from collections.abc import Callable

EXPECTED_DIR = Path(__file__).parent / "expected"


def pytest_configure(config: pytest.Config) -> None:
    """Run torch on one thread, unless ``OMP_NUM_THREADS`` is set."""
    if not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--update-expected``, which rewrites the golden files."""
    parser.addoption(
        "--update-expected",
        action="store_true",
        default=False,
        help="Rewrite the golden files under tests/expected/ instead of comparing.",
    )


@pytest.fixture(autouse=True)
def seed() -> None:
    """Make every test start from the same torch random state."""
    torch.manual_seed(0)


@pytest.fixture
def toynet() -> nn.Sequential:
    """The reference's toy net: ``Linear(5, 4), ReLU, Linear(4, 3), ReLU``."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3), nn.ReLU())


@pytest.fixture
def expected(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """Return ``check(name, text)``: compare ``text`` with ``tests/expected/name``.

    With ``--update-expected`` the file is rewritten with ``text`` instead.
    """
    update = request.config.getoption("--update-expected")

    def check(name: str, text: str) -> None:
        path = EXPECTED_DIR / name
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            return
        assert path.exists(), f"{path} is missing: run pytest with --update-expected"
        assert text == path.read_text(encoding="utf-8")

    return check

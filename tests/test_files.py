"""`scio_recorder._support.files`: atomic writes, the library version, dtype names."""

from __future__ import annotations

import os
import re
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

import scio_recorder
from scio_recorder._support import files as _files
from scio_recorder._support.files import (
    DTYPES,
    dtype_name,
    library_version,
    parse_dtype,
    write_atomic,
)


def test_an_error_while_writing_leaves_the_target_and_no_temporary_file(tmp_path):
    """Whole or not at all: the old content stays, the temporary file goes."""
    target = tmp_path / "state.json"
    target.write_text("old")

    def fail(path: Path) -> None:
        path.write_text("half of the new")
        msg = "disk full"
        raise OSError(msg)

    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, fail)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_keyboard_interrupt_also_removes_the_temporary_file(tmp_path):
    def interrupt(path: Path) -> None:
        path.write_text("x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(tmp_path / "a", interrupt)
    assert list(tmp_path.iterdir()) == []


def test_a_durable_write_fsyncs_the_file_then_the_folder(tmp_path, monkeypatch):
    """The rename is made durable too: the folder is synced after the replace."""
    synced: list[tuple[str, bool]] = []
    real = os.fsync

    def spy(fd: int) -> None:
        path = Path(f"/proc/self/fd/{fd}").readlink()
        synced.append((path.name, (tmp_path / "a.txt").exists()))
        real(fd)

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to name the synced descriptors")
    monkeypatch.setattr(_files.os, "fsync", spy)
    write_atomic(tmp_path / "a.txt", lambda path: path.write_text("hi"))
    assert len(synced) == 2
    (temporary, existed_before), (folder, existed_after) = synced
    assert re.fullmatch(r"\.a\.txt\..*\.tmp", temporary)
    assert not existed_before  # the file, before the replace
    assert folder == tmp_path.name
    assert existed_after  # the folder, after it
    synced.clear()
    write_atomic(tmp_path / "b.txt", lambda path: path.write_text("hi"), durable=False)
    assert synced == []


def test_the_temporary_files_are_recognised_by_their_target(tmp_path):
    assert _files.is_temporary(tmp_path / ".m.json.x1y2.tmp", "m.json")
    assert not _files.is_temporary(tmp_path / ".m.json.x1y2.tmp", "n.json")
    assert not _files.is_temporary(tmp_path / "m.json", "m.json")


def test_one_library_version_for_files_and_the_cli():
    """The CLI's --version and the files' metadata read the same function."""
    from scio_recorder import io  # noqa: PLC0415 (the users checked)
    from scio_recorder.cli import _parser  # noqa: PLC0415
    from scio_recorder.collect import _checkpoint  # noqa: PLC0415

    assert library_version() == scio_recorder.__version__
    assert io.library_version is _parser.library_version is library_version
    assert _checkpoint.library_version is library_version


@given(st.sampled_from(sorted(DTYPES.values(), key=str)))
def test_dtype_names_round_trip(dtype):
    assert parse_dtype(dtype_name(dtype)) is dtype


def test_the_map_has_one_name_per_dtype_and_refuses_aliases():
    assert len(set(DTYPES.values())) == len(DTYPES)
    assert DTYPES["float32"] is torch.float32
    with pytest.raises(ValueError, match=r"^unknown dtype 'half' \(a file names"):
        parse_dtype("half")
    with pytest.raises(ValueError, match=r"^unknown dtype 'Tensor'"):
        parse_dtype("Tensor")  # an attribute of torch, not a dtype


def test_the_dtype_names_are_used_by_every_writer():
    from scio_recorder import io  # noqa: PLC0415 (the users checked)
    from scio_recorder.collect import _checkpoint, _distributed, _spill  # noqa: PLC0415

    assert io.dtype_name is _spill.dtype_name is _distributed.dtype_name is dtype_name
    assert _checkpoint.parse_dtype is _spill.parse_dtype is parse_dtype

"""The lock file of a folder that one run at a time may write.

Holds :class:`FolderLock` (created atomically with the owner's pid, host,
start time and a random token; released only by its owner; a lock left by a
process of this host that no longer runs is taken over, with a warning),
:func:`pid_alive` and :func:`describe_owner`.

Why: two runs sharing a folder would truncate and append each other's files
and overwrite each other's checkpoints, silently. The spill folders of
:func:`scio_recorder.collect.collect` and the activation sets written by
:func:`scio_recorder.activations.write` are guarded by this one mechanism
(each names its lock file, and itself and its option in the messages).
"""

from __future__ import annotations

__all__ = ["FolderLock", "describe_owner", "pid_alive"]

import contextlib
import datetime as dt
import json
import logging
import os
import secrets
import socket
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

# The locks this process holds (path -> token), to tell a lock of another
# thread of this process (live) from one left by an earlier process that had
# the same pid (stale).
_HELD: dict[str, str] = {}
_HELD_LOCK = threading.Lock()


class FolderLock:
    """The lock file of a folder: one run at a time per folder.

    :meth:`acquire` creates ``folder/<name>`` atomically
    (``O_CREAT | O_EXCL``) with the owner's pid, host, start time and a
    random token; :meth:`release` removes it if it is still this run's. A
    lock whose owner is a process of this host that no longer runs is stale:
    it is taken over, with a warning. Any other lock (a live process, another
    thread of this process, another host) makes :meth:`acquire` raise.

    ``tool`` names the kind of run in the messages (``"collect"``),
    ``option`` the argument that chose the folder (``"spill_dir"``),
    ``files`` what two runs would overwrite (``"rows and checkpoints"``);
    the warning of a take-over goes to the logger ``logger``, and to
    :func:`warnings.warn` with ``stacklevel`` (the caller of the public
    function).
    """

    def __init__(  # noqa: PLR0913 (what the messages name)
        self,
        folder: Path,
        *,
        name: str,
        tool: str,
        option: str,
        files: str,
        logger: str,
        stacklevel: int = 4,
    ) -> None:
        self.folder = folder
        self.path = folder / name
        self.name = name
        self.tool = tool
        self.option = option
        self.files = files
        self.logger = logging.getLogger(logger)
        self.stacklevel = stacklevel
        self.token: str | None = None

    def acquire(self) -> None:
        """Take the lock, or raise ``RuntimeError`` naming its live owner."""
        self.folder.mkdir(parents=True, exist_ok=True)
        token = secrets.token_hex(8)
        owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "token": token,
        }
        text = json.dumps(owner, indent=1).encode()
        for _ in range(8):  # each retry follows the removal of a stale lock
            try:
                handle = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            try:
                os.write(handle, text)
            finally:
                os.close(handle)
            self.token = token
            with _HELD_LOCK:
                _HELD[str(self.path.resolve())] = token
            return
        msg = (
            f"Could not lock '{self.folder}': its lock file '{self.path}' keeps "
            f"reappearing. Another run is starting there: use another `{self.option}`."
        )
        raise RuntimeError(msg)

    def release(self) -> None:
        """Remove the lock file if this run still owns it."""
        if self.token is None:
            return
        with _HELD_LOCK:
            _HELD.pop(str(self.path.resolve()), None)
        owner = self._read()
        if owner is not None and owner.get("token") == self.token:
            self.path.unlink(missing_ok=True)
        self.token = None

    def _read(self) -> dict[str, Any] | None:
        """Return the owner written in the lock file (None: no lock file)."""
        for _ in range(20):  # a lock just created may not be written yet
            try:
                text = self.path.read_text(encoding="utf-8")
            except FileNotFoundError:
                return None
            try:
                owner = json.loads(text)
            except ValueError:
                owner = None
            if isinstance(owner, dict):
                return owner
            time.sleep(0.025)
        return {}  # unreadable: an owner we cannot name, treated as live

    def _take_over_if_stale(self) -> None:
        owner = self._read()
        if owner is None:  # released meanwhile: try again
            return
        if not self._is_stale(owner):
            raise RuntimeError(self._busy_message(owner))
        # Move the stale lock aside (atomic: one taker wins), and check that
        # what was moved is the lock judged stale, not a new one.
        aside = self.folder / f".{self.name}.{secrets.token_hex(6)}.stale"
        try:
            self.path.rename(aside)
        except FileNotFoundError:
            return
        try:
            moved = json.loads(aside.read_text(encoding="utf-8"))
        except ValueError:
            moved = {}
        if moved != owner:  # a fresh lock: put it back (never over another)
            with contextlib.suppress(FileExistsError, FileNotFoundError):
                os.link(aside, self.path)
            aside.unlink(missing_ok=True)
            return
        aside.unlink(missing_ok=True)
        msg = (
            f"{self.tool}: '{self.folder}' was locked by {describe_owner(owner)}, "
            "which no longer runs: taking the stale lock over."
        )
        warnings.warn(msg, RuntimeWarning, stacklevel=self.stacklevel)
        self.logger.warning("%s", msg)

    def _is_stale(self, owner: dict[str, Any]) -> bool:
        pid, host = owner.get("pid"), owner.get("host")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return False
        if host != socket.gethostname():
            return False  # cannot tell whether it runs
        if pid == os.getpid():
            with _HELD_LOCK:
                held = _HELD.get(str(self.path.resolve()))
            return held is None or held != owner.get("token")
        return not pid_alive(pid)

    def _busy_message(self, owner: dict[str, Any]) -> str:
        who = describe_owner(owner) if owner else "an owner it does not name"
        if owner.get("pid") == os.getpid() and owner.get("host") == (
            socket.gethostname()
        ):
            who += " (this process: another thread)"
        return (
            f"'{self.folder}' is in use by another {self.tool} run: locked by "
            f"{who} (lock file '{self.path}'). Two runs in one `{self.option}` "
            f"would overwrite each other's {self.files}. Wait for that run to "
            f"end, use another `{self.option}`, or delete the lock file if you "
            "are sure no run uses the folder."
        )


def describe_owner(owner: Mapping[str, Any]) -> str:
    return (
        f"pid {owner.get('pid')} on host {owner.get('host')!r}, "
        f"started {owner.get('started')}"
    )


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (unknown: True)."""
    if os.name == "nt":  # os.kill(pid, 0) would terminate it
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # runs, as another user
        return True
    except OSError:
        return True
    return True

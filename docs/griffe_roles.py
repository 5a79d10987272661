"""Griffe extension: turn the docstrings' Sphinx roles into working links.

The package's docstrings use Sphinx roles (``:func:`~scio_recorder.collect```,
``:meth:`record```), which read well in ``help()`` and IDEs but which
mkdocstrings shows as raw text. Once the package is loaded, each role becomes
an optional mkdocs-autorefs link to the object it names, resolved the way
Sphinx resolves it: a dotted path from the package, or a name relative to the
documented object, its class, its module, then the package. ``~`` keeps only
the last part as the title. Names outside the package (``torch.compile``)
stay code: no inventory of theirs is available offline.

Docstring tables wrap a long cell onto a continuation row whose first cell
is empty (``| | more of the cell |``: lines are limited to 88 characters);
:func:`joined_rows` joins such a row to the row above, cell by cell, so
that the page shows one row, not a row and an empty one.

It also drops, from the docstring of a subpackage's face, the paragraph
that maps its private modules for developers ("This package is the public
face; ..."): readers of the API pages cannot import those modules, and
``help()`` still shows it (:func:`public_only`).

Loaded by ``mkdocs.yml`` (``mkdocstrings`` -> ``extensions``);
``docs/hooks.py`` fails the build if a role is left in a page.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import griffe

if TYPE_CHECKING:
    from collections.abc import Iterator

ROLE = re.compile(
    r":(?:py:)?(?P<role>func|meth|class|mod|attr|data|exc|obj|const|term)"
    r":`(?P<target>[^`]+)`"
)
"""A Sphinx role in a docstring: ``:func:`name``` (``:py:func:`` too)."""

PACKAGE = "scio_recorder"


def _walk(obj: griffe.Object) -> Iterator[griffe.Object]:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)  # type: ignore[arg-type]


def _lookup(scope: griffe.Object, path: str) -> griffe.Object | None:
    errors = (
        KeyError,
        ValueError,
        griffe.AliasResolutionError,
        griffe.CyclicAliasError,
    )
    try:
        found = scope[path]
    except errors:
        # A class's inherited members (``Recorder.activations`` is defined
        # on its base ``RecorderViews``), linked where the class documents
        # them (inherited members are rendered on its page): the alias's path.
        return scope.all_members.get(path) if scope.is_class else None
    if found.is_alias and getattr(found, "inherited", False):
        return found  # an inherited member: linked on the class's own page
    try:
        return found.final_target if found.is_alias else found
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _resolve(
    obj: griffe.Object, package: griffe.Object, target: str
) -> griffe.Object | None:
    """Return the object ``target`` names from ``obj``'s docstring, or None."""
    target = target.lstrip(".")
    if target == PACKAGE:
        return package
    if target.startswith(f"{PACKAGE}."):
        return _lookup(package, target.removeprefix(f"{PACKAGE}."))
    scopes: list[griffe.Object] = []
    scope: griffe.Object | None = obj
    while scope is not None:
        scopes.append(scope)
        scope = scope.parent
    for candidate in scopes:
        found = _lookup(candidate, target)
        if found is not None:
            return found
    return None


def convert(text: str, obj: griffe.Object, package: griffe.Object) -> str:
    """Return ``text`` with every Sphinx role replaced by a link or code."""

    def replace(match: re.Match[str]) -> str:
        target = match["target"].strip()
        short = target.startswith("~")
        target = target.lstrip("~")
        title = target.rsplit(".", 1)[-1] if short else target
        if match["role"] in {"func", "meth"}:
            title += "()"
        found = _resolve(obj, package, target)
        if found is None:
            return f"`{title}`"
        return (
            f'<autoref identifier="{found.path}" optional>'
            f"<code>{title}</code></autoref>"
        )

    return ROLE.sub(replace, text)


_PRIVATE_MAP = re.compile(
    r"(?:^|\n\n)This (?:package|subpackage) is the public face;.*?(?=\n\n|\Z)",
    re.DOTALL,
)


def public_only(text: str) -> str:
    r"""Return ``text`` without the paragraph mapping a face's private modules.

    Examples
    --------
    >>> public_only("Views.\n\nThis package is the public face; ``_base``.\n\nMore.")
    'Views.\n\nMore.'

    """
    return _PRIVATE_MAP.sub("", text)


_ROW = re.compile(r"^(?P<indent>\s*)\|(?P<cells>.*)\|\s*$")


def joined_rows(text: str) -> str:
    r"""Return ``text`` with each table row whose first cell is empty joined above.

    Examples
    --------
    >>> print(joined_rows("| a | b |\n|---|---|\n| x | y, |\n| | z |"))
    | a | b |
    |---|---|
    | x | y, z |

    """
    lines: list[str] = []
    for line in text.split("\n"):
        row = _ROW.match(line)
        above = _ROW.match(lines[-1]) if lines else None
        cells = row["cells"].split("|") if row else []
        if row and above and cells and not cells[0].strip() and len(cells) > 1:
            previous = above["cells"].split("|")
            if len(previous) == len(cells) and not set(previous[0].strip()) <= {
                "-",
                ":",
            }:
                merged = [
                    f" {a.strip()} {b.strip()} ".replace("  ", " ") if b.strip() else a
                    for a, b in zip(previous, cells, strict=True)
                ]
                lines[-1] = f"{above['indent']}|{'|'.join(merged)}|"
                continue
        lines.append(line)
    return "\n".join(lines)


class SphinxRoles(griffe.Extension):
    """Rewrite the Sphinx roles of every docstring of the loaded package."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:  # noqa: ARG002 (griffe's signature)
        """Convert the docstrings once the whole package is loaded."""
        if pkg.name != PACKAGE:
            return
        for obj in _walk(pkg):
            if obj.docstring is not None:
                text = public_only(obj.docstring.value) if obj.is_module else None
                text = joined_rows(text or obj.docstring.value)
                obj.docstring.value = convert(text, obj, pkg)

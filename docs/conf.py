"""Sphinx configuration: the guide pages and the API reference, built from the docstrings.

Build (what ``tox -e docs`` runs; warnings fail it)::

    sphinx-build -W --keep-going -c docs -b html . build/docs

The source directory is the repository root, so README.md, CHANGELOG.md and the
pages in docs/ link to each other by the same relative paths as on disk.
"""

from __future__ import annotations

import ast
import importlib
import sys
import types
import typing
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from capkv._version import __version__  # noqa: E402

project = "capkv"
author = "capkv contributors"
copyright = "capkv contributors"  # noqa: A001
version = release = __version__

extensions = ["sphinx.ext.autodoc", "myst_parser"]
root_doc = "docs/index"
include_patterns = ["README.md", "CHANGELOG.md", "docs/**"]
exclude_patterns = ["build", ".tox", "**/__pycache__"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}

myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True

html_theme = "furo"
html_title = f"capkv {release}"


def _attribute_docstring(app: Any, what: str, name: str, obj: object, options: Any, lines: list[str]) -> None:
    """A front's constant or alias (``capkv.BlockIds``) gets the docstring written where it is defined.

    Sphinx reads attribute docstrings from the documented module's source; a front
    only names the attribute, its defining private module holds the text.
    """
    if what != "data":
        return
    front, _, attribute = name.rpartition(".")
    from capkv import _homes  # noqa: PLC0415
    from sphinx.pycode import ModuleAnalyzer  # noqa: PLC0415

    for defining, names in _homes._FRONTS.get(front, {}).items():  # noqa: SLF001
        if attribute in names:
            written = ModuleAnalyzer.for_module(defining).find_attr_docs().get(("", attribute))
            if written:  # the text written for it, not its type's (a dict's docstring for a dict)
                lines[:] = list(written)


class FrontDirective(SphinxDirective):
    """``.. capkv-front:: capkv.engine``: the module's docstring, then every name in its ``__all__``.

    The names come from the front itself, so the reference cannot miss one or show
    a private helper; a name another front defines (``capkv.ConfigError``) links there.
    """

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        front = self.arguments[0]
        try:
            module = importlib.import_module(front)
            values = {name: getattr(module, name) for name in module.__all__}
        except ImportError as exc:  # an extra's front (capkv.vllm) where the extra is not installed
            return self.parse_text_to_nodes(_unimportable(front, exc))
        lines = [f".. automodule:: {front}", "   :no-members:", ""]
        elsewhere: list[str] = []
        for name, value in values.items():
            is_class = isinstance(value, type) and not isinstance(value, types.GenericAlias) and value is not typing.Any
            home = value.__module__ if is_class or isinstance(value, types.FunctionType) else front
            if home != front:
                elsewhere.append(f":py:obj:`{home}.{name}`")
                continue
            if is_class:
                kind = "autoexception" if issubclass(value, BaseException) else "autoclass"
                lines += [f".. {kind}:: {front}.{name}", "   :members:", "   :show-inheritance:", ""]
            elif isinstance(value, types.FunctionType):
                lines += [f".. autofunction:: {front}.{name}", ""]
            else:
                lines += [f".. autodata:: {front}.{name}", "   :no-value:", ""]
        if elsewhere:
            lines += ["Also exported here: " + ", ".join(elsewhere) + ".", ""]
        return self.parse_text_to_nodes("\n".join(lines))


def _unimportable(front: str, error: ImportError) -> str:
    """A front that needs an optional dependency: its docstring and names, read from the source."""
    path = ROOT.joinpath(*front.split(".")).with_suffix(".py")
    tree = ast.parse(path.read_text())
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(ast.unparse(t) == "__all__" for t in node.targets):
            names = list(ast.literal_eval(node.value))
    return "\n".join([
        f".. py:module:: {front}",
        "",
        ast.get_docstring(tree) or "",
        "",
        f".. note:: Built without the dependency {front} needs ({error.name}): its names, "
        + ", ".join(f"``{name}``" for name in names)
        + ", are documented from their docstrings where it is installed.",
        "",
    ])


def setup(app: Any) -> None:
    app.connect("autodoc-process-docstring", _attribute_docstring)
    app.add_directive("capkv-front", FrontDirective)

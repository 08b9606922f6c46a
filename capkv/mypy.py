"""mypy plugin: ``MultiConnector`` stacks that say *why* they are not HMA-capable.

Enable it in the mypy configuration::

    [mypy]
    plugins = capkv.mypy

Without the plugin mypy already rejects a non-HMA stack where an HMA-capable
connector is required: the overloads of ``MultiConnector.__new__`` decide. The
plugin changes messages, never verdicts:

* a ``MultiConnector(...)`` call keeps every child's type at any arity (the
  overloads stop at eight), nested stacks included, and follows the documented
  policy for children typed ``Any``: they do not prove the stack HMA-capable, so
  the stack is a plain ``MultiConnector`` (plain mypy answers ``Any`` there);
* where such a call's result must be HMA-capable — an argument, an assignment,
  a return value, or the receiver of ``request_finished_all_groups`` — the one
  error names every offending child by position and class, with its own code
  ``capkv-hma``, in the words :func:`capkv.check_stack` and ``capkv check`` use;
* a child that is not a ``KVConnector`` at all gets, instead of a list of every
  overload, one error per child (code ``capkv-connector``) naming the members
  that differ and how: missing, a parameter renamed, missing or of the wrong
  type, a wrong return type (:mod:`capkv._mypy_conformance`).

A stack stored in a variable first keeps its precise type, but where that
variable is used mypy's own message stands (plugins cannot hook it).
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if not TYPE_CHECKING:  # registered before the plugin loads, so plugin.__module__ is this front
    __getattr__, __dir__ = attach(__name__, {"capkv._mypy_plugin": ["plugin"]})

from capkv._mypy_plugin import plugin  # noqa: E402 - mypy looks the entry point up as a plain attribute

__all__ = ["plugin"]

del TYPE_CHECKING, attach  # dir(), vars(): the plugin's entry point only

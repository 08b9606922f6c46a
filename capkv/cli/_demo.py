"""``capkv demo``: serve a hybrid model through a connector stack, twice, and verify every byte.

This module ties the options, the two runs and the report together and turns failures into one line
(docs/internals.md, "The command line").
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from capkv.cli._check import import_user_module
from capkv.cli._demo_options import (
    add_arguments,
    cpu_blocks,
    require_memory,
    shape_of,
    store_directory,
    with_options,
    workload_of,
)
from capkv.cli._demo_report import print_setup
from capkv.cli._demo_serve import serve
from capkv.cli._stack_spec import parse_stack
from capkv.cli._stack_tree import Findings, inspect_stack
from capkv.config._build import BuildContext
from capkv.config._loader import load_stack
from capkv.config._registry import default_registry
from capkv.engine import Engine
from capkv.errors import CapkvError

__all__ = ["add_arguments", "run"]


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # "module:Class" paths resolve like ``python -m``, as in capkv check
    try:
        shape, workload = shape_of(args), workload_of(args)
        require_memory(shape)
        for module in args.imports:
            import_user_module(module)
        configured = load_stack(with_options(parse_stack(args.stack), promote=args.promote), registry=default_registry)
    except CapkvError as error:
        return _fail(error)
    torch.set_num_threads(args.threads)
    with store_directory(args.store_dir) as directory:
        context = BuildContext(
            spec=shape.kv_spec(),
            defaults={"capacity_blocks": cpu_blocks(args), "root": str(directory), "url": args.redis_url},
        )
        findings = Findings()
        try:
            root = inspect_stack(configured, context=context, findings=findings)
        except ImportError as error:  # an optional dependency, e.g. the redis store without capkv[redis]
            return _fail_line(f"refused before serving: {error}")
        stack = root.built
        if findings.problems or findings.errors or stack is None:
            print_setup(out, shape, workload, root)
            reasons = [*findings.problems, *findings.errors, *root.unbuilt_because]
            return _fail_line(f"refused before serving: {reasons[0] if reasons else 'the stack was not built'}")
        print_setup(out, shape, workload, root)
        try:
            engine = Engine(shape, stack)
        except CapkvError as error:
            out.write("\n")
            _shut_down(stack)
            return _fail(error, "refused before serving")
        except (RuntimeError, MemoryError) as error:  # torch could not allocate the paged KV cache
            out.write("\n")
            _shut_down(stack)
            return _fail_line(f"refused before serving: cannot allocate the KV cache: {type(error).__name__}: {error}")
        out.write(f"check_stack: ok, the stack serves all {len(shape.groups)} KV-cache groups\n\n")
        try:
            return serve(out, engine, workload, stack, tiered=args.tiered)
        except (CapkvError, OSError) as error:
            out.write("\n")
            return _fail(error, "stopped while serving")


def _shut_down(stack: object) -> None:
    """Stop a stack the engine never took (its stores' writer threads)."""
    try:
        shutdown = getattr(stack, "shutdown", None)
        if callable(shutdown):
            shutdown()
    except Exception:  # noqa: BLE001 - the refusal already being reported is what matters
        pass


def _fail(error: CapkvError | OSError, context: str = "error") -> int:
    return _fail_line(f"{context}: {type(error).__name__}: {error}")


def _fail_line(message: str) -> int:
    """One line on stderr (whatever a connector's message held), exit status 2."""
    sys.stdout.flush()
    print(f"capkv demo: {' '.join(message.split())}", file=sys.stderr)
    return 2

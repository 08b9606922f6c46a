"""Testing a connector: the conformance kit, the null connector, engine-side objects.

The kit serves your connector through the reference engine, which verifies every byte (guide § 13); open
``_conformance.py`` first.
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if TYPE_CHECKING:
    from capkv.engine._outputs import ScheduledRequest
    from capkv.testing._conformance import ConformanceFactory, assert_conformant, check_connector
    from capkv.testing._layouts import DEFAULT_LAYOUTS, DEFAULT_WORKLOAD, describe_layout
    from capkv.testing._null import HMANullConnector, NullConnector
    from capkv.testing._objects import forward_context, kv_caches, make_request, scheduled, scheduler_output
    from capkv.testing._report import ConformanceFailure, ConformanceReport, ScenarioResult

__all__ = [
    "DEFAULT_LAYOUTS",
    "DEFAULT_WORKLOAD",
    "ConformanceFailure",
    "ConformanceReport",
    "ConformanceFactory",
    "HMANullConnector",
    "NullConnector",
    "ScenarioResult",
    "ScheduledRequest",
    "assert_conformant",
    "check_connector",
    "describe_layout",
    "forward_context",
    "kv_caches",
    "make_request",
    "scheduled",
    "scheduler_output",
]

if not TYPE_CHECKING:  # checkers read the imports above (see capkv._lazy)
    __getattr__, __dir__ = attach(
        __name__,
        {
            "capkv.engine._outputs": ["ScheduledRequest"],
            "capkv.testing._conformance": ["ConformanceFactory", "assert_conformant", "check_connector"],
            "capkv.testing._layouts": ["DEFAULT_LAYOUTS", "DEFAULT_WORKLOAD", "describe_layout"],
            "capkv.testing._null": ["HMANullConnector", "NullConnector"],
            "capkv.testing._objects": ["forward_context", "kv_caches", "make_request", "scheduled", "scheduler_output"],
            "capkv.testing._report": ["ConformanceFailure", "ConformanceReport", "ScenarioResult"],
        },
    )

del TYPE_CHECKING, attach  # dir(), vars(): the front's names only

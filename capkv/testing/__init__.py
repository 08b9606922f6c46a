"""Testing a connector: the conformance kit, the null connector, engine-side objects.

Run the kit from your own tests::

    from capkv.testing import assert_conformant

    def test_my_connector_conforms(tmp_path):
        assert_conformant(lambda spec: MyConnector(spec))

:func:`check_connector` serves connectors from your factory on hybrid layouts
(1 to 4 KV-cache groups, sliding windows, block sizes 8 to 32, 2- and 4-byte
dtypes), cold then warm, alone and inside ``MultiConnector`` stacks with
:class:`~capkv.connectors.CPUOffloadConnector`, through the reference engine,
which verifies every byte and the completion protocol; it returns a
:class:`ConformanceReport` with what loaded, per group. :func:`assert_conformant`
raises :class:`ConformanceFailure` (an ``AssertionError``) with the report.

For unit tests: :class:`NullConnector` / :class:`HMANullConnector` (every member,
nothing moved, every call recorded), and builders of the engine's objects.
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

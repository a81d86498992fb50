"""PARSE's server-wide totals and averages in `get_server_info()`.

Per scheduler, `Engine.get_server_info()["internal_states"][i]["parse"]` (HTTP `/server_info`
likewise) is the PARSE worker's `ServerTotals.summary()`: counts since startup and the averages
derived from them (shape: `parse_sglang/counters.py`), and on an adaptive server its measured
cost table (`cost_table`: what `python -m parse_sglang.tools.profile_cost` writes).

What it changes: an AFTER hook on SGLang's
`SchedulerInternalStateController._add_speculative` (which adds `avg_spec_accept_length`)
adds the "parse" entry when the scheduler's draft worker keeps PARSE totals.
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.counters import ServerTotals
from parse_sglang.scheduler_patches import register_hooks_once

TARGET = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController._add_speculative"

HOOKED_SIGNATURES = {TARGET: "(self, state: 'Dict[str, Any]') -> 'None'"}

STATE_KEY = "parse"


def add_parse_state(result, controller, state):
    """AFTER hook: state["parse"] = the PARSE worker's state (its totals, and an adaptive
    server's cost table)."""
    worker = controller.scheduler.draft_worker
    if isinstance(getattr(worker, "totals", None), ServerTotals):
        state[STATE_KEY] = worker.server_state()
    return result


def install() -> str:
    register_hooks_once(__name__, (TARGET, add_parse_state, HookType.AFTER))
    return f"{TARGET}: AFTER hook adding PARSE's server totals as internal_state[{STATE_KEY!r}]"

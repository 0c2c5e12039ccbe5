"""The replay engine: pure Python, no Django, no import cycle.

Modules import only the ones listed before them (``tests/engine/test_engine.py`` checks
it, and that nothing here imports Django):

- ``codec``, ``durations``, ``identifiers``: payload encoding and error envelopes,
  durations, the one validator per identifier (instance id, workflow name, channel).
- ``attributes``: search attributes' names, values and filters.
- ``interrupt``: a deadline that interrupts running Python code (a query's handler).
- ``events``: the history vocabulary (commands, event types, rows, fences) and the
  one error-envelope helper, ``error_data``.
- ``options``: activity options and retry policies.
- ``portable``: ``selvedge.history/v1`` records and their strict parser.
- ``scope``: cancellation scopes.
- ``ports``: the store and runtime Protocols and the records passed through them.
- ``leftovers``: the check for recorded commands past where workflow code stopped.
- ``execution``: one run of workflow code against its history (the caller builds
  the context it runs with), and ``Execution.wait_here``, where a live wait stays for
  the worker's cache or suspends.
- ``handles``, ``inbox``, ``commands``: futures, timers and child handles; signal
  commands; every other command.
- ``patches``: ``patched()`` and ``deprecate_patch()``, code changes beside old histories.
- ``saga``: ``ctx.saga()``, compensations run on a detached context when a block fails.
- ``streams``: ``write_stream()`` and ``close_stream()``, stream commands.
- ``context``: ``WorkflowContext``, the facade workflow code sees.
- ``replay``: the read-only runtime of queries and replay checks.
- ``debug``: a read-only replay that stops in the debugger before a chosen command.
- ``activity``, ``coroutines``: the activity attempt context and async activities.
"""

ORDER = (
    "codec",
    "durations",
    "identifiers",
    "attributes",
    "interrupt",
    "events",
    "options",
    "portable",
    "scope",
    "ports",
    "leftovers",
    "execution",
    "handles",
    "inbox",
    "commands",
    "patches",
    "saga",
    "streams",
    "context",
    "replay",
    "debug",
    "activity",
    "coroutines",
)

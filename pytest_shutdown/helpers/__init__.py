"""The helpers layer: the assertion helpers, plain Python, no pytest needed. Each module checks
one contract (``no_leaks``, finalization, idempotence, executors, timeouts, exits, freeze,
growth, collateral, collectives, orphans, ...); ``pytest_shutdown.harness`` and
``pytest_shutdown.orphans`` re-export their plumbing.

May import the base, findings, _os, ownership, resources and gpu layers; never the plugin.
Kept empty: importing one helper loads only what it needs.
"""

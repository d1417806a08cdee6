"""The speed machinery: how the guard checks every test of a suite for a fraction of a
millisecond, and how loading the plugin costs a few milliseconds. Everything that exists only
to be fast lives here; the rest of the package uses it without knowing how it works.

A clean test is the common case, so the guard's hot path proves *nothing changed* before it
looks at anything. The pieces, from the bottom up:

* :mod:`.held_open`: the ``/proc`` and ``/dev/shm`` files the guard reads around every test
  (``/proc/self/fd``, ``ns_last_pid``, ``/dev/shm``) are opened once and kept open, so that a
  reading is one system call (``fstat`` or ``pread``), not three. A forked child closes its
  copies: they describe the parent.
* :mod:`.cheap`: the readings that move whenever something of a kind was created or removed:
  the open-descriptor count with the lowest free number, ``/dev/shm``'s modification time and
  size; and the settle loops that wait for items on their way out.
* :mod:`.moments`: inside :func:`~.moments.one_moment` a reading several kinds take (the
  descendants, the descriptor count) is taken once.
* Fingerprints: each resource kind (:mod:`pytest_shutdown.resources.base`) has a
  ``fingerprint()``, its cheapest reading that moves whenever its snapshot diff could find
  something. :mod:`.marks` reads every kind's fingerprint in one pass (:class:`~.marks.
  FingerprintPass`): most are one shared reading a kind names in its ``mark``, taken once,
  inline. The guard compares a test's marks after its teardown with those before its setup;
  equal marks end the check (no snapshot, no diff, no owner search), and the next test starts
  from the last clean test's snapshots while the marks have not moved.
* :mod:`.lazy_dataclass`: the findings and records are dataclasses whose methods are generated
  at their first instance, not at import (``dataclasses`` generates code with ``exec``: a few
  milliseconds per class at every session start, for classes most sessions never build).
  :mod:`.lazy_exports`: the public modules import a name from its home on first use.
* :mod:`.node_markers`: the names of a node's markers, kept per node on top of its parent's,
  and the names pytest scans on the plugin's objects: collection, the guard and the cycles hook
  ask for markers of every test without walking the node chain each time.

The figures these buy are in docs/benchmarks.md (``benchmarks/guard_budget.py``: the fixed
start-up cost and the per-test slope). This layer imports nothing of the package outside it;
the resources layer hands the marks pass its descendant readings
(:data:`.marks.DESCENDANTS`). Kept light: importing one module loads only that one.
"""

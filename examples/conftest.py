"""Shared by every example suite.

The finding codes of a check used to be put on the status line by two hooks here; the plugin
does it now by itself (``pytest_shutdown.plugin.contract_errors``): a strict xfail in
``examples/regressions/`` prints ``XFAIL [finalizer-bound-method]`` instead of a bare ``XFAIL``
under ``pytest -v``, with no hook to copy into your own ``conftest.py``.
"""

"""The findings layer: :class:`~pytest_shutdown.findings.finding.Finding` and
``ShutdownContractError`` (``finding``), their text (``text``), the warning of warn mode
(``leak_warning``).

Imports only the base layer (``_base``). Kept empty: importing the warning loads neither the
findings nor their text.
"""

"""``@pytest.mark.shutdown_matrix``: marker arguments → the cells of a timeout matrix.

``shutdown_matrix(request=[...], process=[...], platform=[...], grace=15.0)`` takes the cells of
:func:`pytest_shutdown.timeout_matrix`; each parametrizes the ``shutdown_timeouts`` fixture once
(ids like ``rocm-req0-proc0``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass
from pytest_shutdown._fast.node_markers import SHUTDOWN_MATRIX
from pytest_shutdown.helpers.timeouts import TimeoutCell, timeout_matrix

MARKER = SHUTDOWN_MATRIX
#: Marker keyword → timeout_matrix keyword, with the defaults of timeout_matrix.
ACCEPTED_KEYS: Mapping[str, str] = {
    "request": "request",
    "process": "process",
    "platform": "platforms",
    "grace": "grace",
}


@lazy_dataclass(frozen=True)
class ShutdownTimeouts:
    """One cell of a shutdown matrix, as the ``shutdown_timeouts`` fixture hands it to a test.

    ``request_timeout`` is the request-drain budget (EngineConfig.shutdown_timeout),
    ``process_timeout`` what the test passes to ``shutdown(timeout=...)``, and
    ``expected_process_timeout`` what the engine must then use (the ROCm grace when both
    timeouts are 0 on ROCm, else ``process_timeout``); ``grace`` is the ROCm cleanup grace of
    the matrix.
    """

    platform: str
    request_timeout: float | None
    process_timeout: float | None
    expected_process_timeout: float | None
    grace: float

    @property
    def id(self) -> str:
        return TimeoutCell(self.platform, self.request_timeout, self.process_timeout, None).id


def cells_from_marker(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[ShutdownTimeouts]:
    """Validate the marker's arguments and build its cells; ``ValueError`` names what is wrong."""
    if args:
        raise ValueError(
            f"{MARKER}: takes keyword arguments only; accepted: {', '.join(ACCEPTED_KEYS)}"
        )
    unknown = sorted(set(kwargs) - set(ACCEPTED_KEYS))
    if unknown:
        raise ValueError(
            f"{MARKER}: unknown argument(s) {', '.join(unknown)}; "
            f"accepted: {', '.join(ACCEPTED_KEYS)}"
        )
    call = {ACCEPTED_KEYS[key]: _as_sequence(key, value) for key, value in kwargs.items()}
    try:
        matrix = timeout_matrix(**call)
    except ValueError as exc:
        raise ValueError(f"{MARKER}: {exc}") from None
    grace = float(call.get("grace", 15.0))
    return [
        ShutdownTimeouts(c.platform, c.request_timeout, c.process_timeout, c.expected, grace)
        for c in matrix
    ]


def _as_sequence(key: str, value: Any) -> Any:
    if key == "grace":
        return value
    if isinstance(value, (str, int, float)) or value is None:
        return (value,)
    return tuple(value)

"""timeout_matrix and assert_timeout_decoupling: the ROCm grace only for 0/0 on ROCm."""

from __future__ import annotations

import math

import pytest

from pytest_shutdown import ShutdownContractError, assert_timeout_decoupling, timeout_matrix
from pytest_shutdown.engine.timeouts import get_engine_process_shutdown_timeout
from pytest_shutdown.helpers.timeouts import TimeoutCell


def _engine_policy(request: float | None, process: float | None, platform: str) -> float | None:
    return get_engine_process_shutdown_timeout(request, process, platform, rocm_grace_s=15.0)


def test_default_matrix_ids_and_the_grace_rule() -> None:
    cells = timeout_matrix()
    assert len(cells) == 18
    assert len(set(cells.ids)) == 18
    by_id = {cell.id: cell for cell in cells}
    assert by_id["rocm-req0-proc0"].expected == 15.0
    graced = [cell.id for cell in cells if cell.expected != cell.process_timeout]
    assert graced == ["rocm-req0-proc0"]
    assert by_id["cuda-req0-proc0"].expected == 0
    assert by_id["rocm-req7-proc0"].expected == 0  # a spent budget gets no new grace
    assert by_id["rocm-req0-procNone"].expected is None


def test_as_params_feed_parametrize(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        from pytest_shutdown import timeout_matrix

        @pytest.mark.parametrize("cell", timeout_matrix(grace=2.5).as_params())
        def test_cell(cell):
            assert cell.platform in ("cuda", "rocm")
        """
    )
    result = pytester.runpytest("-q", "--collect-only")
    result.stdout.fnmatch_lines(["*test_cell[[]rocm-req0-proc0[]]*"])
    assert pytester.runpytest("-q").ret == 0


def test_the_engine_policy_keeps_every_cell() -> None:
    report = assert_timeout_decoupling(_engine_policy, grace=15.0)
    assert "rocm-req0-proc0" in report.details["cells"]


@pytest.mark.parametrize(
    ("policy", "wrong"),
    [
        # grace whenever the request timeout is 0, even when the process budget is spent or None
        (
            lambda r, p, plat: 15.0 if plat == "rocm" and r == 0 else p,
            {"rocm-req0-procNone", "rocm-req0-proc7"},
        ),
        # the platform is ignored: CUDA gets the ROCm grace
        (lambda r, p, plat: 15.0 if r == 0 and p == 0 else p, {"cuda-req0-proc0"}),
        # None replaced by a default
        (
            lambda r, p, plat: 15.0 if plat == "rocm" and r == 0 and p == 0 else (p or 5.0),
            {f"{plat}-req{r}-procNone" for plat in ("cuda", "rocm") for r in ("None", "0", "7")}
            | {"cuda-req0-proc0", "cuda-reqNone-proc0", "cuda-req7-proc0"}
            | {"rocm-reqNone-proc0", "rocm-req7-proc0"},
        ),
    ],
)
def test_every_wrong_cell_is_reported(policy: object, wrong: set[str]) -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_timeout_decoupling(policy, grace=15.0)  # type: ignore[arg-type]
    assert set(exc.value.codes) == {"timeout-policy"}
    assert {f.details["cell"] for f in exc.value.findings} == wrong
    for finding in exc.value.findings:
        assert "expected" in finding.message


def test_a_raising_policy_is_a_wrong_cell() -> None:
    def policy(request: float | None, process: float | None, platform: str) -> float | None:
        if process is None:
            raise TypeError("unsupported operand")
        return _engine_policy(request, process, platform)

    with pytest.raises(ShutdownContractError) as exc:
        assert_timeout_decoupling(policy, grace=15.0, platforms=("rocm",))
    assert len(exc.value.findings) == 3
    assert all("TypeError" in f.details["error"] for f in exc.value.findings)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"request": (-1,)}, "request"),
        ({"process": (math.nan,)}, "process"),
        ({"platforms": ("tpu",)}, "platforms"),
        ({"grace": 0}, "grace"),
        ({"request": ("7",)}, "request"),
    ],
)
def test_bad_input_names_the_argument_and_the_accepted_values(
    kwargs: dict[str, object], argument: str
) -> None:
    with pytest.raises(ValueError, match=argument) as exc:
        timeout_matrix(**kwargs)  # type: ignore[arg-type]
    assert "accepted" in str(exc.value) or "positive" in str(exc.value)


def test_cells_are_plain_data() -> None:
    cell = TimeoutCell("rocm", 0, 0.5, 0.5)
    assert cell.id == "rocm-req0-proc0.5"

"""``python -m devheal.agent.gpucheck`` (run by scripts/gpu-check): with a fake GPU, and without any."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from devheal.agent import gpucheck

from .fake_pynvml import FakeGpu, FakeNvml

REPO = Path(__file__).resolve().parents[3]


def test_no_gpu_or_driver_fails_with_a_clear_message() -> None:
    # This machine has no NVIDIA driver: the real pynvml cannot load libnvidia-ml.so.1.
    proc = subprocess.run(
        [sys.executable, "-m", "devheal.agent.gpucheck", "--seconds", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode == 0:
        pytest.skip("this machine has an NVIDIA GPU")
    assert proc.returncode == gpucheck.NO_GPU_EXIT
    assert "no usable NVIDIA GPU" in proc.stderr
    assert "NVML Shared Library Not Found" in proc.stderr or "Driver Not Loaded" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_inventory_health_and_overhead_with_a_fake_gpu(tmp_path: Path) -> None:
    gpus = [FakeGpu(0, "GPU-0000"), FakeGpu(1, "GPU-1111", lost=False, pcie=(5, 8, 5, 16), recovery_action=None)]
    nvml = FakeNvml(gpus)
    out = io.StringIO()
    report = tmp_path / "report.json"
    args = gpucheck.parse_args(
        ["--seconds", "0.3", "--poll-interval", "0.1", "--json", str(report), "--pod-resources-socket", "/nonexistent"]
    )
    assert gpucheck.run(args, nvml=nvml, out=out) == 0
    text = out.getvalue()
    assert "GPU 0: GPU-0000  NVIDIA H100 80GB HBM3" in text
    assert "GPU 1: Degraded" in text and "PCIe link trained narrower" in text
    assert "% of one core; RSS" in text
    assert "recovery action: None (NVML_GPU_RECOVERY_ACTION_NONE)" in text
    assert "recovery action: not reported" in text, "GPU 1's driver does not report it"
    data = json.loads(report.read_text())
    assert [d["health"] for d in data["devices"]] == ["Healthy", "Degraded"]
    assert [d.get("recoveryAction") for d in data["devices"]] == [{"action": "None", "value": 0}, None]
    assert data["overhead"]["rounds"] >= 2
    assert nvml.shutdowns == 1


@pytest.mark.parametrize(("lost", "code"), [(False, 0), (True, gpucheck.NOT_HEALTHY_EXIT)])
def test_as_a_validation_pod_it_fails_unless_every_gpu_is_healthy(lost: bool, code: int) -> None:
    """``--fail-unless-healthy``: the exit code a post-repair validation pod (node.validation) ends with."""
    nvml = FakeNvml([FakeGpu(0, "GPU-0000"), FakeGpu(1, "GPU-1111", lost=lost)])
    args = gpucheck.parse_args(["--seconds", "0", "--fail-unless-healthy", "--pod-resources-socket", "/nonexistent"])
    assert gpucheck.run(args, nvml=nvml, out=io.StringIO()) == code
    plain = gpucheck.parse_args(["--seconds", "0", "--pod-resources-socket", "/nonexistent"])
    assert gpucheck.run(plain, nvml=FakeNvml([FakeGpu(0, "GPU-0000"), FakeGpu(1, "GPU-1111", lost=lost)])) == 0


def test_the_script_checks_its_python_before_installing() -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu-check")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHON": "no-such-python", "HOME": "/tmp"},
    )
    assert proc.returncode == 1
    assert "no Python interpreter 'no-such-python'" in proc.stderr

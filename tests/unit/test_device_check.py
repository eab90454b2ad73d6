"""#36 item 6: the device check's CPU half runs here, so the script the GPU machine runs cannot rot."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO


def test_the_device_check_runs_its_cpu_half(tmp_path, models_root):
    out = tmp_path / "cpu.json"
    done = subprocess.run([sys.executable, "bench/device_check.py", "--device", "cpu", "--out", str(out),
                           "--tokens", "256", "--repeats", "1"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["models"]) == {"smollm2-135m-instruct", "tiny-kimi-bf16"}
    for figures in report["models"].values():
        assert figures["float32"]["worst"] <= 1e-5  # two engines on the same CPU, float32
        assert len(figures["rel_l2_bfloat16_vs_float32_on_device_per_point"]) >= 10
        assert 0 < max(figures["rel_l2_bfloat16_vs_float32_on_device_per_point"]) < 0.5
    assert report["host_path_kimi_width"]["bytes_per_token"] == 71680
    assert report["host_path_kimi_width"]["pageable"]["gb_s_best"] > 0

"""FSDP2 for the VLA on GPUs (NCCL, bf16): ``--trainer.strategy fsdp2``.

The same run on CPU ranks (gloo) is ``tests/modules/test_fsdp2.py``. Run with ``pytest -m gpu`` on a
CUDA machine; ``make test`` deselects the ``gpu`` marker.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.gpu
@pytest.mark.multiproc
def test_vla_module_wraps_and_trains_under_fsdp(tmp_path):
    assert torch.cuda.is_available(), "gpu-marked test run without a GPU"
    cmd = [
        sys.executable,
        "-m",
        "fastlight.cli",
        "fit",
        "--config",
        os.path.join(ROOT, "configs/vla_metaworld_mt10.yaml"),
        "--model.init_from",  # the config starts from an SFT run's checkpoint; here from scratch
        "null",
        "--data.env_kwargs",
        "{tasks: MT10, image: false, max_path_length: 6}",
        "--data.num_envs",
        "2",
        "--data.num_workers",
        "1",
        "--data.max_horizon",
        "6",
        "--trainer.max_steps",
        "8",
        "--trainer.strategy",
        "fsdp2",
        "--trainer.precision",
        "bf16-mixed",
        "--trainer.devices",
        str(min(2, torch.cuda.device_count())),
        "--trainer.accelerator",
        "gpu",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.default_root_dir",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "max_steps=8` reached" in proc.stdout + proc.stderr

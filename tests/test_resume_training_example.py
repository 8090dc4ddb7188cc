"""examples/resume_training.py (issue 41): train with attnx.data.Dataset, checkpoint with Checkpoint, restore
in a fresh process and continue to the same losses as an uninterrupted run, bit for bit. The comparison can
fail: a resumed run whose random stream starts over (its shuffle orders and dropout masks differ) does not
match."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import attnx

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "resume_training.py"
PYTHON_DIR = str(Path(attnx.__file__).resolve().parents[1])  # the attnx under test: the source tree or site-packages


def _run(*args):
    env = {**os.environ, "PYTHONPATH": PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, check=True,
                         timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_a_resumed_fresh_process_continues_to_the_uninterrupted_losses(tmp_path):
    first = _run("first", "--dir", str(tmp_path))
    assert first["epochs"] == [1, 2, 3]
    assert (tmp_path / "checkpoint").exists() and (tmp_path / "ckpt-3.attnx").exists()
    resumed = _run("resume", "--dir", str(tmp_path))
    full = _run("full")
    assert resumed["epochs"] == [4, 5, 6]
    assert first["loss"] + resumed["loss"] == full["loss"]  # bit for bit
    assert full["loss"][-1] < full["loss"][0]

    # the same restore with the random stream started over continues differently
    saved = json.loads((tmp_path / "random.json").read_text())
    saved["random"]["step"] = 0
    (tmp_path / "random.json").write_text(json.dumps(saved))
    restarted = _run("resume", "--dir", str(tmp_path))
    assert not np.allclose(restarted["loss"], resumed["loss"], rtol=1e-9, atol=0)

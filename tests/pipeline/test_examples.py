"""The tutorial chapter (Section 7) runs exactly as written: its script and its exercises."""

import subprocess
import sys
from pathlib import Path


EXAMPLE = Path(__file__).parents[2] / "examples" / "profiles.py"


def run(*args):
    result = subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_exercise_1_prints_the_profiles_tunables_and_checks_against_numpy():
    lines = run()
    assert lines[0] == "size=2048 on cpu: tile_size=1024, num_aie_columns=2, num_channels=1"
    assert lines[1].startswith("matches numpy")


def test_exercise_2_a_different_shape_picks_the_other_entry():
    lines = run("--exercise", "2")
    assert lines[0] == "size=2048 on cpu: tile_size=1024, num_aie_columns=2, num_channels=1"
    assert lines[2] == "size=1024 on cpu: tile_size=256, num_aie_columns=1, num_channels=1"


def test_exercise_3_the_calls_own_value_wins():
    lines = run("--exercise", "3")
    assert lines[0] == "size=2048 on cpu: tile_size=1024, num_aie_columns=1, num_channels=1"
    assert lines[2].startswith("size=1024 on cpu:") and "num_aie_columns=1" in lines[2]

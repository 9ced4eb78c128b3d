"""launch/benchmark_interleaved.py: two versions timed in one process."""

import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / 'launch' / 'benchmark_interleaved.py'


def _run(*flags, timeout=600):
    return subprocess.run([sys.executable, str(SCRIPT), *flags], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def test_this_tree_against_itself_gives_equal_metrics_and_a_ratio():
    result = _run(f'--baseline_tree={REPO}', '--task=synthetic', '--num_users=60',
                  '--rounds=2', '--warmup=0', '--bootstrap=50')
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report['metrics_equal'] is True
    assert 'loss' in report['compared_metrics']
    low, high = report['ratio_interval_95']
    assert 0 < low <= high
    assert report['ratio_of_means'] > 0


def test_a_folder_without_the_package_is_refused_in_one_line(tmp_path):
    result = _run(f'--baseline_tree={tmp_path}', '--task=synthetic', timeout=120)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == f'error: --baseline_tree: {tmp_path} holds no tff_fedrecgel/ package'
    assert 'Traceback' not in result.stderr
    assert list(tmp_path.iterdir()) == []

"""What the oracle scripts share: the case's users, the authors' side run in
its own Python, and the comparison of both sides' results.

launch/oracle_pfedrec.py, oracle_fedrap.py and oracle_gpfedrec.py write a
case (`.npz`), run their `oracle_*_authors.py` on it with a Python that has
torch, compute the project's side and compare them here.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile

from absl import flags
import numpy as np

AUTHORS = flags.DEFINE_string('authors_code', None, 'Folder of the authors\' code.',
                              required=True)
TORCH = flags.DEFINE_string('torch_python', sys.executable,
                            'A Python with torch and what the authors\' code imports '
                            '(numpy; pandas for FedRAP, scikit-learn for GPFedRec).')
TASK = flags.DEFINE_string('task', 'filmtrust', 'The task whose split gives the case.')
DATA_DIR = flags.DEFINE_string('data_dir', None, 'The task\'s data folder, or a folder '
                               'holding it under the task\'s name.')
USERS = flags.DEFINE_integer('users', 6, 'Users of the case (the most active ones).')
SEED = flags.DEFINE_integer('seed', 0, 'Seed of the weights, batches and orders.')
KEEP = flags.DEFINE_string('keep_dir', None, 'Keep the case and both sides\' results here.')


def load_split():
    """The `--task`'s split from `--data_dir`; exits with one line if it cannot."""
    from tff_fedrecgel import tasks  # pylint: disable=import-outside-toplevel
    data_dir = DATA_DIR.value
    if data_dir and os.path.isdir(os.path.join(data_dir, TASK.value)):
        data_dir = os.path.join(data_dir, TASK.value)
    try:
        return tasks.get_task(TASK.value).load_split(data_dir=data_dir)
    except (ValueError, OSError) as e:
        sys.exit(f'error: {e}')


def most_active_users(split) -> tuple[list[int], int]:
    """The `--users` users with the most training rows, in index order, and
    their training rows."""
    rows = np.bincount(split.train_users, minlength=split.num_users)
    users = sorted(np.argsort(-rows, kind='stable')[:USERS.value].tolist())
    return users, int(rows[users].sum())


def keep(ours: dict) -> None:
    """Saves the project's side beside the case under `--keep_dir`, if given."""
    if KEEP.value:
        np.savez(os.path.join(KEEP.value, 'ours.npz'), **ours)


def run_authors(script: str, case: dict) -> dict:
    """Runs `launch/<script>` on `case` with `--torch_python` and the
    `--authors_code`; returns its results (`--keep_dir` keeps `case.npz`
    and `out.npz`).

    Args:
      script: The authors' side, a file name in this folder.
      case: The case's arrays.

    Exits with one line if `--authors_code` is not a folder or the authors'
    side fails (its own output above the line says why).
    """
    if not os.path.isdir(AUTHORS.value):
        sys.exit(f'error: --authors_code={AUTHORS.value} is not a folder (clone the authors\' '
                 'repository there)')
    with tempfile.TemporaryDirectory() as tmp:
        folder = KEEP.value or tmp
        os.makedirs(folder, exist_ok=True)
        case_path, out_path = os.path.join(folder, 'case.npz'), os.path.join(folder, 'out.npz')
        np.savez(case_path, **case)
        try:
            subprocess.run([TORCH.value, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      script), AUTHORS.value, case_path, out_path],
                           check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit(f'error: the authors\' side ({script} under --torch_python='
                     f'{TORCH.value}) failed: {e}')
        return dict(np.load(out_path))


def max_differences(ours: dict, theirs: dict, server: str) -> collections.OrderedDict:
    """Per round and compared part (`r{r}_u{u}_{part}`, or `r{r}_...` for the
    server's, named `server`), over the users: (largest absolute
    difference, largest |authors' value|)."""
    diffs = collections.OrderedDict()
    for key in sorted(theirs):
        part = key.split('_')[-1] if '_u' in key else server
        name = f'{key.split("_")[0]} {part}'
        diff = float(np.max(np.abs(np.asarray(ours[key], np.float64) - theirs[key])))
        scale = float(np.max(np.abs(theirs[key])))
        old = diffs.get(name, (0.0, 0.0))
        diffs[name] = (max(old[0], diff), max(old[1], scale))
    return diffs


def report(diffs: collections.OrderedDict, tolerance: float, relative: bool = False) -> int:
    """Prints each difference and the verdict; returns the exit status.

    Args:
      diffs: `max_differences`'s result.
      tolerance: The largest allowed difference.
      relative: Hold each difference relative to its largest authors' value
        to the tolerance (else the absolute difference).
    """
    width = max(len(name) for name in diffs)
    worst = 0.0
    for name, (diff, scale) in diffs.items():
        rel = diff / max(scale, 1e-30)
        extra = f', relative {rel:.3g}' if relative else ''
        print(f'  max |ours - authors| {name:<{width}} {diff:.3g}  '
              f'(max |authors| {scale:.3g}{extra})')
        worst = max(worst, rel if relative else diff)
    kind = 'relative' if relative else 'abs'
    print(f'max {kind} diff {worst:.3g} (tolerance {tolerance:g}): '
          f'{"OK" if worst <= tolerance else "FAILED"}')
    return 0 if worst <= tolerance else 1

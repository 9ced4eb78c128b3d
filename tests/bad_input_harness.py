"""Runs `launch/train.py`'s checks on many command lines in one process.

Used by test_bad_input.py: reads a JSON list of cases (each a list of
arguments) on stdin and prints one JSON list of outcomes. Each case goes
through the flag parsing and every check of `train.main` with the training
itself replaced, so a case costs milliseconds, not a TensorFlow import:

* `refused`: a user error (what `_entry.run_main` prints as one `error:`
  line); `message` is its text, `lines` its number of lines;
* `traceback`: any other exception (`message` names its type);
* `accepted`: the checks passed and the run would have started training.

`written` lists what the case left in the output root and the working
folder (a refusal must leave nothing).
"""

import contextlib
import io
import json
import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import flags  # pylint: disable=wrong-import-position

from tff_fedrecgel.launch import _entry  # pylint: disable=wrong-import-position
from tff_fedrecgel.launch import train  # pylint: disable=wrong-import-position


class _Accepted(Exception):
    """Raised instead of training: every check passed."""


def _no_training(*args, **kwargs):
    raise _Accepted()


def _listing(*folders):
    found = []
    for folder in folders:
        if folder.exists():
            found += [str(p) for p in sorted(folder.rglob('*'))]
    return found


class _Refused(Exception):
    """A user error, as `_entry.run_main` would print it."""

    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


def run_case(argv, root, cwd):
    """The outcome of one command line (see the module docstring)."""
    flags.FLAGS.unparse_flags()
    out, err = io.StringIO(), io.StringIO()
    outcome = {}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                # The entry points' own parsing: one `error:` line and exit 2.
                rest = _entry._parse_flags(['train.py', *argv])  # pylint: disable=protected-access
            except SystemExit as e:
                line = err.getvalue().strip()
                if e.code != 2 or not line.startswith('error: '):
                    raise
                raise _Refused(line[len('error: '):]) from None
            if len(rest) > 1:
                raise _Refused(f'unexpected arguments: {" ".join(rest[1:])}')
            try:
                train.main(rest)
            except _entry.USER_ERRORS as e:
                raise _Refused(e) from None
    except _Refused as e:
        text = str(e.error)
        outcome = {'outcome': 'refused', 'message': _entry.one_line(text),
                   'lines': len(text.splitlines()) or 1}
    except _Accepted:
        outcome = {'outcome': 'accepted'}
    except BaseException as e:  # pylint: disable=broad-except
        outcome = {'outcome': 'traceback', 'message': f'{type(e).__name__}: {e}'[:300]}
    outcome['written'] = _listing(root, cwd)
    return outcome


def main():
    cases = json.load(sys.stdin)
    root = pathlib.Path(os.environ['BAD_INPUT_ROOT'])
    cwd = pathlib.Path.cwd()
    train._train = _no_training  # pylint: disable=protected-access
    results = []
    for argv in cases:
        argv = [a.replace('{root}', str(root)) for a in argv]
        results.append(run_case(argv, root, cwd))
        # Clear what an accepted case wrote (deepest first) for the next one.
        for path in sorted(_listing(root, cwd), key=len, reverse=True):
            target = pathlib.Path(path)
            if not target.is_dir() or target.is_symlink():
                target.unlink()
            elif not any(target.iterdir()):
                target.rmdir()
    print(json.dumps(results))


if __name__ == '__main__':
    main()

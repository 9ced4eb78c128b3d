r"""Writes docs/FLAGS.md, the flag reference, from the flag definitions.

    .venv/bin/python launch/flag_reference.py           # writes the page
    .venv/bin/python launch/flag_reference.py --check   # exit 1 if it is stale

tests/test_cli_help.py holds the page equal to what this writes.
"""

from __future__ import annotations

import os
import pathlib
import sys

if __package__ in (None, ''):
    # Run as `python launch/flag_reference.py`: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_fedrecgel.launch import _flag_groups
# pylint: enable=g-import-not-at-top,wrong-import-position

PAGE = pathlib.Path(__file__).resolve().parents[1] / 'docs' / 'FLAGS.md'


def main(argv: list[str]) -> int:
    """Writes (or with --check, compares) the page; returns the exit status."""
    text = _flag_groups.markdown()
    if argv[1:] == ['--check']:
        if not PAGE.exists() or PAGE.read_text(encoding='utf-8') != text:
            print(f'{PAGE} is stale: run launch/flag_reference.py', file=sys.stderr)
            return 1
        return 0
    if argv[1:]:
        print('usage: flag_reference.py [--check]', file=sys.stderr)
        return 2
    PAGE.write_text(text, encoding='utf-8')
    print(f'wrote {PAGE}')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))

"""Following TFF's worker processes from the tests, through /proc.

A worker is known by (pid, start time), so a reused pid is never mistaken
for the worker that had it.
"""

import os
import time


def _stat(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()
    except OSError:
        return None


def alive_since(pid):
    """The start time of a live (not zombie) process, else None."""
    stat = _stat(pid)
    return None if stat is None or stat[0] in ('Z', 'X') else stat[19]


def descendants(pid, *, recursive=True):
    """The children of `pid` (and theirs, if `recursive`)."""
    out = []
    try:
        for task in os.listdir(f'/proc/{pid}/task'):
            with open(f'/proc/{pid}/task/{task}/children') as f:
                for child in map(int, f.read().split()):
                    out += [child, *(descendants(child) if recursive else ())]
    except OSError:
        pass
    return out


def note_workers(pid, seen, *, recursive=False):
    """Notes the live worker_binary processes under `pid` in `seen`
    (pid -> start time)."""
    for child in descendants(pid, recursive=recursive):
        since = alive_since(child)
        try:
            exe = os.readlink(f'/proc/{child}/exe')
        except OSError:
            continue
        if since is not None and exe.endswith('/worker_binary'):
            seen[child] = since


def workers_left(seen, timeout=20):
    """The workers of `seen` still running after up to `timeout` s."""
    deadline = time.monotonic() + timeout
    left = dict(seen)
    while left and time.monotonic() < deadline:
        left = {p: s for p, s in left.items() if alive_since(p) == s}
        time.sleep(0.05)
    return sorted(left)


def handles(pid, signum):
    """Whether the process has a handler for `signum` (SigCgt)."""
    try:
        with open(f'/proc/{pid}/status') as f:
            for line in f:
                if line.startswith('SigCgt:'):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:
        pass
    return False

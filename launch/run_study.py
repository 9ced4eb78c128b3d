r"""Runs the reproduction study (docs/RESULTS.md), resumably.

Example (from the repository root)::

    .venv/bin/python launch/run_study.py --datasets_dir=/path/to/datasets \
        --root_output_dir=runs/study --parallel=2
    .venv/bin/python launch/run_study.py --list   # the plan and what is done

/path/to/datasets holds one folder per dataset, named as the tasks are
(filmtrust/, lastfm_2k/, amazon_video/), each with its raw file
(docs/DATA.md).

Each run is `launch/train.py` in its own process, writing to
<root_output_dir>/<dataset>/<run>/ with its log beside it (<run>.log). A run
whose summary.json exists is skipped, and so is one another runner is
running now (the log file is locked); an interrupted run resumes from its
last checkpoint. A run the plan's report already holds (a row of its
docs/*_runs.csv, kept when the run folder is gone) is skipped too, so a
study that spans several checkouts picks up where its report ends. Failed
runs are reported at the end (exit status 1) and retried next time. Then `launch/report_study.py` writes the tables and
curves.

Ctrl-C or SIGTERM stops the runner: no queued run starts, the running ones
get the same signal, write their checkpoint and stop (killed if they have
not within two minutes, or at a second signal), then the runner exits
(130 or 143); the same command resumes.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

if __package__ in (None, ''):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_fedrecgel.launch import _entry

_entry.setup_environment()

from absl import flags

from tff_fedrecgel.launch import _report
from tff_fedrecgel.launch import peers_study
from tff_fedrecgel.launch import study
from tff_fedrecgel.launch import transfer_study
from tff_fedrecgel import tasks
from tff_fedrecgel.errors import DataError
# pylint: enable=g-import-not-at-top,wrong-import-position

_DATASETS_DIR = flags.DEFINE_string(
    'datasets_dir', None,
    'Folder holding filmtrust/, lastfm_2k/ and amazon_video/ (required, '
    'except with --list).')
_ROOT = flags.DEFINE_string('root_output_dir', 'runs/study', 'Study output root.')
_PARALLEL = flags.DEFINE_integer(
    'parallel', 1, 'Runs at once (each uses about 2 cores at full speed).')
_DATASETS = flags.DEFINE_list('datasets', list(study.DATASETS), 'Datasets to run.')
_METHODS = flags.DEFINE_list('methods', list(study.METHODS), 'Methods to run.')
_SWEEP_SEEDS = flags.DEFINE_integer('sweep_seeds', 3, 'Seeds per sweep point.')
_FILMTRUST_SEEDS = flags.DEFINE_integer('filmtrust_seeds', 5, 'Seeds on FilmTrust.')
_OTHER_SEEDS = flags.DEFINE_integer('other_seeds', 3, 'Seeds on the other datasets.')
_ONLY = flags.DEFINE_string(
    'only', None, 'Run just the runs whose name contains this text.')
_PEER_SEEDS = flags.DEFINE_integer(
    'peer_seeds', peers_study.PEER_SEEDS, 'Seeds of each method in the peers plan.')
_PEER_SEARCH_TRIALS = flags.DEFINE_integer(
    'peer_search_trials', peers_study.SEARCH_TRIALS,
    'Peers plan: finished trials of each method\'s search (the equal tuning budget); 0 '
    'leaves the equal-tuning half out.', lower_bound=0)
_PEER_SEARCH_MINUTES = flags.DEFINE_float(
    'peer_search_minutes', None, 'Peers plan: wall-clock limit of one call of a search; '
    'then it is stopped as a stopped study stops it (the trial it cuts runs again when '
    'the next call of the study resumes the search).', lower_bound=0)
_LIST = flags.DEFINE_bool('list', False, 'Print the plan and exit.')
_SKIP_REPORTED = flags.DEFINE_bool(
    'skip_reported', True, 'Count the runs of the plan\'s report rows (docs/study_runs.csv, '
    'recipe_runs.csv, transfer_runs.csv or peers_runs.csv, kept when their folders are '
    'gone) as done, and resume each search of the peers plan from the trials '
    f'{peers_study.SEARCH_LEDGER} records, so the study resumes in a fresh '
    'checkout; --noskip_reported runs them again.')
_PLAN = flags.DEFINE_enum(
    'plan', 'paper', ['paper', 'recipe', 'transfer', 'peers'],
    'paper: the reproduction of the paper (its protocol, docs/ALGORITHM.md; '
    'every method); '
    'recipe: the popularity floor, the central ceiling and the tuned recipe, '
    'with a validation item, 10% held-out users and both protocols; transfer: '
    'candidate recipes on every dataset and a generated log, for the choice of '
    '--preset=auto by leaving one dataset out (launch/transfer_study.py); '
    'peers: the peer recommenders and the federated SAM family under their authors\' '
    'settings beside two floors (popularity; each user\'s own history first), with a '
    'validation item, 10% held-out users and both protocols, then every method again '
    'at equal tuning (each searched by launch/tune.py with --peer_search_trials trials; '
    '--methods does not apply; --peer_seeds sets the seeds).')

# How long stopped runs get to write their checkpoint before they are killed.
_STOP_SECONDS = 120.0


def _plan(datasets_dir: pathlib.Path | None) -> list[study.Run]:
    if _PLAN.value == 'transfer':
        if datasets_dir is None:
            raise DataError('--datasets_dir is required: the transfer plan reads each '
                            'dataset\'s profile')
        profiles = {d.key: transfer_study.profile_of(d, datasets_dir)
                    for d in transfer_study.DATASETS}
        return transfer_study.transfer_plan(profiles)
    for name in _DATASETS.value:
        if name not in study.DATASETS:
            raise DataError(f'unknown dataset {name!r}; choose from {", ".join(study.DATASETS)}')
    if _PLAN.value == 'peers':
        searched = _PEER_SEARCH_TRIALS.value > 0
        return peers_study.peers_plan(
            datasets=_DATASETS.value, seeds=_PEER_SEEDS.value,
            root=pathlib.Path(_ROOT.value).resolve() if searched else None,
            search_trials=_PEER_SEARCH_TRIALS.value, search_minutes=_PEER_SEARCH_MINUTES.value)
    for name in _METHODS.value:
        if name not in study.METHODS:
            raise DataError(f'unknown method {name!r}; choose from {", ".join(study.METHODS)}')
    if _PLAN.value == 'recipe':
        runs = study.recipe_plan(datasets=_DATASETS.value)
    else:
        runs = study.study_plan(
            seeds={'filmtrust': _FILMTRUST_SEEDS.value, 'lastfm_2k': _OTHER_SEEDS.value,
                   'amazon_video': _OTHER_SEEDS.value},
            sweep_seeds=_SWEEP_SEEDS.value, methods=_METHODS.value,
            datasets=_DATASETS.value)
    return runs


def _only(runs: list[study.Run]) -> list[study.Run]:
    return [run for run in runs if not _ONLY.value or _ONLY.value in run.name]


def _finished(root: pathlib.Path, run) -> bool:
    if isinstance(run, peers_study.Search):
        return run.finished(root)
    return study.is_finished(root, run)


# What `_run_one` returns for a run whose search has not reached its trials.
_WAITING = 'waiting'
# A search stopped when its call's time (--peer_search_minutes) was up.
_PAUSED = 'paused'


def _wait_or_kill(proc: subprocess.Popen, deadline: float) -> None:
    """Waits for a signalled run until `deadline` (monotonic), then kills it."""
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class _Children:
    """The runs' processes, so that stopping the runner stops them too.

    Each run starts in its own session: a Ctrl-C at the terminal reaches the
    runner alone, which passes it on once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self._stopping = False

    def call(self, command: list[str], log, timeout: float | None = None
             ) -> int | str | None:
        """Runs `command` to its end; None if the runner is stopping.

        Args:
          command: The child's command line.
          log: The open file its output goes to.
          timeout: Seconds it may run (None: no limit). Past them it is
            stopped as a stopped runner stops it (SIGTERM: it saves and
            exits), and `_PAUSED` is returned.
        """
        with self._lock:
            if self._stopping:
                return None
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            self._running.add(proc)
        try:
            try:
                return proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)
                _wait_or_kill(proc, time.monotonic() + _STOP_SECONDS)
                return _PAUSED
        finally:
            with self._lock:
                self._running.discard(proc)

    def stop(self, signum: int, timeout: float = _STOP_SECONDS) -> int:
        """Starts no more runs; signals the running ones and waits for them.

        Returns:
          How many runs were running.

        Raises:
          KeyboardInterrupt: A second signal came while waiting (the runs
            are killed first).
        """
        with self._lock:
            self._stopping = True
            running = list(self._running)
        for proc in running:
            proc.send_signal(signum)
        deadline = time.monotonic() + timeout
        try:
            for proc in running:
                _wait_or_kill(proc, deadline)
        except KeyboardInterrupt:
            for proc in running:
                proc.kill()
            raise
        return len(running)


def _run_one(run: study.Run, root: pathlib.Path, datasets_dir: pathlib.Path,
             children: _Children, search: peers_study.Search | None = None,
             recorded: dict | None = None) -> tuple[study.Run, int | str | None, float]:
    folder, experiment = run.name.split('/', 1)  # Folder: the dataset's key.
    out_dir = root / folder
    out_dir.mkdir(parents=True, exist_ok=True)
    if search is not None and not search.finished(root):
        return run, _WAITING, 0.0
    output = ([f'--root_output_dir={out_dir / experiment}']
              if isinstance(run, peers_study.Search) else
              [f'--root_output_dir={out_dir}', f'--experiment_name={experiment}',
               '--noprogress'])
    command = [sys.executable,
               str(pathlib.Path(__file__).with_name(getattr(run, 'script', 'train.py'))),
               *run.flags(str(datasets_dir / run.dataset)), *output]
    start = time.perf_counter()
    with open(out_dir / f'{experiment}.log', 'a', encoding='utf-8') as log:
        try:
            # The run's stdout shares this open file, so the lock lasts as
            # long as the run, even if this runner is stopped: a second
            # runner skips the run instead of training it twice at once.
            fcntl.flock(log, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return run, None, 0.0
        if isinstance(run, peers_study.Search):  # Under the lock: one runner restores.
            restored = run.restore(root, recorded or {}, datasets_dir)
            if restored:
                log.write(f'resuming from the {restored} trials of '
                          f'{peers_study.SEARCH_LEDGER}\n')
        log.write(' '.join(command) + '\n')
        log.flush()
        # A search's call is stopped from outside when its time is up, not
        # by tune.py's --max_minutes, which would also cut its trials on the
        # wall clock and count them: a stopped trial runs again on resume.
        minutes = run.max_minutes if isinstance(run, peers_study.Search) else None
        code = children.call(command, log, timeout=60 * minutes if minutes else None)
    return run, code, time.perf_counter() - start


def main(argv: list[str]) -> int:
    del argv
    root = pathlib.Path(_ROOT.value)
    datasets_dir = (pathlib.Path(_DATASETS_DIR.value).resolve()
                    if _DATASETS_DIR.value else None)
    # The whole plan, so that a searched run waits on its search even when
    # --only leaves the search out.
    plan = _plan(datasets_dir)
    runs = _only(plan)
    reported = (_report.reported_runs(pathlib.Path(_report.LEDGERS[_PLAN.value]))
                if _SKIP_REPORTED.value else set())
    recorded = (peers_study.recorded_searches(pathlib.Path(peers_study.SEARCH_LEDGER))
                if _SKIP_REPORTED.value and _PLAN.value == 'peers' else {})
    # A search is needed while a run at its preset is: a fresh checkout whose
    # report holds every such run searches nothing again.
    reported |= {run.name for run in runs if isinstance(run, peers_study.Search)
                 and all(r.name in reported for r in plan
                         if peers_study.search_of(r, [run]) is run)}
    todo = [run for run in runs
            if not _finished(root, run) and run.name not in reported]
    if _LIST.value:
        for run in runs:
            data_dir = (f'<datasets_dir>/{run.dataset}' if datasets_dir is None
                        else str(datasets_dir / run.dataset))
            state = 'todo' if run in todo else (
                'done' if _finished(root, run) else 'reported')
            print(f'{state}  {run.name}  '
                  f'{" ".join(run.flags(data_dir))}')
        print(f'{len(runs) - len(todo)} of {len(runs)} runs done')
        return 0
    if _PARALLEL.value < 1:
        raise ValueError('--parallel must be >= 1')
    if datasets_dir is None:
        raise DataError('--datasets_dir is required: the folder holding '
                        f'{", ".join(d + "/" for d in study.DATASETS)}')
    missing = sorted({run.dataset for run in todo
                      if tasks.get_task(run.dataset).raw_file is not None}
                     - {d for d in study.DATASETS if (datasets_dir / d).is_dir()})
    if missing:
        raise DataError(f'no data folder for {", ".join(missing)} under {datasets_dir}')
    root.mkdir(parents=True, exist_ok=True)
    print(f'{len(runs) - len(todo)} of {len(runs)} runs already done; '
          f'running {len(todo)} ({_PARALLEL.value} at a time) into {root}', flush=True)
    start, failed, skipped = time.perf_counter(), [], 0
    children = _Children()
    pool = concurrent.futures.ThreadPoolExecutor(_PARALLEL.value)
    try:
        futures = [pool.submit(_run_one, run, root, datasets_dir, children,
                               peers_study.search_of(run, plan), recorded)
                   for run in todo]
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            run, code, seconds = future.result()
            if code is None:
                status = 'skipped: another runner is running it'
                skipped += 1
            elif code == _WAITING:
                status = 'waiting: its search has not reached its trials (run the study again)'
                skipped += 1
            elif code == _PAUSED:
                status = ('paused: its --peer_search_minutes are up (run the study again '
                          'to resume it)')
                skipped += 1
            elif code == 0:
                status = f'ok in {seconds:.0f} s'
            else:
                status = f'FAILED (exit {code}; see {run.name}.log)'
                failed.append(run.name)
            print(f'[{done}/{len(todo)}] {run.name}: {status}', flush=True)
    except KeyboardInterrupt as e:
        pool.shutdown(wait=False, cancel_futures=True)
        stopped = children.stop(getattr(e, 'signum', signal.SIGINT))
        print(f'study: stopped; {stopped} running run(s) stopped at their last '
              'checkpoint', flush=True)
        raise
    pool.shutdown()
    finished = len(todo) - len(failed) - skipped
    print(f'study: {finished} runs in {time.perf_counter() - start:.0f} s'
          + (f'; {skipped} skipped' if skipped else '')
          + (f'; failed: {", ".join(failed)}' if failed else ''), flush=True)
    return 1 if failed else 0


if __name__ == '__main__':
    _entry.run_main(main, interrupted_hint='run the same command to resume')

"""`--help` of every entry point in launch/: its own flags and the shared ones."""

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
LAUNCH = REPO / 'launch'
sys.path.insert(0, str(REPO))
from tff_fedrecgel import settings_tree  # pylint: disable=wrong-import-position
from tff_fedrecgel.launch import _flag_groups  # pylint: disable=wrong-import-position

# One module per concern: --help shows each as a group, in this order.
SHARED_FLAG_MODULES = tuple(module for module, _, _ in _flag_groups.GROUPS)


def _absl_entry_points() -> list[str]:
    """Scripts in launch/ that define absl flags and run as programs."""
    names = []
    for path in sorted(LAUNCH.glob('*.py')):
        text = path.read_text()
        if (not path.name.startswith('_') and '__main__' in text
                and ('flags.DEFINE_' in text or 'adopt_module_key_flags' in text)):
            names.append(path.stem)
    return names


def _defined_flags(path: pathlib.Path) -> set[str]:
    """Names of the absl flags a module defines (`flags.DEFINE_*('name', ...)`,
    a concern's settings by `_tree_flags.define('concern', ..., only=...)`, and
    `--checkpoint` by `_entry.define_checkpoint_flag()`)."""
    names = {'checkpoint'} if 'define_checkpoint_flag()' in path.read_text() else set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.args and isinstance(node.args[0], ast.Constant)):
            continue
        if node.func.attr.startswith('DEFINE_'):
            names.add(node.args[0].value)
        elif node.func.attr == 'define' and getattr(node.func.value, 'id', '') == '_tree_flags':
            only = next((ast.literal_eval(k.value) for k in node.keywords if k.arg == 'only'),
                        None)
            names |= {s.name for s in settings_tree.leaf(node.args[0].value).settings
                      if only is None or s.name in only}
    return names


def _shared_modules_used(path: pathlib.Path) -> list[str]:
    """The flag modules a script imports, in `GROUPS` order."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == 'tff_fedrecgel.launch':
            used |= {a.name for a in node.names if a.name in SHARED_FLAG_MODULES}
    return [m for m in SHARED_FLAG_MODULES if m in used]


def _help(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(LAUNCH / f'{script}.py'), '--help'], cwd=REPO,
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'})


def _listed_flags(text: str) -> set[str]:
    return set(re.findall(r'^  --(?:\[no\])?(\w+):', text, flags=re.MULTILINE))


def test_entry_points_are_found():
    assert {'train', 'prepare_data', 'export', 'benchmark'} <= set(
        _absl_entry_points())


@pytest.mark.parametrize('script', _absl_entry_points())
def test_help_lists_own_and_shared_flags_only(script):
    path = LAUNCH / f'{script}.py'
    expected = _defined_flags(path)
    for module in _shared_modules_used(path):
        expected |= _defined_flags(LAUNCH / f'{module}.py')
    result = _help(script)
    assert result.returncode == 1, result.stderr  # absl's exit status for --help.
    # Equal sets: nothing missing, and none of TensorFlow's or absl's own.
    assert _listed_flags(result.stdout) == expected
    # A section per concern, in order, then the script's own flags; no
    # module of TensorFlow, TFF or absl.
    flag_part = result.stdout.split('\nflags:\n', 1)[1]
    sections = re.findall(r'^(\S.*):$', flag_part, flags=re.MULTILINE)
    groups = [_flag_groups.group_title(m) for m in _shared_modules_used(path)]
    if _defined_flags(path):
        assert sections[:-1] == groups and sections[-1] in (str(path), f'launch/{script}.py')
    else:
        assert sections == groups
    assert '../shared' not in result.stdout


def test_train_help_groups_the_flags_by_concern():
    sections = re.findall(r'^(\w[\w ]*) \(', _help('train').stdout.split('\nflags:\n')[1],
                          flags=re.MULTILINE)
    assert sections == ['data', 'model', 'method', 'client', 'server', 'evaluation',
                        'evaluation sizes', 'privacy', 'simulation', 'output', 'settings file']


def test_the_flag_reference_page_is_what_its_generator_writes():
    result = subprocess.run(
        [sys.executable, str(LAUNCH / 'flag_reference.py'), '--check'], cwd=REPO,
        capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    page = (REPO / 'docs' / 'FLAGS.md').read_text()
    # Every flag --help lists for train is on the page.
    assert {f'`--{name}`' for name in _listed_flags(_help('train').stdout)} <= set(
        re.findall(r'`--\w+`', page))


def test_train_help_names_the_key_settings():
    text = _help('train').stdout
    assert _listed_flags(text) >= {'task', 'data_dir', 'algorithm', 'rho_sh', 'rho_ns',
                                   'seed', 'validation', 'total_rounds'}
    # absl's own --flagfile is not listed among the flags: the usage says it.
    assert '--flagfile=FILE' in text.split('\nflags:\n', 1)[0]


def test_no_entry_point_text_points_at_the_shared_folder():
    offenders = [p.name for p in LAUNCH.glob('*') if p.is_file()
                 and '../shared' in p.read_text()]
    assert not offenders


def test_tensorboard_command_names_this_environment(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO))
    from tff_fedrecgel.launch import _entry  # pylint: disable=g-import-not-at-top

    monkeypatch.chdir(tmp_path)
    command = _entry.tensorboard_command(tmp_path / 'run' / 'tensorboard')
    program, logdir = command.split(' --logdir ')
    assert logdir == os.path.join('run', 'tensorboard')
    bin_dir = os.path.dirname(os.path.abspath(sys.executable))
    if os.access(os.path.join(bin_dir, 'tensorboard'), os.X_OK):
        assert program == os.path.join(bin_dir, 'tensorboard')
    else:
        assert program == f'{os.path.abspath(sys.executable)} -m tensorboard.main'
    # The command runs: it is TensorBoard's own --help.
    result = subprocess.run(program.split() + ['--help'], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0 and '--logdir' in result.stdout

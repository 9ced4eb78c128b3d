"""Packaging: what setup.py installs, its dependencies and the lock file."""

import ast
import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# The installed commands (tff-fedrecgel-NAME) and the script each runs.
COMMANDS = ('train', 'recommend', 'export', 'tune', 'download')


def _setup_kwargs() -> dict:
    """The keyword arguments setup.py passes to `setuptools.setup`."""
    code = (
        'import json, sys, setuptools\n'
        'captured = {}\n'
        'setuptools.setup = lambda **kw: captured.update(kw)\n'
        "exec(compile(open('setup.py').read(), 'setup.py', 'exec'))\n"
        'print(json.dumps(captured))\n')
    result = subprocess.run([sys.executable, '-c', code], cwd=REPO,
                            capture_output=True, text=True, timeout=60,
                            check=True)
    import json  # pylint: disable=g-import-not-at-top
    return json.loads(result.stdout)


def _name(requirement: str) -> str:
    """Normalized project name of a requirement line."""
    name = re.split(r'[\s<>=!~;\[#]', requirement.strip(), maxsplit=1)[0]
    return re.sub(r'[-_.]+', '-', name).lower()


def _requirement_lines(path: pathlib.Path) -> list[str]:
    lines = [line.split('#')[0].strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line]


def _constraints() -> dict[str, str]:
    pins = {}
    for line in _requirement_lines(REPO / 'constraints.txt'):
        name, _, version = line.partition('==')
        assert version, f'constraints.txt: {line!r} is not an exact pin'
        pins[_name(name)] = version
    return pins


def test_installs_only_the_library_namespace():
    kwargs = _setup_kwargs()
    packages = kwargs['packages']
    assert {p.split('.')[0] for p in packages} == {'tff_fedrecgel'}
    assert 'tff_fedrecgel.tasks' in packages
    # Every package of the source tree is installed, from the folder it lives in.
    folders = {'.'.join(p.relative_to(REPO).parent.parts)
               for p in (REPO / 'tff_fedrecgel').rglob('__init__.py')}
    for mapped in ('tasks', 'launch'):
        folders |= {'tff_fedrecgel.' + '.'.join(p.relative_to(REPO).parent.parts)
                    for p in (REPO / mapped).rglob('__init__.py')}
    assert set(packages) == folders
    assert kwargs['package_dir'] == {'tff_fedrecgel.tasks': 'tasks',
                                     'tff_fedrecgel.launch': 'launch'}


def test_wheel_holds_no_generic_top_level_names(tmp_path):
    # Build from a copy, so that no build artefacts land in the checkout.
    source = tmp_path / 'src'
    for name in ('setup.py', 'pyproject.toml'):
        source.mkdir(exist_ok=True)
        shutil.copy(REPO / name, source / name)
    for folder in ('tff_fedrecgel', 'tasks', 'launch'):
        shutil.copytree(REPO / folder, source / folder,
                        ignore=shutil.ignore_patterns('__pycache__'))
    result = subprocess.run(
        [sys.executable, '-m', 'pip', 'wheel', '--quiet', '--no-deps',
         '--no-build-isolation', '--no-index', str(source),
         '--wheel-dir', str(tmp_path / 'dist')],
        capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / 'dist').glob('*.whl')
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {n.split('/')[0] for n in names if not n.split('/')[0].endswith(
        '.dist-info')}
    assert top_level == {'tff_fedrecgel'}
    assert 'tff_fedrecgel/tasks/filmtrust.py' in names
    assert 'tff_fedrecgel/launch/train.py' in names
    (entry_points,) = [n for n in names if n.endswith('.dist-info/entry_points.txt')]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    for name in COMMANDS:
        assert f'tff-fedrecgel-{name} = tff_fedrecgel.launch._commands:{name}' in text


def test_installed_environment_has_no_tasks_or_launch_module(tmp_path):
    # Outside the checkout, only the library's namespace is importable.
    code = ('import importlib.util as u; '
            "print(u.find_spec('tff_fedrecgel.tasks') is not None, "
            "u.find_spec('tasks'), u.find_spec('launch'))")
    result = subprocess.run([sys.executable, '-c', code], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60,
                            check=True)
    assert result.stdout.split() == ['True', 'None', 'None']


@pytest.mark.parametrize('name', COMMANDS)
def test_installed_commands_run_from_anywhere(name, tmp_path):
    """`pip install -e .` put tff-fedrecgel-NAME beside this Python: its
    --help is launch/NAME.py's, run from a folder outside the checkout."""
    command = pathlib.Path(sys.executable).parent / f'tff-fedrecgel-{name}'
    env = {**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'}
    env.pop('PYTHONPATH', None)
    result = subprocess.run([str(command), '--help'], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, check=False, env=env)
    assert result.returncode == 1, result.stderr  # absl's exit status for --help.
    usage, flags = result.stdout.split('\nflags:\n', 1)
    script = REPO / 'launch' / f'{name}.py'
    assert usage.strip().splitlines()[0] == ast.get_docstring(
        ast.parse(script.read_text())).splitlines()[0]
    # Grouped by concern (launch/_flag_groups.py), the script's own flags last.
    headings = [line for line in flags.splitlines() if line and not line.startswith(' ')]
    assert headings[-1] == f'{script}:' or headings[0] == 'data (the dataset and how it is read):'
    assert re.search(r'^  --(\[no\])?\w+:', flags, flags=re.MULTILINE)


def _imported_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize('folder', ['tff_fedrecgel', 'tasks'])
def test_library_does_not_import_launch_or_top_level_tasks(folder):
    offenders = []
    for path in sorted((REPO / folder).rglob('*.py')):
        for module in _imported_modules(path):
            if module.split('.')[0] in ('tasks', 'launch'):
                offenders.append(f'{path.relative_to(REPO)}: {module}')
    assert not offenders


def test_repository_imports_tasks_through_the_library():
    # `tasks` is installed as `tff_fedrecgel.tasks`; importing the folder under
    # its own name as well would load every task module twice.
    offenders = []
    for folder in ('launch', 'tests', 'tasks', 'tff_fedrecgel'):
        for path in sorted((REPO / folder).rglob('*.py')):
            if any(m.split('.')[0] == 'tasks' for m in _imported_modules(path)):
                offenders.append(str(path.relative_to(REPO)))
    assert not offenders


def test_test_tools_are_a_dev_extra_only():
    kwargs = _setup_kwargs()
    runtime = {_name(r) for r in kwargs['install_requires']}
    runtime |= {_name(r) for r in _requirement_lines(REPO / 'requirements.txt')}
    assert not runtime & {'pytest', 'pytest-timeout'}
    assert {_name(r) for r in kwargs['extras_require']['dev']} >= {
        'pytest', 'pytest-timeout'}


def test_constraints_pin_every_declared_requirement():
    kwargs = _setup_kwargs()
    declared = {_name(r) for r in kwargs['install_requires']}
    for extra in kwargs['extras_require'].values():
        declared |= {_name(r) for r in extra}
    declared |= {_name(r) for r in _requirement_lines(REPO / 'requirements.txt')}
    declared |= {'tensorflow-federated', 'pip', 'setuptools', 'wheel'}
    assert not declared - set(_constraints())
    # requirements.txt's exact pins agree with the lock.
    pins = _constraints()
    for line in _requirement_lines(REPO / 'requirements.txt'):
        if '==' in line:
            assert pins[_name(line)] == line.split('==')[1].strip(), line


def test_environment_is_the_locked_one():
    """Every installed distribution is at the version constraints.txt pins."""
    pins = _constraints()
    mismatched = []
    for dist in importlib.metadata.distributions():
        name = _name(dist.metadata['Name'])
        if name == 'tff-fedrecgel':
            continue
        if pins.get(name) != dist.version:
            mismatched.append(f'{name}=={dist.version} (lock: {pins.get(name)})')
    assert not mismatched, ('run `make venv` to reinstall: '
                            + ', '.join(sorted(mismatched)))

"""Downloading a dataset's raw file (`data/download.py`, `launch/download.py`).

Every download is served by a local HTTP server on 127.0.0.1 from a small
fixture file, never from the internet: the tests swap the pinned source for
one that points at the server (the command line through a wrapper that
patches `download.SOURCES` and then runs the real entry point).
"""

import hashlib
import http.server
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading

import pytest

from tff_fedrecgel import tasks
from tff_fedrecgel.data import download
from tff_fedrecgel.errors import DataError

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = b''.join(f'{u} {i} 3.0\n'.encode() for u in range(1, 8) for i in range(1, 9))


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # pylint: disable=arguments-differ
        pass


@pytest.fixture(scope='module')
def server(tmp_path_factory):
    """Serves a folder holding `ratings.txt` (FIXTURE); yields its base URL."""
    root = tmp_path_factory.mktemp('served')
    (root / 'ratings.txt').write_bytes(FIXTURE)
    handler = lambda *a, **k: _Quiet(*a, directory=str(root), **k)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f'http://127.0.0.1:{httpd.server_address[1]}'
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def _source(url, data=FIXTURE, **changes):
    blob = hashlib.sha1(f'blob {len(data)}\0'.encode() + data).hexdigest()
    pins = dict(url=url, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                git_blob=blob, page='a local fixture')
    return download.Source(**{**pins, **changes})


def _closed_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_fetch_checks_and_stores(server, tmp_path):
    destination = tmp_path / 'new' / 'deeper' / 'file.txt'
    assert download.fetch(_source(f'{server}/ratings.txt'), str(destination))
    assert destination.read_bytes() == FIXTURE
    assert os.listdir(destination.parent) == ['file.txt']
    # Already there with the right bytes: kept, not fetched again.
    assert not download.fetch(_source(f'{server}/missing.txt'), str(destination))


@pytest.mark.parametrize('what, changes, fragment', [
    ('wrong sha256', {'sha256': '0' * 64}, 'SHA-256'),
    ('wrong blob', {'git_blob': '0' * 40}, 'git blob id'),
    ('wrong size', {'size': len(FIXTURE) + 1}, 'bytes, expected'),
    ('too long', {'size': 10}, 'more than the expected 10 bytes'),
    ('not served', {'url': '{server}/missing.txt'}, 'HTTP 404'),
    ('unreachable', {'url': 'http://127.0.0.1:{port}/ratings.txt'}, 'unreachable'),
])
def test_a_refused_download_leaves_nothing(server, tmp_path, what, changes, fragment):
    del what
    changes = {k: v.format(server=server, port=_closed_port()) if k == 'url' else v
               for k, v in changes.items()}
    destination = tmp_path / 'made' / 'file.txt'
    with pytest.raises(DataError, match=fragment):
        download.fetch(_source(changes.pop('url', f'{server}/ratings.txt'), **changes),
                       str(destination))
    assert os.listdir(tmp_path) == []  # Not even the folder it made.


def test_other_bytes_already_there_are_refused_and_kept(server, tmp_path):
    destination = tmp_path / 'file.txt'
    destination.write_bytes(b'something else\n')
    with pytest.raises(DataError, match='already there: remove it'):
        download.fetch(_source(f'{server}/ratings.txt'), str(destination))
    assert destination.read_bytes() == b'something else\n'


def test_pins_match_the_raw_files(datasets_dir):
    """The pinned sizes and digests are those of the real raw files."""
    checked = 0
    for name in ('filmtrust', 'amazon_video', 'lastfm_2k'):
        path = datasets_dir / name / tasks.get_task(name).raw_file
        if not path.exists():
            continue
        source = download.SOURCES[name]
        if name == 'lastfm_2k':
            # The copy here was derived from the GroupLens files: same size,
            # other bytes (docs/DATA.md), so only its size can match.
            assert path.stat().st_size == source.size
        else:
            download.check_file(str(path), source)
        checked += 1
    if not checked:
        pytest.skip(f'no raw dataset file in {datasets_dir}')
    assert download.SOURCES['qb_article'].url is None


_WRAPPER = '''
import json, sys
from tff_fedrecgel.launch import download as cli
from tff_fedrecgel.data import download
download.SOURCES['filmtrust'] = download.Source(**json.loads(sys.argv[1]))
sys.argv = ['download.py', *sys.argv[2:]]
cli.run()
'''


def _cli(args, source=None):
    """launch/download.py, with `source` as FilmTrust's pins when given."""
    command = [sys.executable, str(REPO / 'launch' / 'download.py')]
    if source is not None:
        pins = {k: getattr(source, k) for k in ('url', 'size', 'sha256', 'git_blob', 'page')}
        command = [sys.executable, '-c', _WRAPPER, json.dumps(pins)]
    return subprocess.run([*command, *args], cwd=REPO, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60, check=False)


def test_cli_downloads_under_the_name_train_reads(server, tmp_path):
    result = _cli(['--task=filmtrust', f'--data_dir={tmp_path / "ft"}'],
                  _source(f'{server}/ratings.txt'))
    assert result.returncode == 0, result.stderr
    stored = tmp_path / 'ft' / 'filmtrust-ratings.txt'
    assert stored.read_bytes() == FIXTURE
    assert f'--data_dir={tmp_path / "ft"}' in result.stdout.splitlines()[-1]
    again = _cli(['--task=filmtrust', f'--data_dir={tmp_path / "ft"}'],
                 _source(f'{server}/ratings.txt'))
    assert again.returncode == 0 and 'already there' in again.stdout


@pytest.mark.parametrize('args, changes, fragment', [
    (['--task=filmtrust', '--data_dir={out}'], {'sha256': 'f' * 64}, 'SHA-256'),
    (['--task=filmtrust', '--data_dir={out}'],
     {'url': 'http://127.0.0.1:{port}/ratings.txt'}, 'unreachable'),
    (['--task=qb_article', '--data_dir={out}'], None, 'accept its licence'),
    (['--task=nope', '--data_dir={out}'], None, 'value should be one of'),
    (['--data_dir={out}'], None, '--task is required'),
    (['--task=filmtrust'], None, '--data_dir is required'),
])
def test_cli_bad_input_is_one_line_and_writes_nothing(server, tmp_path, args, changes,
                                                      fragment):
    out = tmp_path / 'out'
    args = [a.format(out=out) for a in args]
    source = None
    if changes is not None:
        changes = {k: v.format(port=_closed_port()) for k, v in changes.items()}
        source = _source(changes.pop('url', f'{server}/ratings.txt'), **changes)
    result = _cli(args, source)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: ') and fragment in lines[0], lines
    assert not out.exists()

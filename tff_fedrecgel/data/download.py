"""Fetches a paper dataset's raw file from its pinned public address.

Each source is pinned by URL (a commit of a public GitHub repository, so the
bytes cannot change), size and digest. `fetch` streams the file into a
temporary name beside its destination, checks both, and only then renames it
to the name the task reads (`Task.raw_file`): a failed or refused download
leaves nothing behind. docs/DATA.md says who distributes each dataset and
under which terms.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import urllib.error
import urllib.request

from tff_fedrecgel.errors import DataError

_CHUNK = 1 << 16
TIMEOUT_SECONDS = 60


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a raw file comes from and what its bytes are.

    Attributes:
      url: The pinned address (None: no public download).
      size: Bytes.
      sha256: Hex SHA-256 of the bytes, or None where only `git_blob` is known.
      git_blob: Hex git blob id (SHA-1 of "blob <size>\\0" + bytes), as the
        source repository's tree lists it, or None.
      page: Where the source is described (repository, commit and path).
      licence: The terms, for the message of a file without a download.
    """

    url: str | None
    size: int | None = None
    sha256: str | None = None
    git_blob: str | None = None
    page: str = ''
    licence: str = ''


_PFEDREC = ('https://raw.githubusercontent.com/Zhangcx19/IJCAI-23-PFedRec/'
            'abc23809b9bca8f4f09fab5311ae4a63ed6159d2/data/')

# Sizes and SHA-256 measured on the raw files; their git blob ids are those
# the repositories' trees list at the pinned commits. The LastFM-2K copy
# measured here was derived from the GroupLens files and differs from the
# published bytes (docs/DATA.md), so that file is pinned by the size and git
# blob id of the repository's tree alone.
SOURCES = {
    'filmtrust': Source(
        url=('https://raw.githubusercontent.com/Coder-Yu/QRec/'
             'a141bb37cb7706b2f53b2eed5843de3269f9f37f/dataset/FilmTrust/ratings.txt'),
        size=376_445,
        sha256='241167424e24d588e8871d68641e94ead98d5b3a4f0db01ef3181a74ad35e7a1',
        git_blob='364b2d78af3e093c47a1d50a862cf650e38396a4',
        page='github.com/Coder-Yu/QRec, commit a141bb37, dataset/FilmTrust/ratings.txt'),
    'lastfm_2k': Source(
        url=_PFEDREC + 'lastfm-2k/ratings.dat',
        size=5_040_763,
        git_blob='760eecdc437f97a309ed5e3e9224059f9b720f03',
        page='github.com/Zhangcx19/IJCAI-23-PFedRec, commit abc23809, '
             'data/lastfm-2k/ratings.dat'),
    'amazon_video': Source(
        url=_PFEDREC + 'amazon/ratings.dat',
        size=2_664_311,
        sha256='a1292e4a4dba6c37be6ae5dc83d4404af96bf3eace4c8954e2f4e8360a3cdd76',
        git_blob='13975c04b5689f41360da3ed03f791d5282b8944',
        page='github.com/Zhangcx19/IJCAI-23-PFedRec, commit abc23809, '
             'data/amazon/ratings.dat'),
    'qb_article': Source(
        url=None,
        page='Tenrec (Yuan et al., NeurIPS 2022), github.com/yuangh-x/2022-NIPS-Tenrec',
        licence=('QB-article.csv is distributed only from the official Tenrec site after '
                 'you accept its licence (CC BY-NC 4.0); no public address serves it, so '
                 'it cannot be downloaded by a command. Accept the licence there, download '
                 'QB-article.csv and save it as {path}')),
}


def _digests(path: str) -> tuple[int, str, str]:
    size = os.path.getsize(path)
    sha256, blob = hashlib.sha256(), hashlib.sha1()
    blob.update(f'blob {size}\0'.encode())
    with open(path, 'rb') as f:
        while chunk := f.read(_CHUNK):
            sha256.update(chunk)
            blob.update(chunk)
    return size, sha256.hexdigest(), blob.hexdigest()


def check_file(path: str, source: Source, *, name: str | None = None) -> None:
    """Checks a file's size and digests against its pins.

    Args:
      path: The file.
      source: Its pins.
      name: What messages call it (default: `path`).

    Raises:
      DataError: Naming the first pin it does not match.
      OSError: If it cannot be read.
    """
    size, sha256, blob = _digests(path)
    name = name or path
    if source.size is not None and size != source.size:
        raise DataError(f'{name}: {size:,} bytes, expected {source.size:,}')
    if source.sha256 is not None and sha256 != source.sha256:
        raise DataError(f'{name}: SHA-256 {sha256}, expected {source.sha256}')
    if source.git_blob is not None and blob != source.git_blob:
        raise DataError(f'{name}: git blob id {blob}, expected {source.git_blob}')


def _stream(url: str, partial: str, limit: int | None, timeout: float) -> None:
    """Writes the body of `url` into `partial`, at most `limit` bytes (+1)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, \
                open(partial, 'xb') as out:
            written = 0
            while chunk := response.read(_CHUNK):
                written += len(chunk)
                out.write(chunk)
                if limit is not None and written > limit:
                    raise DataError(f'{url}: more than the expected {limit:,} bytes')
    except urllib.error.HTTPError as e:
        raise DataError(f'{url}: HTTP {e.code} {e.reason}') from e
    except urllib.error.URLError as e:
        raise DataError(f'{url}: unreachable ({e.reason})') from e
    except (TimeoutError, ConnectionError) as e:
        raise DataError(f'{url}: {e or type(e).__name__}') from e


def fetch(source: Source, destination: str, *,
          timeout: float = TIMEOUT_SECONDS) -> bool:
    """Downloads `source` to `destination` and checks it.

    Args:
      source: The pinned source (with a URL).
      destination: The file path to write (its folder is created if missing).
      timeout: Seconds a connection may stay silent.

    Returns:
      True if it was downloaded, False if `destination` already held the
      checked file.

    Raises:
      DataError: If the source has no URL, is unreachable, or its bytes do
        not match the pins; or `destination` exists with other bytes. Nothing
        is left written then.
      OSError: If the folder cannot be written.
    """
    if source.url is None:
        raise DataError(source.licence.format(path=destination))
    if os.path.exists(destination):
        try:
            check_file(destination, source)
        except DataError as e:
            raise DataError(f'{e}; it is already there: remove it to download again') from e
        return False
    folder = os.path.dirname(os.path.abspath(destination))
    created = []
    parent = folder
    while not os.path.isdir(parent):
        created.append(parent)
        parent = os.path.dirname(parent)
    os.makedirs(folder, exist_ok=True)
    partial = f'{destination}.partial-{os.getpid()}'
    try:
        _stream(source.url, partial, source.size, timeout)
        check_file(partial, source, name=source.url)
        os.replace(partial, destination)
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        for path in created:  # Innermost first: only the folders made here.
            try:
                os.rmdir(path)
            except OSError:
                break
        raise
    return True

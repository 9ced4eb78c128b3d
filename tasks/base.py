"""The `Task` type: one dataset with its reader and the authors' settings."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any, Union

import pandas as pd

from tff_fedrecgel import recipes
from tff_fedrecgel.data import preprocess as preprocess_lib
from tff_fedrecgel.data import split_io
from tff_fedrecgel.data.preprocess import Split
from tff_fedrecgel.errors import DataError

PathLike = Union[str, os.PathLike]

# Bump when the preprocessing changes results, to invalidate cached splits.
# A task's rounds and cohort fraction unless it says otherwise.
DEFAULT_ROUNDS = 100
DEFAULT_CLIENT_FRACTION = 0.1
PROTOCOL_VERSION = 2  # 2: the authors' tie rule (first-appearing item wins).


@dataclasses.dataclass(frozen=True)
class PreparedSplit:
    """A split and where it came from.

    Attributes:
      split: The split.
      cached: True if it was read back from ``cache_dir`` instead of computed.
      cache_dir: The folder holding the split files, or None.
    """

    split: Split
    cached: bool
    cache_dir: str | None


@dataclasses.dataclass(frozen=True)
class Task:
    """A dataset: where its raw file is, how to read it, and its settings.

    Attributes:
      name: Registry name (e.g. ``filmtrust``).
      raw_file: File name expected under ``data_dir`` (None: generated).
      rho_sh: SAM radius of the shared (item-side) parameters.
      rho_ns: SAM radius of the local (user-embedding) parameters.
      total_rounds: Default number of federated rounds.
      client_fraction: Default fraction of clients sampled per round.
      num_items: Fixed item count (Amazon-Video: 11,830), or None.
      description: One-line description.
      reader: ``reader(path, **options)`` (or ``reader(**options)`` when
        ``raw_file`` is None) returning the raw frame.
      option_names: Keyword options accepted by ``reader``.
      data_dir_may_be_file: Whether ``data_dir`` may name the file itself.
      tuned: The 'tuned' preset: settings (by their command-line names) that
        replace the paper's protocol where the run does not set them itself,
        chosen on the validation item (docs/RESULTS.md).
      default_preset: The preset of a run that names none: 'paper' for the
        paper's datasets (to reproduce it), 'auto' for data of one's own.
      options_check: ``options_check(options)`` raises `OptionError` on a
        reader option of the wrong type or out of range (None: no check).
    """

    name: str
    raw_file: str | None
    rho_sh: float
    rho_ns: float
    total_rounds: int = DEFAULT_ROUNDS
    client_fraction: float = DEFAULT_CLIENT_FRACTION
    num_items: int | None = None
    description: str = ''
    reader: Callable[..., pd.DataFrame] | None = dataclasses.field(
        default=None, repr=False, compare=False)
    option_names: tuple[str, ...] = ()
    data_dir_may_be_file: bool = False
    tuned: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    default_preset: str = recipes.PAPER
    options_check: Callable[[Mapping[str, Any]], None] | None = dataclasses.field(
        default=None, repr=False, compare=False)

    def preset(self, name: str | None = None,
               profile: recipes.DataProfile | None = None) -> dict[str, Any]:
        """The settings of a preset (`recipes`): 'paper', 'tuned', 'auto' or
        a ``.json`` file.

        Args:
          name: The preset (None: `default_preset`).
          profile: The data's profile, for presets derived from the data.

        Raises:
          DataError: For an unknown preset or an unreadable preset file.
        """
        return recipes.preset_values(self.default_preset if name is None else name,
                                     self.tuned, profile)

    def check_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The reader options given (None values dropped), checked.

        Raises:
          DataError: On an unknown option; `OptionError` on one of the
            wrong type or out of range.
        """
        unknown = sorted(map(str, set(options) - set(self.option_names)))
        if unknown:
            allowed = ', '.join(self.option_names) or 'none'
            raise DataError(
                f'{self.name}: unknown option(s) {", ".join(unknown)} '
                f'(allowed: {allowed})')
        # None means "use the reader's default": drop it so keys stay stable.
        given = {k: v for k, v in sorted(options.items()) if v is not None}
        if self.options_check is not None:
            self.options_check(given)
        return given

    def raw_path(self, data_dir: PathLike | None) -> str | None:
        """The raw file this task reads.

        Args:
          data_dir: Folder holding ``raw_file`` (or, for CSV, the file).

        Returns:
          The path, or None for generated data.

        Raises:
          DataError: If ``data_dir`` or the file is missing.
        """
        if self.raw_file is None:
            if data_dir is not None:
                raise DataError(f'{self.name}: the data is generated, it reads no data '
                                f'directory (got {os.fspath(data_dir)!r})')
            return None
        if data_dir is None or not os.fspath(data_dir):
            raise DataError(
                f'{self.name}: no data directory given (it must hold '
                f'{self.raw_file})')
        data_dir = os.fspath(data_dir)
        if self.data_dir_may_be_file and os.path.isfile(data_dir):
            return data_dir
        if not os.path.exists(data_dir):
            what = 'data file or directory' if self.data_dir_may_be_file else 'data directory'
            raise DataError(f'{data_dir}: {what} not found')
        if not os.path.isdir(data_dir):
            from tff_fedrecgel.data.loaders import file_kind  # pylint: disable=g-import-not-at-top

            kind = file_kind(data_dir) or 'a file'
            expected = 'a folder or the file itself' if self.data_dir_may_be_file else 'a folder'
            raise DataError(f'{data_dir}: is {kind}, expected {expected} (holding '
                            f'{self.raw_file})')
        path = os.path.join(data_dir, self.raw_file)
        if not os.path.exists(path):
            raise DataError(f'{path}: file not found (download it first; see '
                            'docs/DATA.md)')
        return path

    def load_raw(self, data_dir: PathLike | None = None,
                 **options: Any) -> pd.DataFrame:
        """Reads the raw interactions.

        Args:
          data_dir: Folder holding the raw file (ignored for generated data).
          **options: Reader options (see ``option_names``).

        Returns:
          The raw frame (``user``, ``item``, ``timestamp``).

        Raises:
          DataError: On unknown options or bad input.
        """
        options = self.check_options(options)
        path = self.raw_path(data_dir)
        if path is None:
            return self.reader(**options)
        return self.reader(path, **options)

    def cache_key(self, data_dir: PathLike | None, *, validation: bool,
                  eval_negatives: int = preprocess_lib.NUM_HELDOUT_NEGATIVES,
                  **options: Any) -> dict[str, Any]:
        """Everything the split depends on, for `split_io.load_or_compute`.

        Args:
          data_dir: As for `load_raw`.
          validation: Whether a validation item is held out.
          eval_negatives: Sampled evaluation negatives per user.
          **options: Reader options.

        Returns:
          A JSON-serializable key (includes the raw file's fingerprint).

        Raises:
          DataError: If the raw file is missing.
        """
        options = self.check_options(options)
        path = self.raw_path(data_dir)
        return {
            'dataset': self.name,
            'options': options,
            'validation': bool(validation),
            'protocol': {
                'version': PROTOCOL_VERSION,
                'min_interactions': preprocess_lib.MIN_INTERACTIONS,
                'num_negatives': int(eval_negatives),
                'test_seed': preprocess_lib.TEST_NEGATIVE_SEED,
                'valid_seed': preprocess_lib.VALID_NEGATIVE_SEED,
                'num_items': self.num_items,
            },
            'source': None if path is None else split_io.file_fingerprint(path),
        }

    def _compute(self, data_dir: PathLike | None, validation: bool, eval_negatives: int,
                 options: Mapping[str, Any]) -> Split:
        raw = self.load_raw(data_dir, **options)
        source = self.raw_path(data_dir) or self.name
        return preprocess_lib.build_split(raw, validation=validation,
                                         num_items=self.num_items,
                                         num_negatives=eval_negatives, source=source)

    def prepare(self, *, data_dir: PathLike | None = None,
                validation: bool = False, cache_dir: PathLike | None = None,
                write_csv: bool = False,
                eval_negatives: int = preprocess_lib.NUM_HELDOUT_NEGATIVES,
                **options: Any) -> PreparedSplit:
        """Loads, preprocesses and (with ``cache_dir``) caches the split.

        Args:
          data_dir: As for `load_raw`.
          validation: Also hold out each user's second-latest interaction.
          cache_dir: Folder for the split files; reused when the raw input,
            options and format are unchanged.
          write_csv: Also write text copies of the split (train.csv,
            test.csv, valid.csv) to ``cache_dir``.
          eval_negatives: Sampled evaluation negatives per user (the
            paper's 99; 0 for a run that ranks against every item only).
          **options: Reader options.

        Returns:
          The split with its cache status.

        Raises:
          DataError: On bad input or an unwritable ``cache_dir``.
        """
        if cache_dir is None:
            return PreparedSplit(self._compute(data_dir, validation, eval_negatives, options),
                                 cached=False, cache_dir=None)
        key = self.cache_key(data_dir, validation=validation,
                             eval_negatives=eval_negatives, **options)
        split, cached = split_io.load_or_compute(
            cache_dir, key=key,
            compute=lambda: self._compute(data_dir, validation, eval_negatives, options),
            csv=write_csv)
        return PreparedSplit(split, cached=cached,
                             cache_dir=os.fspath(cache_dir))

    def load_split(self, *, data_dir: PathLike | None = None,
                   validation: bool = False, cache_dir: PathLike | None = None,
                   eval_negatives: int = preprocess_lib.NUM_HELDOUT_NEGATIVES,
                   **options: Any) -> Split:
        """Like `prepare`, returning only the split."""
        return self.prepare(data_dir=data_dir, validation=validation, cache_dir=cache_dir,
                            eval_negatives=eval_negatives, **options).split

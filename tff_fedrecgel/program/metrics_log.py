"""Every finished round's metrics row, and `metrics.csv` written from them."""

from __future__ import annotations

from collections.abc import Mapping
import csv
import io
import json
from typing import Any

import numpy as np
import tree

from tff_fedrecgel.program.evaluation_plan import EvaluationPlan
from tff_fedrecgel.program.outputs import write_atomically

KEY_COLUMN = 'round'


class MetricsLog:
    """Every finished round's row; `metrics.csv` is rewritten from it whole.

    Columns: `round`, then the flattened names (`train/loss`, `test/hr@10`,
    ...) in the plan's reading order (`EvaluationPlan.column_order`); values
    as TFF's CSV release manager writes them.
    """

    def __init__(self, path, rows: list[dict[str, Any]], plan: EvaluationPlan):
        self._path = path
        self.rows = list(rows)
        self._plan = plan

    def add(self, round_num: int, released: Mapping[str, Any]) -> None:
        row = {KEY_COLUMN: int(round_num)}
        for path, value in tree.flatten_with_path(released):
            row['/'.join(map(str, path))] = np.asarray(value).tolist()
        self.rows = [r for r in self.rows if r[KEY_COLUMN] < round_num] + [row]

    def write(self) -> None:
        names = (k for row in self.rows for k in row if k != KEY_COLUMN)
        columns = [KEY_COLUMN] + self._plan.column_order(names)
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=columns)
        writer.writeheader()
        writer.writerows(self.rows)
        write_atomically(self._path, text.getvalue())

    def to_state(self) -> np.ndarray:
        return np.array(json.dumps(self.rows))

    @staticmethod
    def from_state(value) -> list[dict[str, Any]]:
        value = value.item() if isinstance(value, np.ndarray) else value
        if isinstance(value, bytes):
            value = value.decode('utf-8')
        return json.loads(value)

"""Error types shared by the library and its entry points."""

from typing import Any


class DataError(ValueError):
    """A problem with input data, a data option or an output folder.

    The message is a single line that names the file (or folder, or option)
    and the problem, so that entry points can print it as
    ``error: <message>`` and exit with status 2 without a traceback.
    """


class OptionError(DataError):
    """A data option of a task out of its range or of the wrong type.

    `str(e)` reads `<task>: <option> <problem>`; entry points print the
    flag of the option instead (`flag_message`).

    Attributes:
      task: The task's name.
      option: The option's name (as `Task.option_names`).
      problem: What is wrong, e.g. `must be >= 1, got 0`.
    """

    def __init__(self, task: str, option: str, problem: str):
        super().__init__(f'{task}: {option}{_joined(problem)}')
        self.task, self.option, self.problem = task, option, problem

    def flag_message(self, flag: str) -> str:
        """The message in the words of the command line (`flag` without --)."""
        return f'--{flag}{_joined(self.problem)}'


def _joined(problem: str) -> str:
    # "num_users=5 needs ..." or "num_users must be ...".
    return problem if problem.startswith('=') else f' {problem}'


class SettingError(ValueError):
    """One setting out of its range: `name`, then what it must be.

    `str(e)` reads `<name> <requirement>, got <value>`; entry points print
    `--<name> ...`, the flag of the same name.
    """

    def __init__(self, name: str, requirement: str, value: Any = None):
        super().__init__(f'{name} {requirement}{self._got(value)}')
        self.name, self.requirement, self.value = name, requirement, value

    @staticmethod
    def _got(value: Any) -> str:
        return '' if value is None else f', got {value!r}'

    def flag_message(self) -> str:
        """The message in the words of the command line."""
        return f'--{self.name} {self.requirement}{self._got(self.value)}'

"""Error types shared by the library and its entry points."""


class DataError(ValueError):
    """A problem with input data, a data option or an output folder.

    The message is a single line that names the file (or folder, or option)
    and the problem, so that entry points can print it as
    ``error: <message>`` and exit with status 2 without a traceback.
    """

"""The command-line flags of one concern, made from `settings_tree`.

Each concern's flag module calls `define(concern, __name__)`: a flag per
setting of that leaf, with the setting's name, help and choices, the type of
its `run_settings.Settings` field (or of the option itself, for what is not
recorded), and the `Settings` default, except where the task fills the
value in (the flag then has no default and its help says whose it is).
"""

from __future__ import annotations

from absl import flags

from tff_fedrecgel import methods
from tff_fedrecgel import run_settings
from tff_fedrecgel import setting_checks
from tff_fedrecgel import settings_tree
from tff_fedrecgel import tasks



def _kind(setting: settings_tree.Setting) -> str:
    if not setting.recorded:
        return setting.kind
    field = run_settings.Settings.__dataclass_fields__[setting.name]  # pylint: disable=no-member
    kind, _ = setting_checks.field_kind(field)
    return kind


def _default(setting: settings_tree.Setting):
    if setting.filled is not None:
        return None
    return run_settings.default(setting.name) if setting.recorded else setting.default


def _registry(setting: settings_tree.Setting) -> tuple[tuple[str, ...] | None, str]:
    """(choices, help) of a setting, a registry's names and descriptions included."""
    if setting.registry == 'methods':
        return methods.METHOD_NAMES, '; '.join(
            f'{m.name}: {m.description}' for m in methods.METHODS.values()) + '.'
    if setting.registry == 'tasks':
        return tasks.TASK_NAMES, setting.help
    return setting.choices, setting.help


def _define(setting: settings_tree.Setting, module_name: str) -> flags.FlagHolder:
    name, default = setting.name, _default(setting)
    choices, text = _registry(setting)
    if setting.filled == 'task':
        text = text.rstrip('.') + " (default: the task's)."
    if setting.entries is not None:
        return flags.DEFINE_list(name, ','.join(map(str, default)), text,
                                 module_name=module_name)
    if choices is not None:
        return flags.DEFINE_enum(name, default, [str(c) for c in choices], text,
                                 module_name=module_name)
    define = {'int': flags.DEFINE_integer, 'float': flags.DEFINE_float,
              'bool': flags.DEFINE_bool, 'str': flags.DEFINE_string}[_kind(setting)]
    return define(name, default, text, module_name=module_name)


def define(concern: str, module_name: str,
           only: tuple[str, ...] | None = None) -> dict[str, flags.FlagHolder]:
    """Defines the flags of a concern's settings in `module_name`.

    Args:
      concern: A leaf of `settings_tree.TREE`.
      module_name: The defining module (its flags are its key flags).
      only: Just these settings of the leaf (None: all of them).

    Returns:
      The flags by setting name.
    """
    return {s.name: _define(s, module_name) for s in settings_tree.leaf(concern).settings
            if only is None or s.name in only}

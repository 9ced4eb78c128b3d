"""The structure docs/ARCHITECTURE.md draws: imports run one way, modules stay small.

Module-level imports only: a function-level import on first use (a protocol
reaching its implementation, a package's lazy alias) runs after every
module has loaded, so it cannot make a cycle at import time.
"""

import ast
import collections
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
# Where each part of the installed package lives in the repository.
SOURCES = (('tff_fedrecgel', 'tff_fedrecgel'), ('tasks', 'tff_fedrecgel.tasks'),
           ('launch', 'tff_fedrecgel.launch'))
# The layers, top first: a module never imports a layer above its own.
LAYERS = (('launch',), ('api',), ('program',), ('simulation',), ('algorithms', 'evaluation'),
          ('models', 'data', 'optimizers'))
# A package under `recommenders` is one method: its roles stand in the layers.
METHOD_PACKAGE_ROLES = {'computation': 'algorithms', 'adapter': 'simulation'}
MAX_LINES = 500


def _modules() -> dict[str, pathlib.Path]:
    modules = {}
    for folder, package in SOURCES:
        for path in (REPO / folder).rglob('*.py'):
            parts = [p for p in path.relative_to(REPO / folder).with_suffix('').parts
                     if p != '__init__']
            if folder == 'tff_fedrecgel' and parts and parts[0] in ('tasks', 'launch'):
                continue  # Links to the folders above in a development checkout.
            modules['.'.join([package, *parts])] = path
    return modules


def _top_level(tree: ast.Module):
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            todo += [*node.body, *node.orelse, *getattr(node, 'finalbody', []),
                     *(s for h in getattr(node, 'handlers', []) for s in h.body)]


def _graph(modules: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    def resolve(name):
        while name and name not in modules:
            name = name.rpartition('.')[0]
        return name

    graph = collections.defaultdict(set)
    for module, path in modules.items():
        for node in _top_level(ast.parse(path.read_text(encoding='utf-8'))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f'{node.module}.{a.name}' for a in node.names]
            else:
                continue
            for name in names:
                target = resolve(name) if name.startswith('tff_fedrecgel') else None
                if target and target != module and not module.startswith(target + '.'):
                    graph[module].add(target)
    return graph


def _layer(module: str) -> int | None:
    parts = module.split('.')
    part = parts[1] if len(parts) > 1 else module
    if part == 'recommenders' and len(parts) > 3:
        part = METHOD_PACKAGE_ROLES[parts[3]]
    return next((i for i, names in enumerate(LAYERS) if part in names), None)


def test_module_imports_have_no_cycle():
    graph = _graph(_modules())
    state: dict[str, int] = {}  # 1: on the path, 2: done.
    cycles = []

    def visit(module, path):
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(_modules()):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_no_layer_imports_one_above_it():
    graph = _graph(_modules())
    upward = [(a, b) for a, targets in graph.items() for b in targets
              if _layer(a) is not None and _layer(b) is not None and _layer(b) < _layer(a)]
    assert not upward, upward
    # Nothing in the library reads flags.
    assert not [a for a, targets in graph.items() if not a.startswith('tff_fedrecgel.launch')
                and any(t.startswith('tff_fedrecgel.launch') for t in targets)]


def test_no_module_is_over_500_lines():
    long = {str(p.relative_to(REPO)): n for p in _modules().values()
            if (n := len(p.read_text(encoding='utf-8').splitlines())) > MAX_LINES}
    assert not long, long


def test_each_recommender_package_is_one_method_on_its_own():
    """A method's package holds only its computation and adapter, and
    imports no other method's package (adding one touches nothing else)."""
    modules = _modules()
    graph = _graph(modules)
    packages = {m.split('.')[2] for m in modules
                if m.startswith('tff_fedrecgel.recommenders.') and m.count('.') >= 2}
    assert {'pfedrec', 'gpfedrec', 'fedrap'} <= packages
    for module in modules:
        parts = module.split('.')
        if parts[:2] == ['tff_fedrecgel', 'recommenders'] and len(parts) > 3:
            assert parts[3] in METHOD_PACKAGE_ROLES, module
            others = [t for t in graph[module] if t.startswith('tff_fedrecgel.recommenders.')
                      and t.split('.')[2] != parts[2]]
            assert not others, (module, others)

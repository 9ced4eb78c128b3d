"""TFF type walks for the privacy tests: what is placed where, and what
reaches the server."""

import tensorflow_federated as tff


def walk(type_spec, placement=None):
    """(placement, type) of every node of a TFF type."""
    if isinstance(type_spec, tff.FederatedType):
        yield from walk(type_spec.member, type_spec.placement)
    elif isinstance(type_spec, tff.StructType):
        for _, member in tff.structure.iter_elements(type_spec):
            yield from walk(member, placement)
    elif isinstance(type_spec, tff.FunctionType):
        yield from walk(type_spec.parameter, placement)
        yield from walk(type_spec.result, placement)
    elif type_spec is not None:
        yield placement, type_spec


def uploads(comp):
    """(intrinsic, CLIENTS-placed operand types) of every intrinsic with a SERVER result."""
    flows = []

    def visit(node):
        if isinstance(node, tff.framework.Intrinsic):
            sig = node.type_signature
            members = [t for p, t in walk(sig.parameter) if p == tff.CLIENTS]
            if members and any(p == tff.SERVER for p, _ in walk(sig.result)):
                flows.append((node.uri, members))
        return node, False

    tff.framework.transform_postorder(comp.to_building_block(), visit)
    return flows


def nodes(type_spec, placement=None):
    """(placement, type) of every node of a TFF type, the inner ones too
    (federated, struct and sequence types as well as their members)."""
    yield placement, type_spec
    if isinstance(type_spec, tff.FederatedType):
        yield from nodes(type_spec.member, type_spec.placement)
    elif isinstance(type_spec, tff.StructType):
        for element in type_spec:
            yield from nodes(element, placement)
    elif isinstance(type_spec, tff.FunctionType):
        if type_spec.parameter is not None:
            yield from nodes(type_spec.parameter, placement)
        yield from nodes(type_spec.result, placement)
    elif isinstance(type_spec, tff.SequenceType):
        yield from nodes(type_spec.element, placement)

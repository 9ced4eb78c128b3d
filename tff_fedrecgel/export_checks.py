"""Checks of exported TFF types: their byte sizes and what the server sees.

`export.build_deployment` sizes each device's traffic with `type_bytes` and
refuses a deployment whose server-visible types carry user-local weights
(`find_local_weights_on_server`): the privacy invariant of the algorithm.
"""

from __future__ import annotations

from collections.abc import Iterator
import math

import numpy as np
import tensorflow_federated as tff

from tff_fedrecgel.algorithms import fedrecgel
from tff_fedrecgel.models import neumf

# Where each computation runs. 'federated' computations span placements (only
# their SERVER-placed parts are server-visible); 'aggregation' pieces run in
# the aggregation tier (server side, possibly several machines).
DEVICE = 'device'
SERVER = 'server'
AGGREGATION = 'aggregation'
FEDERATED = 'federated'

def type_bytes(type_spec: tff.Type) -> int:
    """Bytes of the tensors in a type (placements ignored).

    Args:
      type_spec: A TFF type of fully defined tensor shapes.

    Returns:
      The total size in bytes.

    Raises:
      ValueError: If a tensor shape is not fully defined or a part is not a
        tensor, struct or federated type.
    """
    if isinstance(type_spec, tff.FederatedType):
        return type_bytes(type_spec.member)
    if isinstance(type_spec, tff.StructType):
        return sum(type_bytes(t) for t in type_spec)
    if isinstance(type_spec, tff.TensorType):
        if type_spec.shape is None or any(d is None for d in type_spec.shape):
            raise ValueError(f'tensor size unknown: {type_spec}')
        return np.dtype(type_spec.dtype).itemsize * math.prod(type_spec.shape)
    raise ValueError(f'cannot size type {type_spec}')


def _server_visible(type_spec: tff.Type, on_server: bool) -> Iterator[tff.Type]:
    """Yields every server-visible part of `type_spec`, outermost first."""
    if isinstance(type_spec, tff.FederatedType):
        yield from _server_visible(
            type_spec.member, type_spec.placement is tff.SERVER
        )
        return
    if on_server:
        yield type_spec
    if isinstance(type_spec, tff.FunctionType):
        if type_spec.parameter is not None:
            yield from _server_visible(type_spec.parameter, on_server)
        yield from _server_visible(type_spec.result, on_server)
    elif isinstance(type_spec, tff.StructType):
        for element in type_spec:
            yield from _server_visible(element, on_server)


def find_local_weights_on_server(
    type_signature: tff.Type, *, runs_on: str, pieces: fedrecgel.RoundPieces,
    model_config: neumf.ModelConfig,
) -> list[str]:
    """Server-visible parts of a signature that look like user-local weights.

    A part is flagged when it is the client-state struct or a tensor shaped like
    a user embedding row (`[1, gmf_dim]`, `[1, mlp_dim]`). Shapes that some
    global weight also has (only with `num_items == 1`) are not flagged.

    Args:
      type_signature: The computation's type signature.
      runs_on: DEVICE (nothing is server-visible), SERVER or AGGREGATION
        (everything is), or FEDERATED (the SERVER-placed parts are).
      pieces: The round's parts (for the client-state type).
      model_config: The NeuMF sizes.

    Returns:
      One description per flagged part; empty when the signature is clean.
    """
    if runs_on == DEVICE:
        return []
    global_shapes = {tuple(s.shape) for s in neumf.global_weight_specs(model_config)}
    local_shapes = {
        tuple(s.shape) for s in neumf.local_weight_specs(model_config)} - global_shapes
    found = []
    for part in _server_visible(type_signature, runs_on != FEDERATED):
        if pieces.client_state_type is not None and part.is_equivalent_to(
            pieces.client_state_type
        ):
            found.append(f'client state struct {part}')
        elif isinstance(part, tff.TensorType) and tuple(part.shape) in local_shapes:
            found.append(f'user-embedding-shaped tensor {part}')
    return found

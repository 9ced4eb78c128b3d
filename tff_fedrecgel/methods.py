"""The methods a run can train, and what each fixes.

FedRecGEL, FedNCF and the two SAM ablations are one algorithm with different
SAM radii; FedMF is it on the GMF-only model; FedRecon is TFF's Federated
Reconstruction on the same NeuMF. The command line, the study plan and the
simulation builder all read this one table. Imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import numbers

from tff_fedrecgel.algorithm_config import SERVER_OPTIMIZERS
from tff_fedrecgel.errors import SettingError

FEDRECGEL = 'fedrecgel'
FEDRECON = 'fedrecon'
ITEMPOP = 'itempop'
CENTRAL = 'central'


@dataclasses.dataclass(frozen=True)
class Method:
    """One trainable method.

    Attributes:
      name: Its `--algorithm` name.
      description: One line for help texts.
      rho_sh: The global radius it fixes (None: the task's or the flag's).
      rho_ns: The local radius it fixes (None: the task's or the flag's).
      gmf_only: Whether it uses the GMF-only model (no MLP branch).
      algorithm: What trains it: `FEDRECGEL`, `FEDRECON`, `ITEMPOP` (the
        popularity floor) or `CENTRAL` (the non-federated ceiling).
    """

    name: str
    description: str
    rho_sh: float | None = None
    rho_ns: float | None = None
    gmf_only: bool = False
    algorithm: str = FEDRECGEL

    def radii(self, rho_sh: float, rho_ns: float) -> tuple[float, float]:
        """The radii a run uses, given the task's (or the flags') radii.

        Raises:
          SettingError: If a radius is not a number.
        """
        for name, value in (('rho_sh', rho_sh), ('rho_ns', rho_ns)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise SettingError(name, 'must be a number', value)
        return (float(rho_sh if self.rho_sh is None else self.rho_sh),
                float(rho_ns if self.rho_ns is None else self.rho_ns))


METHODS = {m.name: m for m in (
    Method('fedrecgel', 'SAM on both parts with the task\'s radii (the paper\'s method)'),
    Method('fedncf', 'no SAM (the FedNCF baseline)', rho_sh=0.0, rho_ns=0.0),
    Method('sam_global', 'SAM on the global part only (ablation)', rho_ns=0.0),
    Method('sam_local', 'SAM on the local part only (ablation)', rho_sh=0.0),
    Method('fedmf', 'the GMF-only model without SAM (the FedMF baseline)',
           rho_sh=0.0, rho_ns=0.0, gmf_only=True),
    Method('fedrecon', 'TFF\'s Federated Reconstruction (build_fed_recon) on the same '
           'NeuMF: no user state, embeddings rebuilt every round',
           rho_sh=0.0, rho_ns=0.0, algorithm=FEDRECON),
    Method('itempop', 'item popularity counted federatedly, no model (the floor)',
           rho_sh=0.0, rho_ns=0.0, algorithm=ITEMPOP),
    Method('central', 'the same NeuMF trained centrally on the pooled data with Keras, '
           'a round = an epoch (the non-federated ceiling, not a federated method)',
           rho_sh=0.0, rho_ns=0.0, algorithm=CENTRAL),
)}
METHOD_NAMES = tuple(METHODS)


def get_method(name: str) -> Method:
    """Looks a method up by name.

    Raises:
      ValueError: For an unknown name.
    """
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f'unknown method {name!r}; choose one of '
                         f'{", ".join(METHOD_NAMES)}') from None

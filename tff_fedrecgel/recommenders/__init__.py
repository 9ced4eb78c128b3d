"""Recommenders with their own model and round, one package each.

A package here is one method: `computation.py` holds its TFF computations
(the algorithms layer) and `adapter.py` its simulation adapter with the
`build(method, context)` that `methods.py` names (the simulation layer). A
package imports shared parts of the library, never another package here;
registering it is its `Method` entry in `methods.py`. Nothing is imported
here, so that the registry loads a method only when a run builds it.
"""

"""Nested probabilistic models with exact costs and fast EM (see README, "Data encoding")."""

from .base import FAMILIES, Internal, Leaf, Node
from .categorical import Categorical
from .composite import Composite
from .cost import NodeCost, PlacedCost, tree_costs
from .data import Ragged, concat_rows, n_rows, take_index, take_rows
from .engine import e_step, em_step
from .diagnose import fit_warnings
from .errors import ConvergenceWarning, DataError, EmgridError, ModelError, SpecError
from .exponential import Exponential
from .gaussian import DiagGaussian, FullGaussian, Gaussian
from .hmm import HMM
from .init import complete_shapes, initialize
from .mixture import Mixture
from .poisson import Poisson
from .sequence import Sequence
from .shard import ShardView, coupling_bytes_per_row, shard_roots, spanning_nodes
from .spec import from_spec, load_model, save_model
from .stats import Stats

__all__ = [
    "Gaussian", "DiagGaussian", "FullGaussian", "Categorical", "Poisson", "Exponential",
    "Composite", "Mixture", "HMM", "Sequence", "Ragged", "Node", "Leaf", "Internal", "FAMILIES",
    "NodeCost", "PlacedCost", "tree_costs", "coupling_bytes_per_row", "shard_roots", "spanning_nodes", "ShardView",
    "Stats", "e_step", "em_step", "from_spec", "load_model", "save_model", "n_rows", "take_rows",
    "take_index", "concat_rows", "DataError", "ModelError", "SpecError", "EmgridError",
    "complete_shapes", "initialize", "fit_warnings", "ConvergenceWarning",
]

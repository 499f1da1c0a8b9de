"""The decision variables of one grid layout's program, and the questions asked of them.

For ``M`` shard columns, units ``u`` and the expanded internal nodes ``i`` of the unit
tree (``planner.units``):

- ``x[u][s]``: unit ``u`` is on shard ``s``;
- ``own[i][s]``: every unit below node ``i`` is on shard ``s`` (the node is evaluated by
  that shard alone);
- ``spanning[i]``: the node's units lie on two or more shards (``spanning[i] + sum_s own[i][s] = 1``),
  so every shard evaluates it;
- ``count[k][s]``: how many units of class ``k`` of interchangeable units are on shard
  ``s`` (``= sum_{u in k} x[u][s]``); sums over units use these, which gives the search
  integer quantities to branch on instead of many equivalent booleans.

A node is *evaluated* by shard ``s`` exactly when ``own[i][s] + spanning[i] = 1``; a unit when
``x[u][s] = 1``. With ``M > 1`` the root is spanning (every shard holds a unit), so its
``own`` and ``spanning`` are constants.
"""

from __future__ import annotations

import numpy as np
from ortools.sat.python import cp_model

from .units import UnitTree, unit_classes


class ShardVars:
    """Every decision variable of one program, with the linear forms built on them."""

    def __init__(self, model: cp_model.CpModel, ut: UnitTree, m: int):
        self.ut = ut
        self.m = m
        self.x = [[model.new_bool_var(f"x[{u},{s}]") for s in range(m)] for u in range(ut.n_units)]
        self.own: list[list] = []
        self.spanning: list = []
        for i in range(ut.n_internal):
            if i == 0 and m > 1:
                self.own.append([0] * m)
                self.spanning.append(1)
            else:
                self.own.append([model.new_bool_var(f"own[{i},{s}]") for s in range(m)])
                self.spanning.append(model.new_bool_var(f"spanning[{i}]"))
        self.classes = [k for k in unit_classes(ut) if len(k) > 1]
        self.count = []
        for j, k in enumerate(self.classes):
            row = []
            for s in range(m):
                c = model.new_int_var(0, len(k), f"count[{j},{s}]")
                model.add(c == sum(self.x[u][s] for u in k))
                row.append(c)
            self.count.append(row)

    def evaluated_sum(self, unit_coef: np.ndarray, internal_coef: np.ndarray, s: int,
                      spanning_coef: np.ndarray | None = None):
        """``sum_u c_u x[u][s] + sum_i (c_i own[i][s] + c'_i spanning[i])`` with integer
        coefficients (``c' = spanning_coef``, default ``c``)."""
        terms, coefs = [], []
        const = 0
        grouped = set()
        for j, k in enumerate(self.classes):
            c = int(unit_coef[k[0]])
            if all(int(unit_coef[u]) == c for u in k):
                grouped.update(k)
                if c:
                    terms.append(self.count[j][s])
                    coefs.append(c)
        for u, c in enumerate(unit_coef):
            if c and u not in grouped:
                terms.append(self.x[u][s])
                coefs.append(int(c))
        spanning_coef = internal_coef if spanning_coef is None else spanning_coef
        pairs = [(self.own[i][s], c) for i, c in enumerate(internal_coef) if c]
        pairs += [(self.spanning[i], c) for i, c in enumerate(spanning_coef) if c]
        return cp_model.LinearExpr.weighted_sum(terms, coefs) + const + _linear(pairs)

    def evaluated_max(self, model: cp_model.CpModel, unit_coef: np.ndarray, internal_coef: np.ndarray, s: int,
                      name: str, spanning_coef: np.ndarray | None = None):
        """An integer variable ``>= c`` for every unit and internal node evaluated on shard
        ``s`` (``spanning_coef`` for a spanning internal node, default ``internal_coef``): their
        largest ``c`` when minimized; 0 when every ``c`` is 0."""
        spanning_coef = internal_coef if spanning_coef is None else spanning_coef
        always = [int(c) for i, c in enumerate(spanning_coef) if isinstance(self.spanning[i], int) and self.spanning[i] == 1]
        floor = max(always, default=0)  # the root, spanning every shard when M > 1
        top = max(floor, int(max(unit_coef, default=0)), int(max(internal_coef, default=0)),
                  int(max(spanning_coef, default=0)))
        if top == floor:
            return floor
        t = model.new_int_var(floor, top, name)
        lits = [(self.x[u][s], c) for u, c in enumerate(unit_coef)]
        lits += [(self.own[i][s], c) for i, c in enumerate(internal_coef)]
        lits += [(self.spanning[i], c) for i, c in enumerate(spanning_coef)]
        for lit, c in lits:
            if c > floor and not isinstance(lit, int):
                model.add(t >= int(c)).only_enforce_if(lit)
        return t

    def spanning_sum(self, coef: np.ndarray):
        """``sum_i c_i spanning[i]`` with integer coefficients."""
        return _linear([(self.spanning[i], c) for i, c in enumerate(coef) if c])

    def shard_of(self, solver: cp_model.CpSolver, u: int) -> int:
        return next(s for s in range(self.m) if solver.boolean_value(self.x[u][s]))

    def extract(self, solver: cp_model.CpSolver) -> np.ndarray:
        """The solution's ``unit_shard``."""
        return np.array([self.shard_of(solver, u) for u in range(self.ut.n_units)], dtype=np.int64)

    def hint(self, model: cp_model.CpModel, unit_shard: np.ndarray) -> None:
        """A complete hint: every variable's value under ``unit_shard``."""
        ut, m = self.ut, self.m
        for u in range(ut.n_units):
            for s in range(m):
                model.add_hint(self.x[u][s], int(unit_shard[u]) == s)
        shards: list[set[int]] = [set() for _ in range(ut.n_internal)]
        for i in range(ut.n_internal - 1, -1, -1):
            for u in ut.child_units[i]:
                shards[i].add(int(unit_shard[u]))
            for c in ut.child_internal[i]:
                shards[i] |= shards[c]
            if i == 0 and m > 1:
                continue
            whole = next(iter(shards[i])) if len(shards[i]) == 1 else -1
            for s in range(m):
                model.add_hint(self.own[i][s], s == whole)
            model.add_hint(self.spanning[i], whole < 0)


def _linear(pairs):
    """``sum c * v`` over ``(v, c)`` pairs where ``v`` is a CP-SAT variable or a fixed int."""
    terms, coefs, const = [], [], 0
    for var, c in pairs:
        if isinstance(var, int):
            const += int(c) * var
        else:
            terms.append(var)
            coefs.append(int(c))
    return cp_model.LinearExpr.weighted_sum(terms, coefs) + const

"""The sharded M-step, shared by every executor: no process ever holds the whole model.

Per iteration, after the E-step (:mod:`executors.step`):

1. **Column reduce.** The statistics of shard ``s`` are summed over the ``D`` replicas of
   its column by a tree reduce to the column's *head*, the worker of cell ``(0, s)``
   (:func:`column_reduce`, in ``ceil(log2 D)`` rounds, one fixed order; no worker holds
   more than its running sum and one partial sum in transit).
2. **Shard M-step.** The head estimates the subtrees of its shard roots from the column's
   totals (:meth:`ShardPart.estimate`) and keeps them pending. It reports to the
   coordinator only a :class:`ColumnReport`: the column's log-likelihood, the statistics
   of the spanning nodes (the lead column's only; small: mixture weights, HMM
   transitions) and the first node whose statistics are not finite.
3. **Split M-step.** The coordinator joins the reports in shard order
   (:func:`join_columns`), stops on non-finite statistics, and estimates the spanning nodes
   of its *skeleton* (:meth:`models.shard.ShardView.skeleton`: the spanning nodes with
   every shard root a stub), which is all of the model it holds.
4. **Update.** The new skeleton goes to every worker; each head sends its pending subtrees
   to the other workers of its column; every worker splices both into its part
   (:meth:`ShardPart.apply`).

Every node's new parameters come from the same statistics summed in the same order as a
whole-model M-step on one process (the column sums in :func:`tree_rounds`' order, then
the columns in shard order, disjoint paths), so traces do not depend on the executor. The fitted model
leaves the grid shard by shard (:class:`Shards`).
"""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from time import perf_counter

from emgrid.models import Node, ShardView, Stats
from emgrid.models.diagnose import fit_warnings
from emgrid.models.estimate import estimate_releasing
from emgrid.models.regularize import Regularization, regularize
from emgrid.models.stats import StatsAccumulator

from .step import PROTOCOL, sum_in_order


@dataclass
class ColumnReport:
    """What the head of one shard's column sends the coordinator after its M-step."""

    shard: int
    loglik: float  # the column's, summed in the tree's order (zero but on the lead column)
    spanning_stats: Stats  # the spanning nodes' statistics (the lead column's; empty elsewhere)
    nonfinite: tuple[str, str] | None = None  # (path, node description) of the first non-finite statistics
    mstep_s: float = 0.0  # the head's estimate of its subtrees
    reduce_s: float = 0.0  # the head's wait for and summing of its column's shares
    reduce_bytes: int = 0  # pickled statistics its column moved to it (the head's own not counted)


def tree_rounds(d: int) -> list[list[tuple[int, int]]]:
    """The column reduce's schedule over ``d`` replicas: per round, its ``(receiver,
    sender)`` pairs. Round ``k`` pairs replica ``r`` (a multiple of ``2 ** (k + 1)``) with
    ``r + 2 ** k``; after ``ceil(log2 d)`` rounds (the planner's ``L(D)``) replica 0, the
    head, holds the column's sum ``((s0 + s1) + (s2 + s3)) + ...``: one order for every
    executor, so their traces agree to the last bit."""
    rounds, step = [], 1
    while step < d:
        rounds.append([(r, r + step) for r in range(0, d - step, 2 * step)])
        step *= 2
    return rounds


def tree_role(replica: int, d: int) -> tuple[list[int], int | None]:
    """One replica's part of :func:`tree_rounds`: the replicas it receives partial sums
    from, in order, and the one it then sends its own to (None for the head, replica 0)."""
    senders, target = [], None
    for pairs in tree_rounds(d):
        for receiver, sender in pairs:
            if receiver == replica:
                senders.append(sender)
            elif sender == replica:
                target = receiver
        if target is not None:
            break
    return senders, target


Partial = tuple[Stats, float]


def column_reduce(replica: int, d: int, stats: Stats, loglik: float, receive: Callable[[int], Partial],
                  send: Callable[[int, Partial], None]) -> Partial | None:
    """This replica's part of its column's tree reduce (:func:`tree_rounds`), over a
    transport's ``receive(replica) -> (stats, loglik)`` and ``send(replica, partial)``:
    returns the column's totals on the head (replica 0), None elsewhere once sent.
    Partial sums are added in place (:class:`models.stats.StatsAccumulator`), so a replica
    holds its running sum and one partial in transit, never the column."""
    senders, target = tree_role(replica, d)
    total = StatsAccumulator()
    total.add(stats)
    for src in senders:
        got, ll = receive(src)
        total.add(got)
        loglik = loglik + ll
        del got
    partial = (total.result(), loglik)
    if target is None:
        return partial
    send(target, partial)
    return None


def tree_sum(column: Sequence[Partial]) -> Partial:
    """A whole column's :func:`column_reduce` in one process (``column[r]`` replica ``r``'s
    statistics and log-likelihood); the sums, and their order, of every transport's."""
    d = len(column)
    sent: dict[int, Partial] = {}  # by sender
    for r in reversed(range(d)):  # every sender of a replica has a higher index
        out = column_reduce(r, d, column[r][0], column[r][1], sent.pop,
                            lambda _target, partial, r=r: sent.__setitem__(r, partial))
        if out is not None:
            return out
    raise AssertionError("replica 0 heads every column")


def report_payload(report: ColumnReport) -> bytes:
    """A column report as it crosses the wire to the coordinator."""
    return pickle.dumps(report, protocol=PROTOCOL)


def join_columns(reports: Sequence[ColumnReport]) -> tuple[Stats, float, tuple[str, str] | None]:
    """The columns' reports (by shard) to the spanning nodes' statistics, the total
    log-likelihood (in shard order) and the first non-finite node (the first path in
    :meth:`models.Stats.first_nonfinite`'s order, as a whole-model check would name it)."""
    spanning: dict = {}
    for r in reports:
        spanning.update(r.spanning_stats)
    bad = [r.nonfinite for r in reports if r.nonfinite is not None]
    first = min(bad) if bad else None
    return Stats(spanning), sum_in_order(r.loglik for r in reports), first


@dataclass
class ShardPart:
    """A worker's part of the model (:meth:`ShardView.model_for`) and, on a column head, the
    M-step of its shard's subtrees."""

    view: ShardView
    shard: int
    part: Node
    regularization: Regularization | None = None
    #: whether this worker's part is its own (unpickled), so its M-step may take the old
    #: subtrees apart as it goes (``models.estimate.estimate_releasing``); False where the
    #: part shares nodes with the caller's model (the local executor, the MPI coordinator):
    #: those are never taken apart, the ones its own M-steps made are
    private: bool = False
    pending: dict[str, Node] | None = field(default=None, repr=False)
    #: ids of nodes that are not this part's to take apart: the caller's, and every node
    #: :meth:`owned` handed out (a callback may keep what it gathered). An id outliving its
    #: node only keeps a later node whole: never wrong, at worst held a little longer.
    lent: set[int] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if not self.private:
            self.lent.update(id(n) for _, n in self.part.nodes())

    def estimate(self, stats: Stats, loglik: float) -> ColumnReport:
        """The head's M-step: ``stats`` are its column's totals (pass the only reference:
        they are let go node by node). A private part's old subtrees are taken apart as the
        new ones are built (``models.estimate.estimate_releasing``: the M-step's one
        recursion, releasing as it goes), so the head holds one node twice at a time, never
        its whole shard; the new subtrees are also kept pending for the column until
        :meth:`apply`. Non-finite statistics are reported, not estimated."""
        t0 = perf_counter()
        spanning = frozenset(self.view.spanning)
        above = Stats({p: v for p, v in stats.items() if p in spanning})
        self.pending = None
        bad = stats.first_nonfinite()
        if bad is not None:
            node = self.part.node_at(bad)
            return ColumnReport(self.shard, loglik, above, (bad, node.describe()), perf_counter() - t0)
        left = {p: v for p, v in stats.items() if p not in spanning}
        del stats
        if self.regularization:
            left = dict(regularize(self.part, Stats(left), self.regularization))
        skeleton = self.view.skeleton(self.part)
        roots = self.view.owned(self.shard, self.part)
        pending = {}
        # a node object may stand at several paths (a component given twice): count them
        uses = Counter(id(n) for root, node in roots.items() for _, n in node.nodes(root))
        for lent in self.lent.intersection(uses):
            uses[lent] = -1  # never emptied
        for root in list(roots):
            pending[root] = estimate_releasing(roots.pop(root), left, root, uses)
        self.part = self.view.assemble(skeleton, pending)
        # only nodes still in the part can be taken apart later: forget the others' ids, so
        # a callback that gathers every iteration does not grow the set
        self.lent.intersection_update(id(n) for _, n in self.part.nodes())
        self.pending = pending
        return ColumnReport(self.shard, loglik, above, None, perf_counter() - t0)

    def pending_payload(self) -> bytes:
        """The head's new subtrees as they go to the other workers of its column."""
        return pickle.dumps(self.pending, protocol=PROTOCOL)

    def apply(self, skeleton: Node, owned: Mapping[str, Node] | None = None) -> None:
        """The next model: the coordinator's new ``skeleton`` with the shard's new subtrees
        (``owned``, from the head; the head's own, already in its part, when None)."""
        owned = self.pending if owned is None else owned
        if owned is None:
            raise RuntimeError(f"shard {self.shard}: no new subtrees to apply (no M-step ran)")
        self.part = self.view.assemble(skeleton, owned)
        self.pending = None

    def owned(self) -> dict[str, Node]:
        """The shard's current subtrees (what it contributes to the fitted model); lent, so
        later M-steps leave them whole."""
        roots = self.view.owned(self.shard, self.part)
        self.lent.update(id(n) for root, node in roots.items() for _, n in node.nodes(root))
        return roots


def skeleton_m_step(skeleton: Node, spanning: Stats, regularization: Regularization | None) -> Node:
    """The coordinator's M-step: the spanning nodes re-estimated, the stubs kept."""
    return skeleton.estimate(regularize(skeleton, spanning, regularization))


def skeleton_payload(skeleton: Node) -> bytes:
    return pickle.dumps(skeleton, protocol=PROTOCOL)


class Shards:
    """A fitted model as it sits on the grid: the coordinator's skeleton and a way to fetch
    each shard's subtrees from its head, one shard at a time."""

    def __init__(self, view: ShardView, skeleton: Node, fetch: Callable[[int], Mapping[str, Node]] | None = None,
                 model: Node | None = None):
        """``fetch(s)`` asks the grid for shard ``s``'s subtrees; or ``model``: the whole
        model, already here."""
        self.view = view
        self.skeleton = skeleton
        self._fetch = fetch
        self._model = model

    def __getstate__(self):
        # a grid's fetch does not travel: a copy elsewhere holds what was gathered, or nothing
        return {**self.__dict__, "_fetch": None}

    @property
    def n_shards(self) -> int:
        return self.view.n_shards

    def shard(self, s: int) -> dict[str, Node]:
        """Shard ``s``'s subtrees by root path (empty for an idle shard)."""
        if not self.view.roots_of(s):
            return {}
        if self._model is not None:
            return self.view.owned(s, self._model)
        if self._fetch is None:
            raise RuntimeError("the model was left on the grid (FitJob.gather=False) and its workers have stopped; "
                               "read it inside the fit's callback")
        return dict(self._fetch(s))

    def __iter__(self) -> Iterator[tuple[int, dict[str, Node]]]:
        for s in range(self.n_shards):
            yield s, self.shard(s)

    def gather(self) -> Node:
        """The whole model in this process."""
        owned: dict[str, Node] = {}
        for _, part in self:
            owned.update(part)
        return self.view.assemble(self.skeleton, owned)

    def warnings(self) -> list[str]:
        """:func:`models.diagnose.fit_warnings` of the whole model, read shard by shard."""
        out = fit_warnings(self.skeleton)
        for _, part in self:
            for path, subtree in part.items():
                out.extend(fit_warnings(subtree, path))
        return out

    @classmethod
    def held(cls, view: ShardView, model: Node) -> "Shards":
        """A whole model already in this process, seen as shards."""
        return cls(view, view.skeleton(model), model=model)


def update_bytes(view: ShardView, d: int, skeleton_bytes: int, pending_bytes: Sequence[int]) -> int:
    """The bytes of one update (:meth:`ShardPart.apply`) on a ``d``-replica grid: the pickled
    skeleton (``skeleton_bytes``) to the ``d`` workers of every shard that evaluates, and
    each such shard's new subtrees (``pending_bytes[s]``, pickled) from its head to the
    column's ``d - 1`` others."""
    return sum(d * skeleton_bytes + (d - 1) * n for s, n in enumerate(pending_bytes) if view.evaluates(s))

"""What a template is: the unset fields of a tree, the checks that name them, and rebuilding
a node with some fields replaced.

:class:`Templated` is a base of ``models.base.Node``; it reads only the node's ``schema``,
``_sizes`` (its :class:`~models.schema.Size` fields), ``_unset`` (the parameters given as
None), ``nodes()`` and ``node_at()``.
"""

from __future__ import annotations

from .errors import ModelError
from .schema import Param, Size


class Templated:
    """The template side of a node (see ``models.schema`` for unset parameters)."""

    def own_unset(self) -> tuple[str, ...]:
        """This node's unset fields: parameters given as None, and sizes the data decide."""
        sizes = tuple(f.name for f in self.schema if isinstance(f, Size) and self._sizes.get(f.name) is None)
        return sizes + self._unset

    def unset_fields(self) -> list[tuple[str, str]]:
        """Every unset ``(path, field)`` of the tree, in pre-order."""
        return [(p, name) for p, node in self.nodes() for name in node.own_unset()]

    @property
    def is_template(self) -> bool:
        """Whether some field of the tree is unset (the fit fills it from the data)."""
        return bool(self.unset_fields())

    def _density_unset(self) -> list[tuple[str, str]]:
        """The unset fields a density needs (a sequence's ``mean_length`` only samples)."""
        out = []
        for p, node in self.nodes():
            free = {f.name for f in node.schema if not (isinstance(f, Param) and not f.free)}
            out.extend((p, name) for name in node.own_unset() if name in free)
        return out

    def require_complete(self, verb: str, *, density: bool = True) -> None:
        """Raises ModelError naming the first unset field when ``verb`` needs it (with
        ``density``, only the fields a density reads)."""
        missing = self._density_unset() if density else self.unset_fields()
        if missing:
            path, name = missing[0]
            node = self.node_at(path)
            more = f" (and {len(missing) - 1} more unset field(s))" if len(missing) > 1 else ""
            raise ModelError(f"cannot {verb} a template: {node.family}.{name} at path {path or '<root>'!r} is "
                             f"unset{more}; fit it from data (executors.optimize) or give the parameter")

    def with_fields(self, **values):
        """A new node of this family: these fields replaced, the others kept (children too)."""
        current = self._fields()
        current.update(values)
        return type(self)(**current)

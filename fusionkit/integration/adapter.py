"""What a backend adapter is (:class:`BackendAdapter`), and the skeleton every one shares.

:class:`BackendAdapter` is the interface: what a backend provides to fusionkit -- its rule
sets, what its runtime cannot execute (an :class:`~fusionkit.find.executable.ExecutionTarget`),
how to run a lowered program to compare with eager (its oracle, optional), which stock
passes or partitioner functions it takes over, and the install trio. It is structural: an
adapter module (``fusionkit.backends.vulkan_adapter``) or any object with these functions is
one (``isinstance(x, BackendAdapter)``). Everything it needs is in ``fusionkit``'s facade
(``from fusionkit import BackendAdapter, PatchSet, run_rules, ExecutionTarget, ...``).
The smallest complete one, a backend that needs no takeover (its rules a transform pass,
its runtime's condition a :class:`~fusionkit.find.executable.Delegate`'s refusal), is
``ToyAdapter`` in ``tests/test_adapter_protocol.py``. Rules run through the one engine,
:func:`fusionkit.run_rules`, wherever the adapter runs them (a pass manager's pass in a
stock pass's place: ``rounds=`` until a fixpoint, its ``sweep_dead_code=``).

The rest of this module is the skeleton of an adapter that patches ExecuTorch:

A backend adapter changes ExecuTorch in two ways, and both are the same for every backend:

* process-wide and explicit: ``install()`` / ``uninstall()`` / ``is_installed()`` put the
  adapter's one :class:`~fusionkit.integration.hooks.PatchSet` (``PATCHES``, the sets of
  its parts included) in place and take it out again; ``with install(): ...`` undoes only
  what that call installed; an untested ExecuTorch is refused;
* scoped to one lowering: the adapter's partitioner marks its delegation spec, and the
  backend's ``preprocess`` runs under ``PATCHES`` for the marked partitions only
  (:class:`~fusionkit.integration.scoped.PreprocessScope`); a stock partitioner in the same
  process is untouched, and once the last marked partition is preprocessed ExecuTorch is
  left as it was.

:class:`Adapter` holds both; :class:`ScopedPartitioner` is the partitioner half, a mixin
put before the stock partitioner class.

How to write an adapter with it
-------------------------------

In the adapter's ``install.py`` (the patch set and the install trio)::

    from fusionkit.integration.adapter import Adapter
    from fusionkit.integration.hooks import Installation, UnsupportedExecuTorchError

    from . import preprocess_rules, serializer  # each part has its own PatchSet

    ADAPTER = Adapter(
        "fusionkit.backends.my_adapter",
        parts=(serializer.PATCHES, preprocess_rules.PATCHES),  # installed with the adapter
        backend=("executorch.backends.my.my_preprocess", "MyBackend"),  # whose preprocess
        marker=b"my",  # the compile-spec value marking this adapter's partitions
    )
    PATCHES = ADAPTER.patches
    install, uninstall, is_installed = ADAPTER.install, ADAPTER.uninstall, ADAPTER.is_installed

``patches=`` adds replacements of the adapter's own (a callable returning
``(owner, name, replacement)`` triples, resolved at install; see
:class:`~fusionkit.integration.hooks.PatchSet`). In ``partitioner.py``::

    from executorch.backends.my.partition import MyPartitioner as _StockMyPartitioner

    from fusionkit.integration.adapter import ScopedPartitioner

    from .install import ADAPTER

    PREPROCESS_SCOPE = ADAPTER.preprocess_scope  # tests reset() it after a failed lowering

    class MyPartitioner(ScopedPartitioner, _StockMyPartitioner):
        '''ExecuTorch's MyPartitioner (same arguments), fusionkit's preprocess scoped to it.'''

        fusionkit_adapter = ADAPTER

That is the whole partitioner when it adds nothing: its constructor takes exactly the stock
one's arguments (and shows its signature), marks the delegation spec, and ``partition``
runs the stock one and then has the marked partitions preprocessed under ``PATCHES``.
To add to it, override the two hooks, not ``partition``:

* ``_partitioning(exported_program)``: a context manager around the stock ``partition``
  (the Vulkan adapter installs ``PATCHES`` there and makes the support check runtime-aware);
* ``_partitioned(result)``: checks or changes of the :class:`PartitionResult`, which may
  raise; it runs before the scope expects the partitions, so a lowering refused there
  leaves no dispatcher behind.

A constructor of its own (extra keyword arguments) calls ``super().__init__(*args,
**kwargs)`` first. ``backends/xnnpack_adapter`` is the smallest example, and
``backends/vulkan_adapter`` one with both hooks.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from fusionkit.integration.hooks import Installation, Patch, PatchSet
from fusionkit.integration.scoped import PreprocessScope

if TYPE_CHECKING:
    import torch
    from executorch.exir.backend.partitioner import PartitionResult
    from torch.export import ExportedProgram

    from fusionkit.find.executable import ExecutionTarget
    from fusionkit.rule import Rule

__all__ = ["Adapter", "BackendAdapter", "Oracle", "PatchSet", "ScopedPartitioner"]

#: runs a lowered program (the ``EdgeProgramManager`` of ``to_edge_transform_and_lower``) on
#: user inputs where the backend runs it (its runtime, a reference model, a simulator) and
#: returns the outputs, flattened: what is compared with eager
Oracle = Callable[[Any, tuple[Any, ...]], "Sequence[torch.Tensor]"]


@runtime_checkable
class BackendAdapter(Protocol):
    """What a backend adapter provides; a module or an object with these functions.

    * :meth:`rule_sets`: its rules, by set name (what ``fusionkit verify`` and ``explain``
      run, what its transform passes and preprocess passes apply);
    * :meth:`execution_target`: its runtime's conditions -- what a replacement may create
      where its rules run (None: ExecuTorch's CPU runtime and the registered delegates);
    * :meth:`oracle`: how to run a program it lowered, to compare with eager (None: no way
      to run one here);
    * :meth:`takeover_points`: what of stock ExecuTorch it replaces while installed (a
      stock pass, pattern or partitioner function -> what replaces it; empty: nothing,
      its rules run as transform passes only);
    * :meth:`install` / :meth:`uninstall` / :meth:`is_installed`: the takeover put in
      place process-wide and taken out again; idempotent, ``with install():`` undoes
      only what that call installed (a :class:`~fusionkit.integration.hooks.PatchSet`'s
      own methods are these three).
    """

    def rule_sets(self) -> Mapping[str, Sequence[Rule]]: ...

    def execution_target(self) -> ExecutionTarget | None: ...

    def oracle(self) -> Oracle | None: ...

    def takeover_points(self) -> Mapping[str, str]: ...

    def install(self) -> Installation: ...

    def uninstall(self) -> None: ...

    def is_installed(self) -> bool: ...


def _no_patches() -> list[Patch]:
    return []


class Adapter:
    """A backend adapter's patch set, its install trio and its preprocess scope.

    ``component`` names the adapter in messages (an untested ExecuTorch, the dispatcher);
    ``parts`` are the patch sets installed with it; ``patches`` its own replacements;
    ``backend`` is ``(module, class)`` of the backend whose ``preprocess`` runs under the
    patch set for partitions marked with ``marker``.
    """

    def __init__(self, component: str, *, parts: tuple[PatchSet, ...] = (),
                 patches: Callable[[], list[Patch]] = _no_patches,
                 backend: tuple[str, str], marker: bytes) -> None:
        #: the adapter's one patch set (``PATCHES``), its parts included
        self.patches = PatchSet(component, patches, includes=parts)
        #: the backend's preprocess under :attr:`patches`, for this adapter's partitions only
        self.preprocess_scope = PreprocessScope(backend[0], backend[1], marker, self.patches)
        # the patch set's own methods (the adapter's install / uninstall / is_installed)
        self.install: Callable[[], Installation] = self.patches.install
        self.uninstall: Callable[[], None] = self.patches.uninstall
        self.is_installed: Callable[[], bool] = self.patches.is_installed

    @property
    def component(self) -> str:
        return self.patches.component

    def mark(self, delegation_spec: Any) -> None:
        """Mark a partitioner's delegation spec as this adapter's (refuses an untested
        ExecuTorch, :class:`~fusionkit.integration.hooks.UnsupportedExecuTorchError`)."""
        self.preprocess_scope.mark(delegation_spec)

    def partitioned(self, result: PartitionResult) -> PartitionResult:
        """The partitions of ``result`` will be preprocessed: scope the patch set to them."""
        self.preprocess_scope.expect(len(result.partition_tags))
        return result

    def reset(self) -> None:
        """Forget pending partitions (a lowering that failed after partitioning)."""
        self.preprocess_scope.reset()

    def __repr__(self) -> str:
        return f"Adapter({self.component!r}, installed={self.is_installed()})"


class ScopedPartitioner:
    """Mixin for an adapter's partitioner, before the stock class in the bases.

    Set ``fusionkit_adapter`` to the :class:`Adapter`. The constructor is the stock one
    (same arguments, same signature shown) followed by :meth:`Adapter.mark`;
    :meth:`partition` is the stock one inside :meth:`_partitioning`, then
    :meth:`_partitioned`, then :meth:`Adapter.partitioned`.
    """

    fusionkit_adapter: ClassVar[Adapter]

    if TYPE_CHECKING:
        delegation_spec: Any

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        stock = next((b for b in cls.__mro__[1:]
                      if not issubclass(b, ScopedPartitioner) and "__init__" in vars(b)), None)
        if stock is None or stock is object:
            return
        if "__init__" not in vars(cls):
            def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
                super(cls, self).__init__(*args, **kwargs)

            cls.__init__ = __init__  # type: ignore[method-assign]
        # the same signature and docs as the stock constructor (inspect.signature follows
        # __wrapped__)
        functools.update_wrapper(vars(cls)["__init__"], stock.__init__)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        type(self).fusionkit_adapter.mark(self.delegation_spec)

    def _partitioning(self, exported_program: ExportedProgram) -> contextlib.AbstractContextManager[Any]:
        """What surrounds the stock ``partition`` (nothing, by default)."""
        return contextlib.nullcontext()

    def _partitioned(self, result: PartitionResult) -> PartitionResult:
        """Checks or changes of the stock ``partition``'s result (none, by default)."""
        return result

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        with self._partitioning(exported_program):
            result: PartitionResult = super().partition(exported_program)  # type: ignore[misc]
        result = self._partitioned(result)
        return type(self).fusionkit_adapter.partitioned(result)

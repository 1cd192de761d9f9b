"""``TensorDictSequential``: tensordict modules run one after the other on one tensordict.

The sequence's ``in_keys`` are the keys some module reads that no earlier module wrote; its ``out_keys`` every
key a module writes (last occurrence order). Plain callables (without ``in_keys`` / ``out_keys``) are wrapped
in ``WrapModule``. When the sequence writes into its input and a module fails, the entries at the sequence's
out keys are put back as they were, so a failed call leaves the input as it found it.
"""
from __future__ import annotations

import collections
from copy import deepcopy
from typing import Any, Callable, Iterable, Iterator, List, Optional, Union

import torch
from torch import nn
from torch.compiler import is_compiling
from torch.nn.modules import module as _module_globals  # the global hooks nn.Module.__call__ runs

from .._keys import NestedKey, unravel_key_list
from ..base import TensorDictBase
from ..tensordict import TensorDict as _TensorDict
from ._dispatch import module_forward
from ._undo import _undo_restore, _undo_snapshot
from .common import TensorDictModule, TensorDictModuleBase, WrapModule
from .utils import _skip_existing

_PLANNED_CALL = TensorDictModule._planned_call
_tracing_state = torch._C._get_tracing_state

__all__ = ["TensorDictSequential"]


def _is_lazy_stack(tensordict: Any) -> bool:
    from ..lazy import LazyStackedTensorDict

    return isinstance(tensordict, LazyStackedTensorDict)


class TensorDictSequential(TensorDictModule):
    """Run tensordict modules in order on one tensordict.

    Args:
        *modules: tensordict modules (or callables from tensordict to tensordict), given one by one, as a list,
            or as a dict / OrderedDict of named modules.

    Keyword Args:
        partial_tolerant: skip a module whose inputs are missing instead of failing; on a lazy stack, run it
            on the members that have its inputs.
        selected_out_keys: the out keys to keep in the result (see ``select_out_keys``).
        inplace: ``None`` (default: the modules write into the input), ``True`` (the result is the input),
            ``False`` (a new TensorDict with the out keys only) or ``"empty"`` (``input.empty()`` with them).

    >>> import torch
    >>> from torchdict import TensorDict
    >>> from torchdict.nn import TensorDictModule, TensorDictSequential
    >>> seq = TensorDictSequential(
    ...     TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["hidden"]),
    ...     TensorDictModule(lambda h: h * 10, in_keys=["hidden"], out_keys=["y"]),
    ... )
    >>> seq.in_keys, seq.out_keys
    (['x'], ['hidden', 'y'])
    >>> seq(TensorDict(x=torch.zeros(2)))["y"]
    tensor([10., 10.])
    """

    module: Any  # an nn.ModuleList or an nn.ModuleDict
    _select_before_return = False

    def __init__(self, *modules: Any, partial_tolerant: bool = False,
                 selected_out_keys: Optional[List[NestedKey]] = None,
                 inplace: Union[bool, str, None] = None) -> None:
        if len(modules) == 1 and isinstance(modules[0], dict):  # dict or OrderedDict of named modules
            names = list(modules[0].keys())
            converted = self._convert_modules(list(modules[0].values()))
            container: nn.Module = nn.ModuleDict(collections.OrderedDict(zip(names, converted)))
        else:
            if len(modules) == 1 and isinstance(modules[0], collections.abc.MutableSequence):
                modules = tuple(modules[0])
            converted = self._convert_modules(modules)
            container = nn.ModuleList(converted)
        in_keys, out_keys = self._compute_in_and_out_keys(converted)
        self._complete_out_keys = list(out_keys)
        super().__init__(module=container, in_keys=in_keys, out_keys=out_keys)
        self.inplace = inplace
        self.partial_tolerant = partial_tolerant
        if selected_out_keys:
            self._select(selected_out_keys)

    # ---------------------------------------------------------------- keys
    @property
    def out_keys(self) -> List[NestedKey]:
        """The keys the sequence writes (after ``select_out_keys``: the selected ones)."""
        return self._out_keys_apparent

    @out_keys.setter
    def out_keys(self, value: Iterable[NestedKey]) -> None:
        self._out_keys = self._out_keys_apparent = unravel_key_list(list(value))
        self._complete_out_keys = list(self._out_keys)

    @staticmethod
    def _convert_modules(modules: Iterable[Any]) -> list:
        return [module if TensorDictModuleBase.is_tdmodule_compatible(module) else WrapModule(module)
                for module in modules]

    def _compute_in_and_out_keys(self, modules: list) -> tuple:
        in_keys: list = []
        out_keys: list = []
        for module in modules:
            # A key an earlier module writes is an intermediate result, not an input of the sequence.
            for key in module.in_keys:
                if key not in out_keys and key not in in_keys:
                    in_keys.append(key)
            out_keys.extend(module.out_keys)
        out_keys = [key for position, key in enumerate(out_keys) if key not in out_keys[position + 1:]]
        return in_keys, out_keys

    def _select(self, selected: Iterable[NestedKey]) -> None:
        keys = unravel_key_list(list(selected))
        if not all(key in self.out_keys for key in keys):
            raise ValueError("All keys in selected_out_keys must be in out_keys.")
        self._select_before_return = True
        self._out_keys_apparent = keys

    def select_out_keys(self, *selected_out_keys: NestedKey) -> "TensorDictSequential":
        """Keep only these out keys in the result (intermediate keys are not written to the input).

        Returns ``self``; a key that is not an out key raises a ``ValueError``.
        """
        self._select(selected_out_keys)
        return self

    def reset_out_keys(self) -> "TensorDictSequential":
        """Undo ``select_out_keys``. Returns ``self``."""
        self.out_keys = list(self._complete_out_keys)
        self._select_before_return = False
        return self

    # ---------------------------------------------------------------- sub-sequences
    def _module_iter(self) -> Iterator[Any]:
        # ModuleList and ModuleDict both keep their children, in order, in ``_modules``: modules with
        # ``in_keys`` / ``out_keys`` (TensorDictModuleBase or compatible, which no nn.Module type says).
        return iter(list(self._wrapped()._modules.values()))

    def select_subsequence(self, in_keys: Optional[Iterable[NestedKey]] = None,
                           out_keys: Optional[Iterable[NestedKey]] = None) -> "TensorDictSequential":
        """A new sequence (sharing the modules) with only the modules needed to go from ``in_keys`` to
        ``out_keys``: modules that need a key not produced from ``in_keys`` are dropped, then the modules
        whose outputs lead to no requested out key. Nested plain ``TensorDictSequential`` are pruned the
        same way. Raises ``ValueError`` when no module is left."""
        available = unravel_key_list(deepcopy(self.in_keys) if in_keys is None else list(in_keys))
        wanted = unravel_key_list(deepcopy(self.out_keys) if out_keys is None else list(out_keys))
        modules = list(self._module_iter())
        keep = set(range(len(modules)))
        for position, module in enumerate(modules):
            if type(module) is TensorDictSequential:  # exact type: a subclass may not prune its own modules
                try:
                    module = modules[position] = module.select_subsequence(in_keys=available)
                except ValueError:
                    keep.discard(position)
                    continue
            if all(key in available for key in module.in_keys):
                available.extend(module.out_keys)
            else:
                keep.discard(position)
        for position in sorted(keep, reverse=True):
            module = modules[position]
            if not any(key in wanted for key in module.out_keys):
                keep.discard(position)
                continue
            if type(module) is TensorDictSequential:
                module = modules[position] = module.select_subsequence(out_keys=wanted)
            wanted.extend(module.in_keys)
        kept = sorted(keep)
        if not kept:
            raise ValueError("No modules left after selection. Make sure that in_keys and out_keys are coherent.")
        if isinstance(self.module, nn.ModuleDict):
            names = list(self.module.keys())
            return self._keep_options(type(self)(collections.OrderedDict((names[i], modules[i]) for i in kept)))
        return self._keep_options(type(self)(*[modules[i] for i in kept]))

    def _keep_options(self, sequence: "TensorDictSequential") -> "TensorDictSequential":
        sequence.partial_tolerant = self.partial_tolerant
        sequence.inplace = self.inplace
        return sequence

    # ---------------------------------------------------------------- the call
    def _run_module(self, module: Any, tensordict: Any, **kwargs: Any) -> Any:
        if not self.partial_tolerant:
            return module(tensordict, **kwargs)
        present = tensordict.keys(include_nested=True)
        if all(key in present for key in module.in_keys):
            return module(tensordict, **kwargs)
        if _is_lazy_stack(tensordict):
            for member in tensordict.tensordicts:
                member_keys = member.keys(include_nested=True)
                if not all(key in member_keys for key in module.in_keys):
                    continue
                out = module(member, **kwargs)
                # A module that returns a new tensordict: its outputs go into the member.
                if isinstance(out, TensorDictBase) and out is not member:
                    out_present = out.keys(include_nested=True)
                    written = [key for key in module.out_keys if key in out_present]
                    if written:
                        member.update(out, keys_to_update=written)
        return tensordict

    def _get_module_num_or_key(self, module: nn.Module) -> Union[int, str]:
        items = self.module.items() if isinstance(self.module, nn.ModuleDict) else enumerate(self.module)
        for name, candidate in items:
            if candidate is module:
                return name
        raise RuntimeError("module not found.")

    @module_forward
    def forward(self, tensordict: Any, tensordict_out: Any = None, **kwargs: Any) -> Any:
        """Run every module on ``tensordict`` (see ``inplace``); ``tensordict_out`` receives the out keys."""
        if kwargs:
            raise RuntimeError(
                f"TensorDictSequential does not support keyword arguments other than 'tensordict_out' or in_keys: "
                f"{self.in_keys}. Got {kwargs.keys()} instead."
            )
        inplace = self.inplace
        on_copy = tensordict_out is not None or self._select_before_return or inplace is False or inplace == "empty"
        running = tensordict.copy() if on_copy else tensordict
        if tensordict_out is None:
            if inplace is True:
                tensordict_out = tensordict
            elif inplace is False:
                from ..tensordict import TensorDict

                tensordict_out = TensorDict()
            elif inplace == "empty":
                tensordict_out = tensordict.empty()
        compiling = is_compiling()
        undo_keys = self._out_keys
        undo = None if on_copy or compiling else _undo_snapshot(tensordict, undo_keys)
        container = self._modules.get("module")
        modules: Iterable[Any] = (self.__dict__["module"] if container is None else container)._modules.values()
        try:
            if self.partial_tolerant or type(self)._run_module is not _BASE_RUN_MODULE:
                # A subclass's own _run_module, or partial tolerance.
                for module in modules:
                    running = self._run_module(module, running)
            elif (compiling or _module_globals._global_forward_hooks or _module_globals._global_forward_pre_hooks
                  or _module_globals._global_backward_hooks or _module_globals._global_backward_pre_hooks
                  or (_skip_existing.get_mode() if _skip_existing._has_thread_values else _skip_existing._value)
                  or _tracing_state()):
                for module in modules:
                    running = module(running)
            else:
                for module in modules:
                    # A TensorDictModule with a call plan (see its ``_make_call_plan``) and no hooks, on a
                    # TensorDict: its planned call, without the nn.Module call, dispatch and skip checks,
                    # which would do nothing here.
                    plan = module.__dict__.get("_call_plan") if type(module) is TensorDictModule else None
                    if (plan is not None and type(running) is _TensorDict and not plan[2] and not plan[3]
                            and not (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                                     or module._backward_pre_hooks)):
                        running = _PLANNED_CALL(module, running, plan[0], plan[1])
                    else:
                        running = module(running)
        except Exception as err:
            if undo is not None:
                _undo_restore(tensordict, undo, undo_keys)
            if hasattr(err, "add_note"):
                err.add_note(f"Failed while executing module '{self._get_module_num_or_key(module)}'.")
            raise
        if tensordict_out is not None:
            return tensordict_out.update(running, keys_to_update=self.out_keys)
        if self._select_before_return:
            # The selected outputs, and the input's own entries a module may have replaced.
            keys = list(self.out_keys)
            keys += [key for key in tensordict.keys(True, True) if key not in keys]
            return tensordict.update(running, keys_to_update=keys)
        return running

    # ---------------------------------------------------------------- container protocol
    def __len__(self) -> int:
        return len(self.module)

    def __getitem__(self, index: Union[int, slice, str]) -> Any:
        if isinstance(index, (int, str)):
            return self.module[index]
        return self._keep_options(type(self)(*self.module[index]))

    def __setitem__(self, index: Union[int, slice, str], tensordict_module: Any) -> None:
        if callable(tensordict_module):
            (tensordict_module,) = self._convert_modules([tensordict_module])
        self._edit_modules(lambda modules: modules.__setitem__(index, tensordict_module))

    def __delitem__(self, index: Union[int, slice, str]) -> None:
        self._edit_modules(lambda modules: modules.__delitem__(index))

    def _modules_after(self, edit: Callable[[Any], None]) -> list:
        """The modules ``edit`` would leave, worked out on a copy of the container (which is left alone)."""
        candidate: Any  # an nn.ModuleList or an nn.ModuleDict, as self.module
        if isinstance(self.module, nn.ModuleDict):
            candidate = nn.ModuleDict(collections.OrderedDict(self.module.items()))
            edit(candidate)
            return list(candidate.values())
        candidate = nn.ModuleList(list(self.module))
        edit(candidate)
        return list(candidate)

    def _edit_modules(self, edit: Callable[[Any], None]) -> None:
        """Apply ``edit`` to a copy of the container first: an edit that fails, or that would drop a
        selected out key, leaves the sequence unchanged. Then to the container, and recompute the keys."""
        modules = self._modules_after(edit)
        if self._select_before_return:
            _, out_keys = self._compute_in_and_out_keys(modules)
            missing = [key for key in self._out_keys_apparent if key not in out_keys]
            if missing:
                raise ValueError(f"The edit would remove the selected out_keys {missing}. Call reset_out_keys() "
                                 "before the edit, or select other keys.")
        edit(self.module)
        in_keys, out_keys = self._compute_in_and_out_keys(list(self._module_iter()))
        selected = self._out_keys_apparent if self._select_before_return else None
        self.in_keys = in_keys
        self.out_keys = out_keys
        if selected is not None:
            self._out_keys_apparent = selected


_BASE_RUN_MODULE = TensorDictSequential._run_module

"""TensorDicts and ``torch.nn`` modules: from_module / from_modules / to_module.

``from_module`` walks a module's ``_parameters`` / ``_buffers`` / ``_modules``
dicts directly (``named_parameters`` builds dotted names and costs ~10x more)
and keeps the module's own Parameter and buffer objects, nested by submodule
name. ``to_module`` walks the TensorDict and the module side by side and
writes straight into those dicts, so

- a swapped-in plain tensor is not wrapped in a new ``nn.Parameter``: it stays
  in the autograd graph (gradients reach the TensorDict's leaves) and works
  under ``torch.vmap`` / ``torch.func.grad``, like ``torch.func.functional_call``;
- nothing global is precomputed and no ``setattr`` hooks run.

Every swap is recorded in a restore list; on an error the swaps already made
are undone before the error propagates (the module is left untouched), and
leaving a ``with`` block around the returned TensorDict replays the list
backwards (also when the block raised).

Example::

    >>> import torch
    >>> from torch import nn
    >>> from torchdict import TensorDict
    >>> module = nn.Linear(3, 4)
    >>> params = TensorDict.from_module(module)
    >>> params["weight"] is module.weight
    True
    >>> with params.apply(torch.zeros_like).to_module(module):
    ...     bool((module(torch.ones(3)) == 0).all())
    True
    >>> module.weight is params["weight"]
    True
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

import torch
from torch import nn
from torch.nn.parameter import UninitializedTensorMixin  # type: ignore[attr-defined]

from ._base import TensorCollection
from ._context import set_exit_action
from ._errors import MessageKeyError
from .nontensor import NonTensorData, NonTensorStack, combine_non_tensor

if TYPE_CHECKING:
    from typing import TypeGuard

    from ._host import TensorDictHost
    from ._params import TensorDictParams
else:
    TensorDictHost = object

__all__ = ["ModuleMixin"]

_Tensor = torch.Tensor
_Parameter = nn.Parameter
_NO_BATCH = torch.Size(())
_NON_TENSOR = (NonTensorData, NonTensorStack)
_MISSING: Any = object()

# (dict of the module, or a _Deregistered slot; attribute name; value to put back)
_RestoreList = List[Tuple[Union[Dict[str, Any], "_Deregistered"], str, Any]]


def _is_params(module: Any) -> TypeGuard[TensorDictParams]:
    # TensorDictParams is imported on first use (torchdict.__getattr__): none exists before its module.
    params = sys.modules.get("torchdict._params")
    return params is not None and isinstance(module, params.TensorDictParams)


def _unwrap(collection: Any) -> Any:
    inner = collection._tensordict
    return collection if type(inner) is dict else inner


# ------------------------------------------------------------------------------------- from_module


def _walk_module(module: nn.Module, new: Callable, filter_empty: bool) -> Any:
    """A TensorDict of the module's own parameters, buffers and (recursively) submodules."""
    if _is_params(module):
        # Its leaves are registered under dotted names; give back its TensorDict's nesting (same leaves).
        tree = module._leaves_tree()
        return None if filter_empty and tree.is_empty() else tree
    state = module.__dict__
    storage = state["_parameters"].copy()  # a C-level copy; None entries are rare
    for param in storage.values():
        if param is None:
            storage = {name: param for name, param in storage.items() if param is not None}
            break
    buffers = state["_buffers"]
    if buffers:
        for name, buffer in buffers.items():
            if buffer is not None:
                storage[name] = buffer
    for name, child in state["_modules"].items():
        if child is not None:
            sub = _walk_module(child, new, filter_empty)
            if sub is not None:
                storage[name] = sub
    if storage or not filter_empty:
        return new(storage, _NO_BATCH)
    return None


def _check_module(module: Any, method: str) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"{method} expects a torch.nn.Module, got {type(module).__name__}.")


def from_module(cls: Any, module: nn.Module, as_module: bool = False, lock: bool = False,
                use_state_dict: bool = False, filter_empty: bool = True) -> Any:
    _check_module(module, "from_module")
    if use_state_dict:
        result = _nest_flat_dict(cls, module.state_dict())
    else:
        result = _walk_module(module, cls._new_unsafe, filter_empty)
        if result is None:
            result = cls._new_unsafe({}, _NO_BATCH)
    if as_module:
        from ._params import TensorDictParams

        return TensorDictParams(result, no_convert=True, lock=lock)
    if lock:
        result._lock_tree()
    return result


def _nest_flat_dict(cls: Any, flat: Any) -> Any:
    """``{"0.weight": w, ...}`` (a state dict) as a nested TensorDict; non-tensors become NonTensorData."""
    root: dict = {}
    for name, value in flat.items():
        *parents, leaf_name = name.split(".")
        level = root
        for parent in parents:
            level = level.setdefault(parent, {})
        level[leaf_name] = value if isinstance(value, _Tensor) else NonTensorData(value)

    def build(level: dict) -> Any:
        return cls._new_unsafe({key: build(value) if type(value) is dict else value
                                for key, value in level.items()}, _NO_BATCH)

    return build(root)


def from_modules(cls: Any, modules: tuple, as_module: bool = False, lock: bool = True,
                 use_state_dict: bool = False, expand_identical: bool = False, lazy_stack: bool = False) -> Any:
    if not modules:
        raise ValueError("from_modules needs at least one module.")
    for module in modules:
        _check_module(module, "from_modules")
    members = [from_module(cls, module, use_state_dict=use_state_dict) for module in modules]
    if lazy_stack:
        # The modules' own parameters, kept in a lazy stack (no copy), as upstream's lazy_stack=True.
        if as_module:
            raise RuntimeError("Using a LazyStackedTensorDict within a TensorDictParams isn't permitted.")
        from .lazy import lazy_stack as stack_lazily

        result = stack_lazily(members, 0)
        if lock:
            result.lock_()
        return result
    with torch.no_grad():
        result = _stack_members(members, (), expand_identical)
    if as_module:
        from ._params import TensorDictParams

        return TensorDictParams(result, no_convert=True, lock=lock)
    if lock:
        result._lock_tree()
    return result


def _stack_members(members: list, path: tuple, expand_identical: bool) -> Any:
    """Stack same-structure, batch-less TensorDicts into batch ``[n]``; Parameters stay Parameters.

    The stack is a new leaf of the autograd graph (built under no_grad, like
    stacked modules in ``torch.func.stack_module_state``): an optimizer can
    train the ensemble through it.
    """
    first = members[0]._tensordict
    for index, member in enumerate(members[1:], 1):
        if member._tensordict.keys() != first.keys():
            theirs = member._tensordict.keys()
            raise MessageKeyError(
                f"from_modules: module {index} does not have the structure of module 0 at "
                f"{_describe_path(path)}: keys only in module 0: {sorted(first.keys() - theirs)}, "
                f"only in module {index}: {sorted(theirs - first.keys())}."
            )
    storage: dict = {}
    count = len(members)
    for key, leaf in first.items():
        leaves = [member._tensordict[key] for member in members]
        if isinstance(leaf, _Tensor):
            if expand_identical and all(other is leaf for other in leaves):
                storage[key] = leaf.expand(count, *leaf.shape)
                continue
            try:
                stacked = torch.stack(leaves)
            except RuntimeError as error:
                shapes = [tuple(other.shape) for other in leaves]
                raise RuntimeError(
                    f"from_modules: cannot stack {_describe_path(path + (key,))}, whose shapes differ "
                    f"between modules: {shapes}."
                ) from error
            if isinstance(leaf, _Parameter):
                stacked = _Parameter(stacked, requires_grad=leaf.requires_grad)
            storage[key] = stacked
        elif isinstance(leaf, TensorCollection):
            storage[key] = _stack_members(leaves, path + (key,), expand_identical)
        else:
            storage[key] = combine_non_tensor(leaves, lambda grids: torch.stack(grids))
    return members[0]._new_unsafe(storage, torch.Size((count,)))


def _describe_path(path: tuple) -> str:
    return repr(".".join(path)) if path else "the top level"


# --------------------------------------------------------------------------------------- to_module


def _module_where(path: tuple, module: nn.Module) -> str:
    name = ".".join(path) if path else "<root>"
    return f"module {name!r} ({type(module).__name__})"


def _missing_attribute(module: nn.Module, path: tuple, key: str, value: Any) -> Exception:
    state = module.__dict__
    where = _module_where(path, module)
    if key in state["_modules"] and not isinstance(value, TensorCollection):
        return TypeError(
            f"{key!r} is a submodule of {where}, but the TensorDict holds a {type(value).__name__} there "
            "(a submodule takes a nested TensorDict)."
        )
    if (key in state["_parameters"] or key in state["_buffers"]) and isinstance(value, TensorCollection):
        return TypeError(
            f"{key!r} is a parameter or buffer of {where}, but the TensorDict holds a nested "
            f"{type(value).__name__} there."
        )
    if isinstance(value, _NON_TENSOR):
        return TypeError(
            f"Entry {key!r} for {where} is non-tensor data ({type(value).__name__}): only tensors and nested "
            "TensorDicts can be written into a module (use use_state_dict=True for extra state)."
        )
    return MessageKeyError(
        f"key {key!r} not found in {where}: it has parameters {sorted(state['_parameters'])}, buffers "
        f"{sorted(state['_buffers'])} and submodules {sorted(state['_modules'])}."
    )


def _shape_error(module: nn.Module, path: tuple, key: str, value: _Tensor, current: _Tensor) -> RuntimeError:
    hint = ""
    if value.dim() > current.dim() and value.shape[-current.dim():] == current.shape:
        hint = (" The extra leading dims look like batch dims: a batched TensorDict of parameters is "
                "swapped in under torch.vmap, which removes them.")
    return RuntimeError(
        f"Shape mismatch for {key!r} of {_module_where(path, module)}: the module holds "
        f"{tuple(current.shape)}, the TensorDict {tuple(value.shape)}. The module was left unchanged.{hint}"
    )


def _shapes_differ(value: _Tensor, current: _Tensor) -> bool:
    try:
        return value.shape != current.shape
    except RuntimeError:
        # Lazy modules: an uninitialized parameter has no shape yet, anything can replace it.
        if isinstance(current, UninitializedTensorMixin) or isinstance(value, UninitializedTensorMixin):
            return False
        raise


def _swap_level(storage: dict, module: nn.Module, restore: _RestoreList, path: tuple, seen: dict,
                new: Callable, preserve: bool = True) -> Any:
    """Swap one level in; returns the old values (a TensorDict) and records each swap in ``restore``.

    ``preserve`` (upstream's ``preserve_module_state``): the leaf goes into the parameter's or buffer's slot
    (the registration is kept; the leaf object itself, not a Parameter wrapping it, so ``module.weight is
    td["weight"]``); without it, a plain leaf replaces a parameter as a plain attribute (deregistered until
    the swap is undone), as upstream's ``preserve_module_state=False``."""
    state = module.__dict__
    params = state["_parameters"]
    buffers = state["_buffers"]
    old_values = {}
    for key, value in storage.items():
        if isinstance(value, _Tensor):
            slot = params
            current = params.get(key, _MISSING)
            if current is _MISSING:
                slot = buffers
                current = buffers.get(key, _MISSING)
                if current is _MISSING:
                    raise _missing_attribute(module, path, key, value)
            if current is not None:
                if current is not value:
                    try:
                        differ = value.shape != current.shape
                    except RuntimeError:
                        differ = _shapes_differ(value, current)
                    if differ:
                        raise _shape_error(module, path, key, value, current)
                old_values[key] = current
            if not preserve and slot is params and isinstance(current, nn.Parameter) and \
                    not isinstance(value, nn.Parameter):
                del params[key]
                state[key] = value
                restore.append((_Deregistered(state, params), key, current))
                continue
            slot[key] = value
            restore.append((slot, key, current))
        elif isinstance(value, TensorCollection):
            child = state["_modules"].get(key)
            if child is None:
                raise _missing_attribute(module, path, key, value)
            done = seen.get(id(child))
            if done is None:
                # A submodule reachable twice (shared) is swapped once: the first entry wins,
                # and both entries of the result hold its original values.
                done = seen[id(child)] = _swap_level(_unwrap(value)._tensordict, child, restore,
                                                     path + (key,), seen, new, preserve)
            old_values[key] = done
        else:
            raise _missing_attribute(module, path, key, value)
    return new(old_values, _NO_BATCH)


class _Deregistered:
    """A restore slot for a parameter replaced by a plain attribute: undoing it registers the parameter again."""

    __slots__ = ("state", "params")

    def __init__(self, state: dict, params: dict) -> None:
        self.state = state
        self.params = params

    def __setitem__(self, key: str, value: Any) -> None:
        self.state.pop(key, None)
        self.params[key] = value


def _undo(restore: _RestoreList) -> None:
    # Backwards, so that a slot written twice ends with its first old value.
    for slot, key, old in reversed(restore):
        slot[key] = old


def _swap_into(td: Any, module: nn.Module, return_swap: bool, swap_dest: Any, preserve: bool = True,
               memo: Optional[dict] = None) -> Any:
    restore: _RestoreList = []
    try:
        swap = _swap_level(td._tensordict, module, restore, (), {} if memo is None else memo, type(td)._new_unsafe,
                           preserve)
        if swap_dest is not None:
            swap_dest.update(swap)
            swap = swap_dest
    except BaseException:
        _undo(restore)
        raise
    if not return_swap:
        return None
    set_exit_action(swap, lambda raised: _undo(restore))
    return swap


def _collect_targets(storage: dict, module: nn.Module, path: tuple, targets: list, sources: list,
                     new: Callable, seen: set) -> Any:
    """For an in-place write: pair each leaf with the module tensor it goes into, checking everything."""
    state = module.__dict__
    params = state["_parameters"]
    buffers = state["_buffers"]
    current_values = {}
    for key, value in storage.items():
        if isinstance(value, _Tensor):
            current = params.get(key, _MISSING)
            if current is _MISSING:
                current = buffers.get(key, _MISSING)
                if current is _MISSING:
                    raise _missing_attribute(module, path, key, value)
            if current is None:
                raise ValueError(
                    f"Cannot copy {key!r} in place into {_module_where(path, module)}: the module holds None "
                    "there. Use inplace=False to set it."
                )
            if _shapes_differ(value, current):
                raise _shape_error(module, path, key, value, current)
            if current is not value:
                targets.append(current)
                sources.append(value)
            current_values[key] = current
        elif isinstance(value, TensorCollection):
            child = state["_modules"].get(key)
            if child is None:
                raise _missing_attribute(module, path, key, value)
            if id(child) in seen:
                continue
            seen.add(id(child))
            current_values[key] = _collect_targets(_unwrap(value)._tensordict, child, path + (key,), targets,
                                                   sources, new, seen)
        else:
            raise _missing_attribute(module, path, key, value)
    return new(current_values, _NO_BATCH)


def _copy_into(td: Any, module: nn.Module, return_swap: bool, swap_dest: Any, non_blocking: bool) -> Any:
    targets: list = []
    sources: list = []
    current = _collect_targets(td._tensordict, module, (), targets, sources, type(td)._new_unsafe, set())
    saved = None
    if return_swap:
        with torch.no_grad():
            saved = current.apply(lambda tensor: tensor.detach().clone())
        originals = [tensor for _, tensor in saved.items(True, True)]
        destinations = [tensor for _, tensor in current.items(True, True)]
        if swap_dest is not None:
            swap_dest.update(saved)  # before copying: if it fails, the module is untouched
            saved = swap_dest

        def put_back(raised: bool) -> None:
            with torch.no_grad():
                torch._foreach_copy_(destinations, originals)

        set_exit_action(saved, put_back)
    if targets:
        with torch.no_grad():
            torch._foreach_copy_(targets, sources, non_blocking=non_blocking)
    return saved


def _flat_state_dict(td: Any, prefix: str, out: dict) -> dict:
    for key, value in td._tensordict.items():
        if isinstance(value, TensorCollection):
            _flat_state_dict(_unwrap(value), prefix + key + ".", out)
        elif isinstance(value, _NON_TENSOR):
            out[prefix + key] = value.data
        else:
            out[prefix + key] = value
    return out


def _load_state_dict(td: Any, module: nn.Module, inplace: bool, return_swap: bool, swap_dest: Any) -> Any:
    """``to_module(use_state_dict=True)``: through ``load_state_dict``, so the module's hooks run."""
    flat = _flat_state_dict(td, "", {})
    current = module.state_dict(keep_vars=True)
    unexpected = [name for name in flat if name not in current]
    if unexpected:
        raise MessageKeyError(
            f"keys {unexpected} not found in the state dict of {type(module).__name__}: it has {sorted(current)}.")
    for name, value in flat.items():
        held = current[name]
        if isinstance(value, _Tensor) and isinstance(held, _Tensor) and _shapes_differ(value, held):
            raise RuntimeError(f"Shape mismatch for {name!r}: the module holds {tuple(held.shape)}, the "
                               f"TensorDict {tuple(value.shape)}. The module was left unchanged.")
    old = {name: current[name] for name in flat}
    if inplace:
        old = {name: value.detach().clone() if isinstance(value, _Tensor) else value
               for name, value in old.items()}
    module.load_state_dict(flat, strict=False, assign=not inplace)
    if not return_swap:
        return None
    swap = _nest_flat_dict(type(td), old)
    if swap_dest is not None:
        swap_dest.update(swap)
        swap = swap_dest
    set_exit_action(swap, lambda raised: module.load_state_dict(old, strict=False, assign=not inplace))
    return swap


def to_module(td: Any, module: nn.Module, *, inplace: Optional[bool] = False, return_swap: bool = True,
              swap_dest: Any = None, use_state_dict: bool = False, non_blocking: bool = False,
              preserve_module_state: bool = True, memo: Optional[dict] = None) -> Any:
    _check_module(module, "to_module")
    if use_state_dict:
        return _load_state_dict(td, module, bool(inplace), return_swap, swap_dest)
    if inplace:
        return _copy_into(td, module, return_swap, swap_dest, non_blocking)
    return _swap_into(td, module, return_swap, swap_dest, preserve_module_state, memo)


# ------------------------------------------------------------------------------------------- mixin


class ModuleMixin(TensorDictHost):
    __slots__ = ()

    @classmethod
    def from_module(cls, module: nn.Module, as_module: bool = False, lock: bool = False,
                    use_state_dict: bool = False, filter_empty: bool = True) -> Any:
        """The parameters and buffers of ``module`` (its own objects), nested by submodule name.

        ``as_module=True`` returns a :class:`TensorDictParams`; ``use_state_dict=True``
        reads ``module.state_dict()`` (so its hooks run; the leaves are then detached);
        ``filter_empty=False`` keeps an empty entry for parameter-less submodules.

        >>> from torch import nn
        >>> from torchdict import TensorDict
        >>> module = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
        >>> params = TensorDict.from_module(module)
        >>> params["0", "weight"] is module[0].weight, list(params.keys())
        (True, ['0'])
        """
        return from_module(cls, module, as_module=as_module, lock=lock, use_state_dict=use_state_dict,
                           filter_empty=filter_empty)

    @classmethod
    def from_modules(cls, *modules: nn.Module, as_module: bool = False, lock: bool = True,
                     use_state_dict: bool = False, lazy_stack: bool = False, expand_identical: bool = False) -> Any:
        """The parameters of several modules of one architecture, stacked into batch ``[len(modules)]``.

        The stacked leaves are new tensors (Parameters where the modules had
        Parameters), for ensembles run with ``torch.vmap`` and ``to_module``.
        ``expand_identical=True`` expands a tensor shared by all modules instead
        of copying it. ``lazy_stack=True`` keeps each module's own parameters in a lazy stack instead.

        >>> from torch import nn
        >>> from torchdict import TensorDict
        >>> params = TensorDict.from_modules(nn.Linear(3, 4), nn.Linear(3, 4))
        >>> params.batch_size, params["weight"].shape
        (torch.Size([2]), torch.Size([2, 4, 3]))
        """
        return from_modules(cls, modules, as_module=as_module, lock=lock, use_state_dict=use_state_dict,
                            expand_identical=expand_identical, lazy_stack=lazy_stack)

    def to_module(self, module: nn.Module, *, inplace: Optional[bool] = False, return_swap: bool = True,
                  swap_dest: Any = None, use_state_dict: bool = False, non_blocking: bool = False,
                  preserve_module_state: bool = True, memo: Optional[dict] = None) -> Any:
        """Write this TensorDict's leaves into ``module``'s parameters and buffers.

        ``inplace=True`` copies into the existing tensors (their identity is
        kept); otherwise the leaves replace them in their parameter / buffer slots
        (``preserve_module_state=True``; a plain tensor is not wrapped in a Parameter, so gradients flow
        back to it and ``module.weight is td["weight"]``); ``preserve_module_state=False`` writes a plain
        leaf over a parameter as a plain attribute (deregistered until the swap is undone), as upstream.
        ``memo`` shares the record of submodules already swapped. Returns the previous
        values as a TensorDict (into ``swap_dest`` if given; None with
        ``return_swap=False``); used as a context manager, the previous values
        come back when the block ends, also when it raises. A missing key
        raises KeyError, a shape mismatch RuntimeError, and the module is then
        left unchanged.

        >>> import torch
        >>> from torch import nn
        >>> from torchdict import TensorDict
        >>> module = nn.Linear(3, 4)
        >>> zeros = TensorDict.from_module(module).apply(lambda t: torch.zeros_like(t))
        >>> with zeros.to_module(module):
        ...     bool((module(torch.ones(3)) == 0).all())
        True
        >>> bool((module.weight != 0).any())
        True
        """
        return to_module(self, module, inplace=inplace, return_swap=return_swap, swap_dest=swap_dest,
                         use_state_dict=use_state_dict, non_blocking=non_blocking,
                         preserve_module_state=preserve_module_state, memo=memo)

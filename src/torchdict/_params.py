"""TensorDictParams: an ``nn.Module`` that holds a TensorDict and registers its tensor leaves.

One storage of truth: the module keeps the TensorDict it was given
(``_param_td``) and the module's ``_parameters`` / ``_buffers`` dicts hold the
*same* tensor objects under dotted names (``"sub.x"`` for ``("sub", "x")``),
so ``named_parameters()``, ``state_dict()``, optimizers and the TensorDict
all see one set of tensors. The two views are kept in step at the only places
where one of them can change without the other:

- TensorDict writes made through this object (``params[key] = v``, ``set``,
  ``update``, ``del``, in-place methods ...) are followed by ``_sync``, which
  registers new leaves (converting them to Parameters) and forgets removed ones;
- module-side replacements (``.to()`` / ``.double()`` / ``.cuda()`` through
  ``_apply``, ``load_state_dict(assign=True)``, attribute assignment,
  unpickling / deepcopy) are followed by ``_pull``, which writes the registered
  objects back into the TensorDict.

Writes into a nested sub-TensorDict obtained from it (``params["sub"]["k"] = v``)
bypass this object and are not registered (as upstream).

>>> import torch
>>> from torchdict import TensorDict
>>> params = TensorDictParams(TensorDict({"w": torch.ones(2), "sub": {"x": torch.zeros(3)}}))
>>> [name for name, _ in params.named_parameters()]
['w', 'sub.x']
>>> params["sub", "x"] is dict(params.named_parameters())["sub.x"]
True
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Callable, Iterator, List, Optional, Tuple

import torch
from torch import nn

from ._base import TensorCollection
from .base import TensorDictBase

__all__ = ["TensorDictParams"]

_Tensor = torch.Tensor
_Parameter = nn.Parameter
_KEEP: Any = object()  # an apply() keyword not given (None is a value for some of them)

# Plain tensors of these dtypes become Parameters (upstream's set: bfloat16, complex and
# float8 leaves stay buffers there too).
_CONVERTIBLE = (torch.float16, torch.float32, torch.float64)

# TensorDict methods that can add, replace or remove leaves of the held TensorDict: after
# one of them (or any method ending in "_") the registrations are brought back in step.
_MUTATORS = frozenset({
    "set", "setdefault", "set_non_tensor", "update", "pop", "popitem", "clear", "del_", "select",
    "exclude", "split_keys", "separates", "flatten_keys", "unflatten_keys", "apply", "named_apply",
    "flatten", "unflatten", "pin_memory",
})

# TensorDict properties with a setter: assigning them on the module sets them on the TensorDict.
_TD_SETTABLE = frozenset({"batch_size", "names"})

# (storage dict holding the leaf, key in it, dotted name, leaf)
_Slot = Tuple[dict, str, str, _Tensor]


def _unwrap(collection: Any) -> Any:
    """The TensorDict behind a collection (a tensorclass keeps one in ``_tensordict``)."""
    inner = collection._tensordict
    return collection if type(inner) is dict else inner


def _tensor_slots(td: Any, prefix: str = "", out: Optional[List[_Slot]] = None) -> List[_Slot]:
    """Every tensor leaf of ``td`` with the dict it sits in and its dotted name, in key order."""
    out = [] if out is None else out
    storage = _unwrap(td)._tensordict
    for key, value in storage.items():
        if not key or "." in key:
            # Names are joined with "." for the module: ("a", "b") and "a.b" would collide.
            raise ValueError(
                f"TensorDictParams: key {prefix + key!r} cannot name a parameter (empty, or contains '.').")
        if isinstance(value, _Tensor):
            out.append((storage, key, prefix + key, value))
        elif isinstance(value, TensorCollection):
            _tensor_slots(value, prefix + key + ".", out)
    return out


def _convert(leaf: _Tensor, no_convert: bool) -> Tuple[_Tensor, bool]:
    """The object to register for a new leaf, and whether it is a parameter."""
    if isinstance(leaf, _Parameter):
        return leaf, True
    if no_convert or getattr(leaf, "_is_buffer", False) or leaf.dtype not in _CONVERTIBLE:
        return leaf, False
    # Like upstream (and nn.Parameter's default): the new parameter requires grad, sharing storage.
    return _Parameter(leaf), True


def _check_key(key: Any) -> None:
    """Reject a key that could not be registered *before* the TensorDict is written."""
    keys = (key,) if isinstance(key, str) else key
    if isinstance(keys, tuple) and all(isinstance(part, str) for part in keys):
        for part in keys:
            if not part or "." in part:
                raise ValueError(f"TensorDictParams: key {key!r} cannot name a parameter (empty, or contains '.').")


def _refresh_devices(td: Any) -> Optional[torch.device]:
    """After a module-side move: a TensorDict with a device takes its leaves' common device (or None)."""
    inner = _unwrap(td)
    devices: set = set()
    for value in inner._tensordict.values():
        if isinstance(value, _Tensor):
            devices.add(value.device)
        elif isinstance(value, TensorCollection):
            devices.add(_refresh_devices(value))
    if inner._device is not None and devices:
        inner._device = devices.pop() if len(devices) == 1 else None
    return inner._device


class TensorDictParams(nn.Module, TensorDictBase):
    """An ``nn.Module`` whose parameters and buffers are the tensor leaves of a TensorDict.

    ``parameters`` is a TensorDict (a dict or None is turned into one; another
    TensorDictParams contributes its TensorDict's structure, same leaves). It
    is kept, not copied: its leaves are registered under dotted names
    (``("sub", "x")`` -> ``"sub.x"``). ``Parameter`` leaves are registered as
    they are. With ``no_convert=False`` a float16/32/64 plain tensor is
    replaced in the TensorDict by ``nn.Parameter(tensor)`` (same storage,
    ``requires_grad=True``); other tensors (integer, bool, bfloat16, complex,
    ``nn.Buffer``-marked, or every plain tensor when ``no_convert=True``) are
    registered as buffers. Non-tensor leaves stay in the TensorDict only.
    ``lock=True`` locks the TensorDict.

    Module methods keep their module meaning and work in place (``to``,
    ``cuda``, ``cpu``, ``double``, ``float``, ``half``, ``type``,
    ``state_dict``, ``load_state_dict``, ``parameters``, ``zero_grad``,
    ``requires_grad_``, ``train``/``eval``); the TensorDict follows every move.
    ``apply`` is the TensorDict's (it returns a TensorDict). Indexing, ``in``,
    ``len``, iteration and every other public TensorDict attribute act on the
    held TensorDict; a method that returns that TensorDict returns this module
    instead. Top-level leaves are also attributes (``params.w``).

    >>> import torch
    >>> from torchdict import TensorDict
    >>> params = TensorDictParams(TensorDict({"w": torch.zeros(2), "step": torch.zeros((), dtype=torch.long)}))
    >>> type(params["w"]).__name__, [name for name, _ in params.named_buffers()]
    ('Parameter', ['step'])
    >>> params.double()["w"].dtype
    torch.float64
    >>> params["b"] = torch.ones(3)
    >>> sorted(params.state_dict())
    ['b', 'step', 'w']
    """

    # A module stays hashable (nn.Module keeps modules in sets); ``==`` still compares the entries.
    __hash__ = nn.Module.__hash__  # type: ignore[assignment]  # TensorDictBase's None, replaced

    def __init__(self, parameters: Any = None, *, no_convert: bool = False, lock: bool = False) -> None:
        td = _as_tensordict(parameters)
        slots = _tensor_slots(td)  # validates every key before anything changes
        super().__init__()
        self.no_convert = no_convert
        self._param_td = td
        self._register(slots, {}, {})
        if lock:
            td.lock_()

    # ---------------------------------------------------------------- keeping the two views in step

    def _register(self, slots: List[_Slot], old_params: dict, old_buffers: dict) -> None:
        params: dict = {}
        buffers: dict = {}
        for storage, key, name, leaf in slots:
            if old_params.get(name) is leaf:
                params[name] = leaf
            elif old_buffers.get(name) is leaf:
                buffers[name] = leaf
            else:
                value, is_param = _convert(leaf, self.no_convert)
                if value is not leaf:
                    storage[key] = value  # the storage dict directly: a locked TensorDict converts too
                (params if is_param else buffers)[name] = value
        # The same dict objects, refilled: nn.Module code may hold references to them.
        self._parameters.clear()
        self._parameters.update(params)
        self._buffers.clear()
        self._buffers.update(buffers)

    def _sync(self) -> None:
        """TensorDict -> registrations: keep registered objects, register new leaves, drop removed ones."""
        self._register(_tensor_slots(self._param_td), dict(self._parameters), dict(self._buffers))

    def _pull(self) -> None:
        """Registrations -> TensorDict: after nn.Module code replaced registered objects."""
        registered = self.__dict__["_parameters"], self.__dict__["_buffers"]
        for storage, key, name, leaf in _tensor_slots(self._param_td):
            for slot in registered:
                current = slot.get(name)
                if current is not None and current is not leaf:
                    storage[key] = current
        _refresh_devices(self._param_td)

    def cpu(self, **kwargs: Any) -> "TensorDictParams":
        """``nn.Module.cpu`` (in place, as ``to``); ``non_blocking=`` and TensorDict.cpu's other keywords go to
        ``to``."""
        return super().cpu() if not kwargs else self.to("cpu", **kwargs)

    def cuda(self, device: Any = None, **kwargs: Any) -> "TensorDictParams":
        """``nn.Module.cuda`` (in place, as ``to``); keywords as :meth:`cpu`'s."""
        if not kwargs:
            return super().cuda(device)
        return self.to(torch.device("cuda", device) if isinstance(device, int) else device or "cuda", **kwargs)

    def _apply(self, fn: Callable, recurse: bool = True) -> "TensorDictParams":
        # .to() / .cuda() / .double() / share_memory(): nn.Module may replace buffers (and, with
        # torch.__future__ flags, parameters) by new objects.
        super()._apply(fn, recurse)
        self._pull()
        return self

    def __setstate__(self, state: dict) -> None:
        # Unpickling / deepcopy rebuild both views separately: make them one again.
        super().__setstate__(state)
        self._pull()

    def _load_from_state_dict(self, state_dict: Any, prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
        start = len(unexpected_keys)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        # nn.Module judges "unexpected" by the first dotted part ("sub" of "sub.x"), which is no
        # registered name here: keep only the keys that name nothing of ours.
        ours = {prefix + name for name in (*self._parameters, *self._buffers)}
        unexpected_keys[start:] = [key for key in unexpected_keys[start:] if key not in ours]

    def __setattr__(self, name: str, value: Any) -> None:
        params = self.__dict__.get("_parameters")
        if params is None:  # before nn.Module.__init__
            return super().__setattr__(name, value)
        buffers = self.__dict__["_buffers"]
        if "." in name and (name in params or name in buffers):
            # load_state_dict(assign=True) sets nested entries by dotted name, which nn.Module refuses.
            if name in params:
                if not isinstance(value, _Parameter):
                    raise TypeError(f"cannot assign {type(value).__name__!r} as parameter {name!r} "
                                    "(torch.nn.Parameter expected)")
                params[name] = value
            else:
                if not isinstance(value, _Tensor):
                    raise TypeError(f"cannot assign {type(value).__name__!r} as buffer {name!r} "
                                    "(torch.Tensor expected)")
                buffers[name] = value
            self._pull()
        elif name in _TD_SETTABLE:
            setattr(self._param_td, name, value)
        else:
            super().__setattr__(name, value)
            if name in params or name in buffers:
                self._pull()

    # ------------------------------------------------------------------------- TensorDict side

    @property
    def _tensordict(self) -> Any:
        # TensorCollection protocol: torchdict code reaches the held TensorDict through this.
        return self._param_td

    def _rewrap(self, td: Any) -> Any:
        # Results derived from the parameters are plain TensorDicts (no new Parameters are made).
        return td

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # registered parameters, buffers, submodules
        except AttributeError:
            if name.startswith("_"):
                raise
        return self._held_attribute(name)

    def _held_attribute(self, name: str) -> Any:
        """The held TensorDict's attribute ``name``; a method is wrapped to re-register the leaves after a
        change and to return this module where the TensorDict returns itself."""
        td = self.__dict__.get("_param_td")
        if td is None:
            raise AttributeError(f"'TensorDictParams' object has no attribute {name!r}")
        attribute = getattr(td, name)
        if not callable(attribute) or isinstance(attribute, TensorCollection):
            return attribute
        mutates = name.endswith("_") or name in _MUTATORS

        def delegated(*args: Any, **kwargs: Any) -> Any:
            result = attribute(*args, **kwargs)
            if mutates:
                self._sync()
            return self if result is td else result

        delegated.__name__ = name
        delegated.__doc__ = getattr(attribute, "__doc__", None)
        return delegated

    def apply(self, fn: Callable, *others: Any, batch_size: Any = None, device: Any = _KEEP, names: Any = _KEEP,
              inplace: bool = False, default: Any = _KEEP, filter_empty: Optional[bool] = None,
              propagate_lock: bool = False, call_on_nested: bool = False, is_leaf: Optional[Callable] = None,
              out: Any = None, **constructor_kwargs: Any) -> Any:
        """``TensorDict.apply`` on the held TensorDict (not ``nn.Module.apply``, as upstream), with its keywords.

        Returns a TensorDict; with ``inplace=True`` the results are written into
        the held TensorDict (and registered) and this module is returned.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> params = TensorDictParams(TensorDict({"w": torch.ones(2)}))
        >>> zeros = params.apply(torch.zeros_like)
        >>> type(zeros).__name__, zeros["w"].tolist()
        ('TensorDict', [0.0, 0.0])
        """
        options = {name: value for name, value in (("device", device), ("names", names), ("default", default))
                   if value is not _KEEP}
        result = self._param_td.apply(fn, *others, batch_size=batch_size, inplace=inplace, filter_empty=filter_empty,
                                      propagate_lock=propagate_lock, call_on_nested=call_on_nested, is_leaf=is_leaf,
                                      out=out, **options, **constructor_kwargs)
        if inplace:
            self._sync()
        return self if result is self._param_td else result

    # ---------------------------------------------------------------- module casts with cast_filter
    def _cast_chosen(self, cast: Callable[[_Tensor], _Tensor], cast_filter: Optional[Callable],
                     module_cast: Callable[[], Any]) -> "TensorDictParams":
        """``module_cast()`` (nn.Module's in-place cast), or with ``cast_filter`` the same in-place cast of
        the leaves ``cast_filter(key, leaf)`` chooses (every chosen leaf, as upstream's filtered casts)."""
        if cast_filter is None:
            return module_cast()
        from ._cast_filter import keyed_tensor_leaves

        pairs = list(keyed_tensor_leaves(self._param_td))
        chosen = {id(leaf) for key, leaf in pairs if cast_filter(key, leaf)}  # every call before any cast
        return self._apply(lambda tensor: cast(tensor) if id(tensor) in chosen else tensor)

    def float(self, *, cast_filter: Optional[Callable] = None) -> "TensorDictParams":
        return self._cast_chosen(lambda t: t.float(), cast_filter, super().float)

    def double(self, *, cast_filter: Optional[Callable] = None) -> "TensorDictParams":
        return self._cast_chosen(lambda t: t.double(), cast_filter, super().double)

    def half(self, *, cast_filter: Optional[Callable] = None) -> "TensorDictParams":
        return self._cast_chosen(lambda t: t.half(), cast_filter, super().half)

    def bfloat16(self, *, cast_filter: Optional[Callable] = None) -> "TensorDictParams":
        return self._cast_chosen(lambda t: t.bfloat16(), cast_filter, super().bfloat16)

    def type(self, dst_type: Any, *, cast_filter: Optional[Callable] = None) -> "TensorDictParams":
        return self._cast_chosen(lambda t: t.type(dst_type), cast_filter, lambda: super(TensorDictParams, self)
                                 .type(dst_type))

    # ---------------------------------------------------------------- state dicts
    def state_dict(self, destination: Any = None, prefix: str = "", keep_vars: bool = False,
                   flatten: bool = True) -> Any:
        """``nn.Module.state_dict`` (dotted names); ``flatten=False``: the held TensorDict's nested one."""
        if flatten:
            return super().state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)
        return self._param_td.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars,
                                         flatten=False)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False,
                        from_flatten: Optional[bool] = None) -> Any:
        """``nn.Module.load_state_dict``; a nested state dict (``state_dict(flatten=False)``) loads too,
        whatever ``from_flatten`` says (as upstream, which reads both forms)."""
        flat: Any = _dotted(state_dict)  # an OrderedDict taking nn.Module's ``_metadata`` attribute
        metadata = getattr(state_dict, "_metadata", None)
        if metadata is not None:
            flat._metadata = metadata
        return super().load_state_dict(flat, strict=strict, assign=assign)

    def _leaves_tree(self) -> Any:
        """A new TensorDict structure around the same leaves (for ``TensorDict.from_module``)."""
        return self._param_td.apply(lambda leaf: leaf, filter_empty=False)

    def __getitem__(self, key: Any) -> Any:
        return self._param_td[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        _check_key(key)
        self._param_td[key] = value
        self._sync()

    def __delitem__(self, key: Any) -> None:
        del self._param_td[key]
        self._sync()

    def __contains__(self, key: Any) -> bool:
        return key in self._param_td

    def __len__(self) -> int:
        return len(self._param_td)

    def __bool__(self) -> bool:
        # A module is truthy (``if self.params:``); without this, bool() would fall back to __len__.
        return True

    def __iter__(self) -> Iterator[Any]:
        return iter(self._param_td)

    def set(self, key: Any, item: Any, inplace: bool = False, *, non_blocking: bool = False,
            **kwargs: Any) -> "TensorDictParams":
        """``TensorDict.set``, registering the new leaf; returns this module."""
        _check_key(key)
        self._param_td.set(key, item, inplace, non_blocking=non_blocking, **kwargs)
        self._sync()
        return self

    def clone(self, recurse: bool = True, **kwargs: Any) -> "TensorDictParams":
        """A new TensorDictParams with copies of the leaves: Parameters stay Parameters (new graph
        leaves, same ``requires_grad``), buffers stay buffers; gradients are not copied.
        ``recurse=False`` shares the leaves (a new TensorDict structure around the same tensors).

        >>> import torch
        >>> from torchdict import TensorDict
        >>> params = TensorDictParams(TensorDict({"w": torch.ones(2)}))
        >>> copy = params.clone()
        >>> type(copy["w"]).__name__, copy["w"] is params["w"], torch.equal(copy["w"], params["w"])
        ('Parameter', False, True)
        """
        if kwargs:  # TensorDict.clone's keywords name nothing here (upstream's TypeError)
            raise TypeError(f"TensorDictParams.clone() got an unexpected keyword argument {next(iter(kwargs))!r}")

        def copy_leaf(leaf: _Tensor) -> _Tensor:
            if not recurse:
                return leaf
            with torch.no_grad():
                new = leaf.detach().clone()
            return _Parameter(new, requires_grad=leaf.requires_grad) if isinstance(leaf, _Parameter) else new

        td = self._param_td.apply(copy_leaf, filter_empty=False)
        new = TensorDictParams(td, no_convert=True, lock=self._param_td.is_locked)
        new.no_convert = self.no_convert  # later writes follow this module's rule
        return new

    def __repr__(self) -> str:
        return f"TensorDictParams(params={self._param_td!r})"


class _HeldMember:
    """A TensorDictBase member of TensorDictParams, read from the held TensorDict (as ``__getattr__`` does
    for the names that nothing else defines): the generic versions would miss the re-registration."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, params: Any, owner: type) -> Any:
        if params is None:  # the member that runs: the held TensorDict's (its signature, for inspect)
            from .tensordict import TensorDict

            return getattr(TensorDict, self.name, None) or getattr(TensorDictBase, self.name)
        return params._held_attribute(self.name)


def _delegate_base_members() -> None:
    for name, _ in vars(TensorDictBase).items():
        if name.startswith("__") or name in vars(TensorDictParams) or hasattr(nn.Module, name):
            continue
        setattr(TensorDictParams, name, _HeldMember(name))


_delegate_base_members()


def _dotted(state_dict: Any, prefix: str = "") -> "OrderedDict[str, Any]":
    """A state dict with its nested mappings flattened into dotted names (``{"n": {"x": t}}`` -> ``n.x``)."""
    flat: "OrderedDict[str, Any]" = OrderedDict()
    for key, value in state_dict.items():
        if isinstance(value, Mapping) and not isinstance(value, TensorCollection):
            flat.update(_dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _as_tensordict(parameters: Any) -> Any:
    from .tensordict import TensorDict  # tensordict.py imports nn.py, which imports this module

    if isinstance(parameters, TensorDictParams):
        # A new structure around the same leaves: two modules must not share one TensorDict.
        return parameters._leaves_tree()
    if parameters is None:
        return TensorDict()
    if isinstance(parameters, dict):
        return TensorDict(parameters)
    if isinstance(parameters, TensorCollection) and isinstance(_unwrap(parameters), TensorDict):
        return _unwrap(parameters)
    raise TypeError(f"TensorDictParams expects a TensorDict, got {type(parameters).__name__}.")

"""``CudaGraphModule``: run a module (or a function of tensors) through a captured CUDA graph.

The first ``warmup`` calls run eagerly (on a side stream), the next one captures a CUDA graph over copies of
its inputs, and every later call copies its inputs into the captured ones and replays the graph: fixed shapes,
fixed non-tensor arguments, no autograd. Without CUDA the object is a pass-through (the inputs are cloned
and checked as during warmup, then the module runs eagerly), as upstream behaves on such machines.
"""
from __future__ import annotations

import contextlib
import functools
import warnings
import weakref
from textwrap import indent
from typing import Any, Callable, List, Optional

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten

from .._base import is_tensor_collection
from .._keys import NestedKey, unravel_key
from ._dispatch import dispatch

__all__ = ["CudaGraphModule"]


def _is_collection_leaf(value: Any) -> bool:
    # Tensor collections stay whole in the trees built here: they are copied and cloned as collections.
    return is_tensor_collection(value)


def _flatten(tree: Any) -> tuple:
    return tree_flatten(tree, is_leaf=_is_collection_leaf)


def _leaves(tree: Any) -> list:
    return tree_leaves(tree, is_leaf=_is_collection_leaf)


def _map(fn: Callable, tree: Any) -> Any:
    return tree_map(fn, tree, is_leaf=_is_collection_leaf)


def _normalised(keys: Any) -> Optional[list]:
    if isinstance(keys, str):
        keys = [keys]
    if not isinstance(keys, (list, tuple, set)) or not keys:
        return None
    try:
        return [unravel_key(key) for key in keys]
    except (KeyError, TypeError, ValueError, RuntimeError):
        return None


class CudaGraphModule:
    """Replay ``module`` as a CUDA graph after ``warmup`` eager calls.

    Args:
        module: a tensordict module (or any callable of a tensordict, with ``in_keys`` given), or a function of
            tensors.
        warmup: eager calls before the capture (an int >= 1).
        in_keys / out_keys: the keys of a callable without them (a module's own keys win; a different value
            given here is ignored with a warning).
        device: the CUDA device of the streams.

    The inputs of a replay must have the captured shapes (``ValueError`` otherwise); tensors that require grad
    are refused (``RuntimeError``); the outputs are clones of the graph's output buffers.
    """

    _REQUIRES_GRAD_ERROR = (
        "CudaGraphModule cannot be part of a graph (or leaves variables). If you need tensors to require "
        "gradients, please pass them as constant inputs to the module instead (e.g. `def func(a, b, c=c): ...` "
        "where c is the tensor requiring gradients)."
    )

    def __init__(self, module: Callable, warmup: int = 2, in_keys: Optional[List[NestedKey]] = None,
                 out_keys: Optional[List[NestedKey]] = None, device: Optional[torch.device] = None) -> None:
        self._has_cuda = torch.cuda.is_available()
        if not self._has_cuda:
            warnings.warn("This module is instantiated on a machine without CUDA device available. We permit this "
                          "usage, but calls to this instance will just pass through it and execute the provided "
                          "function without additional performance gain.")
        if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 1:
            raise ValueError("warmup must be an integer greater than 0.")
        self.module: Any = module
        self.counter = 0
        self._warmup = warmup
        self.device = device
        self._warmup_stream: Any = None
        self._warmup_stream_cm: Any = contextlib.nullcontext
        self._flat_tree: tuple = ()
        self._out_struct: Any = None
        self._return_unchanged = False
        self.in_keys: Any
        self.out_keys: Any
        if self._has_cuda:
            self._warmup_stream = torch.cuda.Stream(device)
            self._capture_stream = torch.cuda.Stream(device)
            self._warmup_stream_cm = functools.partial(torch.cuda.stream, self._warmup_stream)
        for name, keys in (("in_keys", in_keys), ("out_keys", out_keys)):
            if hasattr(module, name):
                given, own = _normalised(keys), _normalised(getattr(module, name))
                if given is not None and own is not None and given != own:
                    warnings.warn(f"CudaGraphModule ignores {name}={keys} because the module has its own "
                                  f"{name}={getattr(module, name)}, which it uses instead. Leave {name} unset, or "
                                  "pass an empty list, to silence this warning.", UserWarning, stacklevel=3)
        self.in_keys = module.in_keys if hasattr(module, "in_keys") else in_keys
        if hasattr(module, "out_keys"):
            self.out_keys = module.out_keys
        else:
            self.out_keys = [] if out_keys is None and self.in_keys is not None else out_keys
        self._is_tensordict_module = self.in_keys is not None
        self._out_matches_in: Optional[bool] = None
        self._graph_args: list = []
        self._prob_modules: list = []
        # The call closes over a weak proxy: the object stays collectable although it holds its call.
        owner = weakref.proxy(self)
        if self._is_tensordict_module:
            @dispatch(source=self.in_keys, dest=self.out_keys, auto_batch_size=False)
            def call(tensordict: Any, *args: Any, tensordict_out: Any = None, **kwargs: Any) -> Any:
                return owner._call_tensordict(tensordict, args, kwargs, tensordict_out)
        else:
            def call(*args: Any, **kwargs: Any) -> Any:
                return owner._call_tensors(args, kwargs)
        self._call_func = functools.wraps(module)(call) if callable(module) else call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call_func(*args, **kwargs)

    # ---------------------------------------------------------------- checks and copies
    @classmethod
    def _clone(cls, value: Any) -> Any:
        if isinstance(value, Tensor) or is_tensor_collection(value):
            if value.requires_grad:
                raise RuntimeError(cls._REQUIRES_GRAD_ERROR)
            return value.clone()
        return value

    @classmethod
    def _check_device_and_grad(cls, value: Any) -> None:
        if isinstance(value, Tensor):
            if value.device.type != "cuda":
                raise ValueError(f"All tensors must be stored on CUDA. Got {value.device.type}.")
            if value.requires_grad:
                raise RuntimeError(cls._REQUIRES_GRAD_ERROR)

    @classmethod
    def _replace_leaves_with_clones(cls, tensordict: Any) -> None:
        """Every tensor leaf replaced by a clone (contiguous, own storage), refusing leaves that need grad."""
        for key, value in list(tensordict.items(True, True)):
            if isinstance(value, Tensor):
                tensordict.set(key, cls._clone(value))

    @classmethod
    def _check_tree_for_capture(cls, value: Any) -> Any:
        if isinstance(value, Tensor) or is_tensor_collection(value):
            if value.requires_grad:
                raise RuntimeError(cls._REQUIRES_GRAD_ERROR)
            if isinstance(value, Tensor):
                cls._check_device_and_grad(value)
            else:
                for leaf in value.values(True, True):
                    cls._check_device_and_grad(leaf)
            return value.clone()
        return value

    @staticmethod
    def _copy_onto(source: Any, destination: Any, sources: list, destinations: list) -> None:
        if isinstance(source, Tensor):
            if source.shape != destination.shape:
                raise ValueError(f"CudaGraphModule was captured with an input of shape {destination.shape} but got "
                                 f"shape {source.shape}. CUDA graphs replay fixed shapes.")
            sources.append(source)
            destinations.append(destination)
            return
        if is_tensor_collection(source):
            if source.batch_size != destination.batch_size:
                raise ValueError(f"CudaGraphModule was captured with batch_size={destination.batch_size} but got "
                                 f"batch_size={source.batch_size}. CUDA graphs replay fixed shapes.")
            destination.update_(source)
            return
        try:
            different = bool(source != destination)
        except Exception as err:
            raise RuntimeError("Couldn't assess input value. Make sure your function only takes tensor inputs or "
                               "that the input value can be easily checked and is constant.") from err
        if different:
            raise ValueError("Varying inputs must be torch.Tensor subclasses.")

    # ---------------------------------------------------------------- probabilistic modules
    def _record_interaction_types(self) -> None:
        modules = self.module.modules() if isinstance(self.module, nn.Module) else ()
        self._prob_modules = [module for module in modules if hasattr(module, "default_interaction_type")]
        self._graph_interaction_types = self._interaction_types()

    def _interaction_types(self) -> list:
        try:
            from .probabilistic import interaction_type  # written with the probabilistic modules
        except ImportError:
            return [module.default_interaction_type for module in self._prob_modules]
        current = interaction_type()
        return [module.default_interaction_type if current is None else current for module in self._prob_modules]

    def _warn_if_interaction_type_changed(self) -> None:
        types = self._interaction_types()
        if types != self._graph_interaction_types:
            self._prob_modules = []  # once
            warnings.warn(f"{type(self).__name__} was captured with the interaction types "
                          f"{[str(t) for t in self._graph_interaction_types]} but is called with "
                          f"{[str(t) for t in types]}. The replay ignores the interaction type and repeats the "
                          f"captured branch. Capture one {type(self).__name__} per interaction type.",
                          UserWarning, stacklevel=4)

    # ---------------------------------------------------------------- tensordict calls
    def _call_tensordict(self, tensordict: Any, args: tuple, kwargs: dict, tensordict_out: Any) -> Any:
        if self.counter >= self._warmup:
            return self._replay_tensordict(tensordict, args, kwargs, tensordict_out)
        if not self._has_cuda or self.counter < self._warmup - 1:
            if self._has_cuda:
                self._warmup_stream.wait_stream(torch.cuda.current_stream())
            with self._warmup_stream_cm():
                self._replace_leaves_with_clones(tensordict)
                if tensordict_out is not None:
                    kwargs["tensordict_out"] = tensordict_out
                out = self.module(tensordict, *args, **kwargs)
                if self._out_matches_in is None:
                    self._out_matches_in = out is tensordict
            if self._has_cuda:
                torch.cuda.current_stream().wait_stream(self._warmup_stream)
            self.counter += self._has_cuda
            return out
        return self._capture_tensordict(tensordict, args, kwargs, tensordict_out)

    def _capture_tensordict(self, tensordict: Any, args: tuple, kwargs: dict, tensordict_out: Any) -> Any:
        if tensordict.device is None:
            for leaf in tensordict.values(True, True):
                self._check_device_and_grad(leaf)
        elif tensordict.device.type != "cuda":
            raise ValueError("The input tensordict device must be of the 'cuda' type.")
        for leaf in _leaves((args, kwargs)):
            if isinstance(leaf, Tensor):
                raise ValueError("All tensors must be passed in the tensordict, not as arg or kwarg.")
        self._graph_args = _leaves((args, kwargs))
        self._record_interaction_types()
        torch.cuda.synchronize(self.device)
        kwargs = dict(kwargs)
        self._warmup_stream.wait_stream(torch.cuda.current_stream(self.device))
        with self._warmup_stream_cm():
            self._replace_leaves_with_clones(tensordict)
            self._tensordict = tensordict.clone()
            # The leaves the graph reads, kept apart from ``_tensordict``, whose entries the module may rebind.
            self._graph_inputs = self._tensordict.copy()
            self._graph_leaves = list(self._graph_inputs.items(True, True))
            self._graph_batch_size = self._graph_inputs.batch_size
            if tensordict_out is not None:
                out_for_capture = tensordict_out.copy()
                kwargs["tensordict_out"] = tensordict_out
            this_out = self.module(tensordict, *args, **kwargs)
        self._capture_stream.wait_stream(self._warmup_stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=self._capture_stream):
            if tensordict_out is not None:
                kwargs["tensordict_out"] = out_for_capture
            out = self.module(self._tensordict, *args, **kwargs)
        if out is not None and not is_tensor_collection(out):
            raise RuntimeError("The output of the function must be a tensordict, a tensorclass or None. Got "
                               f"type(out)={type(out)}.")
        if is_tensor_collection(out):
            out.lock_()
        self._out = out
        self.counter += 1
        if self._out_matches_in:
            if self.out_keys:
                self._selected_keys = list(self.out_keys)
            else:  # the entries the module replaced during the capture
                inputs = dict(self._graph_leaves)
                self._selected_keys = [key for key, value in out.items(True, True)
                                       if inputs.get(key) is not value]
        return this_out

    def _replay_tensordict(self, tensordict: Any, args: tuple, kwargs: dict, tensordict_out: Any) -> Any:
        if args or kwargs or self._graph_args:
            self._warn_if_args_changed(args, kwargs)
        if self._prob_modules:
            self._warn_if_interaction_type_changed()
        if tensordict.batch_size != self._graph_batch_size:
            raise ValueError(f"{type(self).__name__} was captured with batch_size={self._graph_batch_size} but got "
                             f"batch_size={tensordict.batch_size}. CUDA graphs replay fixed shapes.")
        sources, destinations = [], []
        present = set(tensordict.keys(True, True))
        for key, captured in self._graph_leaves:
            if key not in present:
                if key in self.in_keys:
                    raise KeyError(f"{type(self).__name__} input is missing the in_keys [{key!r}] that the "
                                   "captured graph reads.")
                continue
            value = tensordict.get(key)
            if not isinstance(captured, Tensor):
                continue
            if value.shape != captured.shape:
                raise ValueError(f"{type(self).__name__} was captured with the entry {key!r} of shape "
                                 f"{captured.shape} but got shape {value.shape}. CUDA graphs replay fixed shapes.")
            sources.append(value)
            destinations.append(captured)
        if sources:
            torch._foreach_copy_(destinations, sources)
        self.graph.replay()
        if self._out_matches_in:
            # A clone: the next replay overwrites the graph's buffers.
            return tensordict.update(self._out, keys_to_update=self._selected_keys, clone=True)
        if tensordict_out is not None:
            return tensordict_out.update(self._out, clone=True)
        return self._out.clone() if self._out is not None else None

    def _warn_if_args_changed(self, args: tuple, kwargs: dict) -> None:
        leaves = _leaves((args, kwargs))
        changed = len(leaves) != len(self._graph_args)
        for leaf, captured in zip(leaves, self._graph_args):
            if changed:
                break
            if leaf is captured or is_tensor_collection(captured):
                continue
            try:
                changed = bool(leaf != captured)
            except Exception:
                changed = True
        if changed:
            warnings.warn(f"{type(self).__name__} was captured with other non-tensor arguments than this call's. "
                          "The replay ignores them and uses the captured values. Pass the values that change as "
                          "entries of the tensordict, or use one CudaGraphModule per value.", FutureWarning,
                          stacklevel=5)

    # ---------------------------------------------------------------- calls with tensors
    def _call_tensors(self, args: tuple, kwargs: dict) -> Any:
        if self.counter >= self._warmup:
            sources: list = []
            destinations: list = []
            for source, destination in zip(_leaves((args, kwargs)), self._flat_tree, strict=True):
                self._copy_onto(source, destination, sources, destinations)
            if destinations:
                torch._foreach_copy_(destinations, sources)
            if self._prob_modules:
                self._warn_if_interaction_type_changed()
            self.graph.replay()
            if self._return_unchanged:
                return self._out
            return tree_unflatten([out.clone() if hasattr(out, "clone") else out for out in self._out],
                                  self._out_struct)
        if not self._has_cuda or self.counter < self._warmup - 1:
            args, kwargs = _map(self._clone, (args, kwargs))
            if self._has_cuda:
                self._warmup_stream.wait_stream(torch.cuda.current_stream(self.device))
            with self._warmup_stream_cm():
                out = self.module(*args, **kwargs)
            if self._has_cuda:
                torch.cuda.current_stream(self.device).wait_stream(self._warmup_stream)
            self.counter += self._has_cuda
            return out
        self._record_interaction_types()
        flat, spec = _flatten((args, kwargs))
        self._flat_tree = tuple(self._check_tree_for_capture(value) for value in flat)
        self._args, self._kwargs = tree_unflatten(list(self._flat_tree), spec)
        self._warmup_stream.wait_stream(torch.cuda.current_stream(self.device))
        with self._warmup_stream_cm():
            # Fresh copies: a module that writes into its inputs must see the same structure at capture.
            fresh_args, fresh_kwargs = _map(self._clone, (self._args, self._kwargs))
            this_out = self.module(*fresh_args, **fresh_kwargs)
        self._capture_stream.wait_stream(self._warmup_stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=self._capture_stream):
            out = self.module(*self._args, **self._kwargs)
        self._out, self._out_struct = _flatten(out)
        self.counter += 1
        inputs = _leaves((self._args, self._kwargs))
        outputs = _leaves(out)
        if any(isinstance(value, Tensor) and any(value is output for output in outputs) for value in inputs):
            warnings.warn("An input tensor is also present in the output of the wrapped function. "
                          f"{type(self).__name__} will not copy tensors in place: the output will be cloned and "
                          "the identity between input and output will not match anymore. Make sure you don't "
                          "rely on input-output identity further in the code.")
        if not self._out:
            self._return_unchanged = True
        else:
            self._out = [value.lock_() if is_tensor_collection(value) else value for value in self._out]
            self._return_unchanged = False
        return this_out

    # ---------------------------------------------------------------- the rest
    def __repr__(self) -> str:
        fields = [indent(field, "    ") for field in (f"module={self.module}", f"warmup={self._warmup}",
                                                     f"in_keys={self.in_keys}", f"out_keys={self.out_keys}")]
        body = ", \n".join(fields)
        return f"{type(self).__name__}(\n{body}\n)"

    def state_dict(self) -> dict:
        """The wrapped module's state dict (empty for a plain function)."""
        try:
            return self.module.state_dict()
        except AttributeError:
            return {}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load into the wrapped module (a plain function has nothing to load)."""
        try:
            self.module.load_state_dict(state_dict)
        except AttributeError:
            pass

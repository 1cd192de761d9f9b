"""``select_out_keys`` on a module: the forward hook that drops the outputs that were not selected.

The module still computes every output; the hook removes the others from the returned tensordict (never
an entry that is also an input, and a sub-tensordict left empty by the removal goes too). A call with
tensors needs no hook work: ``dispatch`` already returns the entries at the module's (selected)
``out_keys``.
"""
from __future__ import annotations

from typing import Any

from .._base import is_tensor_collection
from .._keys import unravel_key_list


class _OutKeyNotFoundError(ValueError, RuntimeError):
    """A key given to ``select_out_keys`` is not an out key (a ValueError and a RuntimeError, as upstream)."""


def check_selectable(module: Any, out_keys: list) -> None:
    if len(out_keys) == 1 and out_keys[0] not in module.out_keys:
        message = f"Can't select non existent key: {out_keys[0]}. "
        key = out_keys[0]
        if isinstance(key, (tuple, list)) and key and key[0] in module.out_keys:
            message += f"Are you passing the keys in a list? Try unpacking as: `{', '.join(key)}`"
        raise _OutKeyNotFoundError(message)
    missing = [key for key in out_keys if key not in module.out_keys]
    if missing:
        raise _OutKeyNotFoundError(
            f"Can't select non existent keys: {missing}. The module out_keys are {module.out_keys}."
        )


class _OutKeysSelect:
    """Forward hook (``with_kwargs=True``) registered by ``select_out_keys``."""

    def __init__(self, module: Any, out_keys: list) -> None:
        self.out_keys = list(out_keys)
        self.source = list(module.out_keys)
        self.module = module
        self._apply_selection(module)

    def _apply_selection(self, module: Any) -> None:
        had_apparent = "_out_keys_apparent" in module.__dict__
        previous = module.__dict__.get("_out_keys_apparent")
        module._out_keys_apparent = self.out_keys
        if module.out_keys == self.out_keys:
            return
        # ``out_keys`` is a property of the subclass that does not read ``_out_keys_apparent``: undo, then
        # try its setter.
        if had_apparent:
            module._out_keys_apparent = previous
        else:
            del module._out_keys_apparent
        setter = getattr(type(module), "out_keys", None)
        setter = getattr(setter, "fset", None)
        if setter is not None:
            module.out_keys = self.out_keys
            if module.out_keys == self.out_keys:
                return
            module.out_keys = self.source
        raise RuntimeError(f"{type(module).__name__} does not support select_out_keys.")

    def __call__(self, module: Any, args: tuple, kwargs: dict, output: Any) -> Any:
        if not is_tensor_collection(output):
            return output
        in_keys = module.in_keys
        selected = module.out_keys
        dropped = [key for key in self.source if key not in selected and key not in in_keys]
        if not dropped:
            return output
        present = [key for key in dropped if key in output.keys(True)]
        if present:
            output.exclude(*present, inplace=True)
        for key in dropped:
            if isinstance(key, str):
                continue
            # The parents the removal emptied go as well, unless they are keys of the module themselves.
            for depth in range(len(key) - 1, 0, -1):
                parent = key[:depth] if depth > 1 else key[0]
                if parent in selected or parent in in_keys:
                    break
                value = output.get(parent, None)
                if not is_tensor_collection(value) or not value.is_empty():
                    break
                del output[parent]
        return output

    def remove(self) -> None:
        module = self.module
        if module is not None and module.out_keys == self.out_keys:
            module.out_keys = self.source


def select_out_keys(module: Any, out_keys: tuple) -> Any:
    try:
        keys = unravel_key_list(list(out_keys))
    except KeyError:
        nested = [key for key in out_keys if isinstance(key, list)]
        hint = ""
        if nested and all(isinstance(part, str) for part in nested[0]):
            hint = f" Are you passing the keys in a list? Try unpacking as: `{', '.join(nested[0])}`"
        raise _OutKeyNotFoundError(f"Can't select the keys {list(out_keys)}: they are not valid keys.{hint}") from None
    check_selectable(module, keys)
    hook = _OutKeysSelect(module, keys)
    module.register_forward_hook(hook, with_kwargs=True)
    return module


def reset_out_keys(module: Any) -> Any:
    for handle_id, hook in reversed(list(module._forward_hooks.items())):
        if isinstance(hook, _OutKeysSelect):
            hook.remove()
            del module._forward_hooks[handle_id]
            module._forward_hooks_with_kwargs.pop(handle_id, None)
            module._forward_hooks_always_called.pop(handle_id, None)
    return module

"""An import-time stand-in for `sgl_kernel` on CPUs that have no build of it.

SGLang 0.5.23's CPU engine imports these names at module import time (`if _is_cpu: from sgl_kernel import ...`).
PyPI has no CPU build of sgl-kernel (its CPU kernels are C++ sources in SGLang's repository, built for AMX), so
without a module of that name SGLang cannot even be imported. On a CPU without AMX the prefill path that capture uses
is plain PyTorch and calls none of them; they serve decode, speculative verification and KV-cache moves.

Every stand-in function raises `StandInCalled` when called: a code path that needs a real kernel fails loudly, it
never computes something else. Names not listed here do not exist on the stand-in (`from sgl_kernel import other`
raises ImportError), so SGLang's own "kernel absent" fallbacks (`try: ... except ImportError`) behave exactly as
they would without the module. The list was collected by starting SGLang's CPU engine (in-process runner and
`sglang.Engine`) on Llama and DeepSeek-V3 models; a name missing from it shows up as an ImportError naming it.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Callable

MODULE_NAME = "sgl_kernel"

# (name, what SGLang uses it for): every name SGLang 0.5.23 imports from sgl_kernel at import time on CPU.
NAMES: dict[str, str] = {
    "copy_all_layer_kv_cache_cpu": "KV-cache moves between pools (hierarchical cache)",
    "assign_req_to_token_pool_cpu": "decode-step slot assignment",
    "build_tree_kernel_efficient_cpu": "speculative decoding: draft tree construction",
    "verify_tree_greedy_cpu": "speculative decoding: greedy tree verification",
    "assign_draft_cache_locs_contiguous_cpu": "speculative decoding: draft KV slots",
    "assign_extend_cache_locs_cpu": "speculative decoding: extend KV slots",
    "fill_accept_out_cache_loc_cpu": "speculative decoding: accepted-token KV slots",
    "fill_bonus_tokens_cpu": "speculative decoding: bonus tokens",
}


class StandInCalled(RuntimeError):
    """A stand-in `sgl_kernel` function was called: this code path needs the real sgl-kernel build."""


def _raiser(name: str, purpose: str) -> Callable[..., Any]:
    def stand_in(*_args: Any, **_kwargs: Any) -> Any:
        raise StandInCalled(
            f"sgl_kernel.{name} ({purpose}) was called, but this process runs SGLang's CPU engine with the "
            f"pipeline's import-time stand-in for sgl_kernel (no CPU build of sgl-kernel exists on PyPI); this path "
            f"needs the real kernel. Capture (prefill only) never calls it; install a real sgl-kernel build to use it")

    stand_in.__name__ = stand_in.__qualname__ = name
    stand_in.__doc__ = f"Stand-in for sgl_kernel.{name}: raises StandInCalled."
    return stand_in


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        # AttributeError makes `from sgl_kernel import name` an ImportError, as when the kernel is absent.
        raise AttributeError(f"module 'sgl_kernel' (the pipeline's CPU stand-in) has no attribute {name!r}")


def build_module() -> types.ModuleType:
    module = _StandInModule(MODULE_NAME, __doc__)
    module.__file__ = __file__
    module.IS_PIPELINE_STAND_IN = True
    for name, purpose in NAMES.items():
        setattr(module, name, _raiser(name, purpose))
    return module


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `sgl_kernel` (and nothing below it) from `build_module`; appended last, so a real build wins."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != MODULE_NAME:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin=__file__)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return build_module()

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install() -> bool:
    """Make `import sgl_kernel` find the stand-in. False (and nothing installed) when a real build is importable."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return True
    if importlib.machinery.PathFinder.find_spec(MODULE_NAME) is not None:
        return False
    sys.meta_path.append(_Finder())
    return True


def is_stand_in(module: types.ModuleType | None) -> bool:
    return bool(getattr(module, "IS_PIPELINE_STAND_IN", False))

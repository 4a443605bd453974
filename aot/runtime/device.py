"""IREE devices, one per driver per process, and DLPack exchange with torch.

The runtime side: imports ``iree.runtime``, never ``iree.compiler``; torch only for
exchanging tensors and for CUDA (the torch-free runtime opens CPU devices here too).
Tensors cross in both directions through DLPack without copies on CPU.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import iree.runtime as rt

from ..errors import AotError, ArtifactError, InputMismatch

__all__ = ["get_device", "torch_to_buffer_view", "buffer_view_to_torch", "DLPACK_DEVICE",
           "sync_torch", "cuda_unavailable_reason", "as_storage", "quiet_exit", "ALIGN",
           "aligned_copy"]

DLPACK_DEVICE = {"local-task": 1, "local-sync": 1, "cuda": 2}  # kDLCPU, kDLCUDA
# IREE imports host memory only at this alignment ("imported heap buffer data must be
# aligned to 64"); on CUDA it imports any pointer, but its kernels assume the alignment
# and fault (CUDA_ERROR_MISALIGNED_ADDRESS, the context lost): a tensor whose data
# pointer is not a multiple of it is copied before it is handed over
ALIGN = 64
_devices: dict[str, "rt.HalDevice"] = {}
_lock = threading.Lock()

if TYPE_CHECKING:
    import torch


def cuda_unavailable_reason() -> str | None:
    """Why CUDA artifacts cannot run in this process, or None when they can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (a CUDA artifact runs with torch)"
    if not torch.cuda.is_available():
        return ("no CUDA device is available to torch (torch.cuda.is_available() is False); "
                "compile and save for 'cuda' anywhere, run on a machine with an NVIDIA GPU")
    return None


def get_device(driver: str) -> "rt.HalDevice":
    """The process-wide device for ``driver`` (created on first use).

    CUDA: IREE's default pooled (async) allocations cannot be exported through
    DLPack ("CUDA buffer type is not supported for export"), so they are turned
    off before the device is created; results then come back to torch without
    copies.
    """
    with _lock:
        if driver not in _devices:
            if driver == "cuda":
                why = cuda_unavailable_reason()
                if why:
                    raise ArtifactError(f"cannot run a CUDA artifact: {why}", stage="load")
                rt.flags.parse_flags("--cuda_async_allocations=false")
            try:
                _devices[driver] = rt.get_device(driver)
            except Exception as e:
                raise ArtifactError(f"cannot open IREE device {driver!r}: {e} (is the hardware "
                                    "present and the driver available in iree-base-runtime?)",
                                    stage="load") from e
        return _devices[driver]


def torch_to_buffer_view(device: "rt.HalDevice", t: "torch.Tensor", name: str) -> "rt.HalBufferView":
    """Share a dense torch tensor's memory with IREE (no copy when it is ``ALIGN``-byte
    aligned; else an aligned copy, which ``CompiledModule`` has already made and counted
    for its inputs)."""
    import torch.utils.dlpack
    if not t.is_contiguous():
        raise InputMismatch(f"{name}: compiled code needs a dense row-major buffer, got strides "
                            f"{list(t.stride())}")
    if t.data_ptr() % ALIGN:
        t = aligned_copy(t)
    try:
        return device.from_dlpack_capsule(torch.utils.dlpack.to_dlpack(t.detach()))
    except Exception as e:
        raise InputMismatch(f"{name}: cannot hand tensor ({t.dtype}, {t.device}) to IREE: {e}") from e


def aligned_copy(t: "torch.Tensor") -> "torch.Tensor":
    """A row-major copy of ``t`` whose data is ``ALIGN``-byte aligned, for IREE to import.

    A contiguous tensor need not be aligned: a view at an offset (``x[1:]``), an array
    ``np.frombuffer`` read from a file, ``torch.frombuffer(..., offset=4)``. A fresh torch
    allocation is (c10's CPU allocator aligns to 64 bytes, CUDA's caching allocator to
    512); where an allocator does not, the copy is placed at an aligned offset of a
    larger buffer.
    """
    import torch
    c = t.clone(memory_format=torch.contiguous_format)
    return c if c.data_ptr() % ALIGN == 0 else _copy_at_aligned_offset(t)


def _copy_at_aligned_offset(t: "torch.Tensor") -> "torch.Tensor":
    """``t`` copied into a buffer ``ALIGN`` bytes longer, at its first aligned address."""
    import torch
    size = t.element_size()
    raw = torch.empty(t.numel() + ALIGN // size, dtype=t.dtype, device=t.device)
    skip = -raw.data_ptr() % ALIGN
    if skip % size:  # an allocation not even aligned to its element (no allocator does this)
        raise AotError(f"cannot align a {t.dtype} tensor for IREE: torch allocated it at "
                       f"{raw.data_ptr():#x}", stage="run")
    start = skip // size
    return raw[start:start + t.numel()].view(t.shape).copy_(t)


def buffer_view_to_torch(device: "rt.HalDevice", bv: "rt.HalBufferView", driver: str) -> "torch.Tensor":
    """A torch tensor over an IREE buffer view's memory (no copy; CUDA device 0)."""
    import torch
    return torch.from_dlpack(device.create_dlpack_capsule(bv, DLPACK_DEVICE[driver], 0))


def sync_torch(driver: str) -> None:
    """Make work torch queued on its current CUDA stream visible to IREE (no-op on CPU).

    IREE runs on its own CUDA stream and does not know torch's; a tensor torch
    produced (a model input, a kernel call's result) is complete only once
    torch's stream has drained. Called once before invoking the module and at
    the end of every kernel call on CUDA; IREE itself finishes its own work
    before it calls a host function and before ``invoke`` returns.
    """
    if driver == "cuda":
        import torch
        torch.cuda.current_stream().synchronize()


def as_storage(t: "torch.Tensor", dtype: "torch.dtype") -> "torch.Tensor":
    """Reinterpret a buffer IREE typed signless (``i8``) as the dtype the spec says (``uint8``)."""
    if t.dtype == dtype or t.element_size() != dtype.itemsize:
        return t
    return t.view(dtype)


def quiet_exit() -> None:
    """At interpreter exit, once a runtime has released its modules: drop the devices and
    silence nanobind's report of IREE buffers still alive. Output tensors or arrays the
    user holds keep them alive (zero-copy); that is not a leak."""
    import gc
    _devices.clear()
    gc.collect()
    disable = getattr(getattr(rt, "_binding", None), "disable_leak_checker", None)
    if disable is None:
        from iree._runtime_libs import _runtime
        disable = getattr(_runtime, "disable_leak_checker", None)
    if disable is not None:
        disable()

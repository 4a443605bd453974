"""IREE devices, one per driver per process, and DLPack exchange with torch.

The runtime side: imports ``iree.runtime`` and torch, never ``iree.compiler``.
Tensors cross in both directions through DLPack without copies on CPU.
"""

from __future__ import annotations

import threading

import torch
import iree.runtime as rt

from ..errors import ArtifactError, InputMismatch

__all__ = ["get_device", "torch_to_buffer_view", "buffer_view_to_torch", "DLPACK_DEVICE"]

DLPACK_DEVICE = {"local-task": 1, "local-sync": 1, "cuda": 2}  # kDLCPU, kDLCUDA
_devices: dict[str, "rt.HalDevice"] = {}
_lock = threading.Lock()


def get_device(driver: str) -> "rt.HalDevice":
    """The process-wide device for ``driver`` (created on first use)."""
    with _lock:
        if driver not in _devices:
            try:
                _devices[driver] = rt.get_device(driver)
            except Exception as e:
                raise ArtifactError(f"cannot open IREE device {driver!r}: {e} (is the hardware "
                                    "present and the driver available in iree-base-runtime?)",
                                    stage="load") from e
        return _devices[driver]


def torch_to_buffer_view(device: "rt.HalDevice", t: torch.Tensor, name: str) -> "rt.HalBufferView":
    """Share a dense torch tensor's memory with IREE (no copy)."""
    if not t.is_contiguous():
        raise InputMismatch(f"{name}: compiled code needs a dense row-major buffer, got strides "
                            f"{list(t.stride())}")
    try:
        return device.from_dlpack_capsule(torch.utils.dlpack.to_dlpack(t.detach()))
    except Exception as e:
        raise InputMismatch(f"{name}: cannot hand tensor ({t.dtype}, {t.device}) to IREE: {e}") from e


def buffer_view_to_torch(device: "rt.HalDevice", bv: "rt.HalBufferView", driver: str) -> torch.Tensor:
    """A torch tensor over an IREE buffer view's memory (no copy)."""
    return torch.from_dlpack(device.create_dlpack_capsule(bv, DLPACK_DEVICE[driver], 0))


def as_storage(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret a buffer IREE typed signless (``i8``) as the dtype the spec says (``uint8``)."""
    if t.dtype == dtype or t.element_size() != torch.empty((), dtype=dtype).element_size():
        return t
    return t.view(dtype)

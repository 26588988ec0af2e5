"""An emulated accelerator on the CPU: run the GPU code path without a GPU, count what it launches.

Tensors "on the device" are :class:`DeviceTensor` s: wrappers that report ``device`` ``meta`` (a device that
needs no driver) around real CPU data, so code that branches on ``x.device.type != "cpu"`` takes its
accelerator branch, and every op runs on the CPU with the CPU's kernels (the same numbers). Inside
``with EmulatedDevice() as dev:`` (``dev.device`` is the device to move tensors to):

- an op that mixes a device tensor with a host tensor of one or more dimensions fails as it does on CUDA
  (``Expected all tensors to be on the same device``), naming the op and the host tensor's shape; 0-dim host
  tensors pass (CUDA reads them as scalars), as do host index tensors of ``index`` / ``index_put_`` (CUDA
  copies them over; counted as transfers) and cross-device ``copy_``;
- ``dev.device_ops`` lists the aten ops run on the device (each one or more kernel launches on a GPU; views
  and metadata ops included, as ``benchmarks.perf.launch_count`` counts them), ``dev.host_ops`` counts the
  aten ops on host tensors (host time, no launch), ``dev.to_device`` the host-to-device copies (a blocking
  copy from pageable memory waits for the stream) and ``dev.syncs`` the device-to-host reads (``.cpu()``,
  ``.item()``, ``nonzero`` and boolean-mask indexing, whose output size the host must know).

What it cannot show: kernel time, memory, or a library's own CUDA-only branch (``device.type == "cuda"``).

>>> import torch
>>> with EmulatedDevice() as dev:
...     x = torch.rand(2, 3).to(dev.device)
...     y = (x * 2).sum(0)
...     try:
...         x + torch.ones(2, 3)
...     except RuntimeError as e:
...         print(str(e).split(";")[0])
...     host = y.cpu()
Expected all tensors to be on the same device: add.Tensor got a host tensor of shape (2, 3)
>>> dev.device_ops, dev.to_device, dev.syncs, type(host) is torch.Tensor
(['mul.Tensor', 'sum.dim_IntList'], 1, 1, True)
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

FAKE = torch.device("meta")
_aten = torch.ops.aten
# ops that take host index tensors on a CUDA tensor (PyTorch copies the indices over)
_HOST_INDEX_OK = {
    _aten.index.Tensor,
    _aten.index_put_.default,
    _aten.index_put.default,
    _aten._index_put_impl_.default,
}
# ops whose output size depends on the data: the host waits for the device
_SYNC = {_aten.nonzero.default, _aten._local_scalar_dense.default, _aten.masked_select.default}


class DeviceTensor(torch.Tensor):
    """A tensor on the emulated device: reports ``device`` meta, holds CPU data in ``elem``."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            device=FAKE,
            requires_grad=elem.requires_grad,
        )
        r.elem = elem
        return r

    def __repr__(self) -> str:  # type: ignore[override]  # torch's stub names a keyword "Any"
        return f"DeviceTensor({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError("a DeviceTensor is used outside its EmulatedDevice")


def _is_fake(device) -> bool:
    return device is not None and torch.device(device).type == FAKE.type


def _unwrap(a):
    return a.elem if isinstance(a, DeviceTensor) else a


def _wrap(a):
    return DeviceTensor(a) if isinstance(a, torch.Tensor) and not isinstance(a, DeviceTensor) else a


def _list_index_to_tensor(index):
    if isinstance(index, list):
        return torch.tensor(index)
    if isinstance(index, tuple):
        return tuple(torch.tensor(i) if isinstance(i, list) else i for i in index)
    return index


class _Factories(TorchFunctionMode):
    """What happens above the dispatcher: ``torch.tensor(data, device=dev)`` (built on the host, then moved),
    list indices, the data's address and ``tolist``."""

    def __init__(self, owner: EmulatedDevice):
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and isinstance(args[0], DeviceTensor):
            # a list index becomes an index tensor on the indexed tensor's device below the dispatcher (it
            # would come out empty): hand it over as a host index tensor, which CUDA copies over too
            args = (args[0], _list_index_to_tensor(args[1]), *args[2:])
        if func in (torch.Tensor.data_ptr, torch.Tensor.untyped_storage) and isinstance(
            args[0], DeviceTensor
        ):
            # the address of the data (the wrapper itself has none: every device tensor would read 0, and
            # memos keyed by address would mix up images)
            return func(args[0].elem)
        if func is torch.Tensor.tolist and isinstance(
            args[0], DeviceTensor
        ):  # a read back the host waits for
            self.owner.syncs += 1
            return args[0].elem.tolist()
        if func in (torch.tensor, torch.as_tensor) and _is_fake(kwargs.get("device")):
            kwargs["device"] = "cpu"
            self.owner.to_device += 1
            self.owner.blocking_copies += 1
            return DeviceTensor(func(*args, **kwargs))
        return func(*args, **kwargs)


class EmulatedDevice(TorchDispatchMode):
    """The context in which :class:`DeviceTensor` s compute (see the module docstring)."""

    device = FAKE

    def __init__(self) -> None:
        super().__init__()
        self.device_ops: list[str] = []
        self.host_ops = 0
        self.to_device = 0
        self.blocking_copies = 0
        self.syncs = 0
        self._factories = _Factories(self)

    @property
    def launches(self) -> int:
        """The device ops that launch a kernel: all but views, metadata and allocations
        (``benchmarks.perf.launch_count.NO_KERNEL``)."""
        from benchmarks.perf.launch_count import NO_KERNEL

        return sum(1 for op in self.device_ops if "aten::" + op.split(".")[0] not in NO_KERNEL)

    def reset(self) -> None:
        """Zero the counts (after a warm-up)."""
        self.device_ops, self.host_ops, self.to_device, self.blocking_copies, self.syncs = [], 0, 0, 0, 0

    def __enter__(self):
        self._factories.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._factories.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        on_dev = any(isinstance(a, DeviceTensor) for a in leaves)
        name = str(func.overloadpacket.__name__) + "." + func._overloadname
        if func is _aten._to_copy.default or func is _aten.copy_.default:
            return self._transfer(func, args, kwargs, on_dev)
        if not on_dev and not _is_fake(kwargs.get("device")):
            self.host_ops += 1
            return func(*args, **kwargs)
        host = [a for a in leaves if not isinstance(a, DeviceTensor) and a.dim() > 0]
        if host and func in _HOST_INDEX_OK and all(any(a is i for i in args[1]) for a in host):
            self.to_device += len(host)  # only index tensors are on the host: CUDA copies them over
        elif host:
            raise RuntimeError(
                f"Expected all tensors to be on the same device: {name} got a host tensor of shape "
                f"{tuple(host[0].shape)}; move it to the device first"
            )
        if func in _SYNC or (
            func is _aten.index.Tensor
            and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])
        ):
            self.syncs += 1
        self.device_ops.append(name)
        kw = {k: (torch.device("cpu") if k == "device" and _is_fake(v) else v) for k, v in kwargs.items()}
        out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kw))
        if func is _aten._local_scalar_dense.default:
            return out
        return tree_map(_wrap, out)

    def _transfer(self, func, args, kwargs, on_dev):
        src = args[0] if func is _aten._to_copy.default else args[1]
        if func is _aten.copy_.default:  # dst.copy_(src): any pair of devices
            dst = args[0]
            if isinstance(dst, DeviceTensor) != isinstance(src, DeviceTensor):
                self.to_device += isinstance(dst, DeviceTensor)
                self.syncs += isinstance(src, DeviceTensor)
            elif on_dev:
                self.device_ops.append("copy_.default")
            else:
                self.host_ops += 1
            _unwrap(dst).copy_(_unwrap(src), *args[2:], **kwargs)
            return dst
        target = kwargs.get("device")
        kw = {k: v for k, v in kwargs.items() if k != "device"}
        if isinstance(src, DeviceTensor):
            if target is not None and not _is_fake(target):  # device -> host: the host waits
                self.syncs += 1
                return func(src.elem, **kw)
            self.device_ops.append("_to_copy.default")
            return DeviceTensor(func(src.elem, **kw))
        if _is_fake(target):
            self.to_device += 1
            self.blocking_copies += not kwargs.get("non_blocking", False)
            return DeviceTensor(func(src, **kw))
        self.host_ops += 1
        return func(*args, **kwargs)


def on_host(x):
    """The CPU data of a (nest of) device tensor(s), for comparing results outside the context."""
    return tree_map(_unwrap, x)

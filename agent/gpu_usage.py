"""What the node's GPUs hold and how busy they are, read through NVML with each lease
renewal: per node (memory in use, mean utilisation of its devices, sent with the
renewal) and per job (the peak memory and mean utilisation of its own devices over
the samples, sent with its report).

A device is one job's alone (placement reserves it), so a device's figures are its
job's. NVML answers no utilisation for a MIG instance: such a job reports memory only.
Without NVML (`pynvml`, the extra `corral[gpu]`) nothing is read and nothing is sent:
reading never stops a renewal nor a report. The arithmetic is pure; `NvmlReader`
does the I/O.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from . import gpus as gpu_discovery

log = logging.getLogger(__name__)

MiB = 1024 * 1024
Reading = tuple[float | None, int | None]  # (utilisation %, memory used MB), None where not read


class Reader(Protocol):
    def read(self, uuids: Iterable[str]) -> dict[str, Reading]: ...


class NvmlReader:
    """Reads devices by UUID through NVML, each handle looked up once."""

    def __init__(self, nvml: Any):
        self.nvml = nvml
        self._handles: dict[str, Any] = {}

    @classmethod
    def open(cls, import_nvml: Callable[[], Any] = gpu_discovery.import_nvml) -> NvmlReader | None:
        """A reader, or None where NVML cannot be used (no bindings, no driver)."""
        try:
            nvml = import_nvml()
            if nvml is None:
                return None
            nvml.nvmlInit()
            return cls(nvml)
        except Exception as exc:  # the bindings' NVMLError, or anything a broken driver raises
            log.info("GPU usage is not read: NVML does not start (%s)", exc)
            return None

    def read(self, uuids: Iterable[str]) -> dict[str, Reading]:
        found: dict[str, Reading] = {}
        for uuid in uuids:
            try:
                handle = self._handles.get(uuid)
                if handle is None:
                    handle = self._handles[uuid] = self.nvml.nvmlDeviceGetHandleByUUID(uuid)
                memory = int(self.nvml.nvmlDeviceGetMemoryInfo(handle).used) // MiB
            except Exception:
                log.debug("reading GPU %s failed", uuid, exc_info=True)
                continue
            try:
                utilization: float | None = float(self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except Exception:  # NVML_ERROR_NOT_SUPPORTED for a MIG instance
                utilization = None
            found[uuid] = (utilization, memory)
        return found


@dataclass
class JobUse:
    """One job's samples so far."""

    peak_memory_mb: int | None = None
    utilization_total: float = 0.0
    utilization_samples: int = 0

    def add(self, readings: list[Reading]) -> None:
        memories = [memory for _, memory in readings if memory is not None]
        if memories:
            self.peak_memory_mb = max(self.peak_memory_mb or 0, sum(memories))
        rates = [rate for rate, _ in readings if rate is not None]
        if rates:
            self.utilization_total += sum(rates) / len(rates)
            self.utilization_samples += 1

    def report(self) -> dict[str, Any]:
        """The report's fields: those read."""
        found: dict[str, Any] = {}
        if self.peak_memory_mb is not None:
            found["peak_gpu_memory_mb"] = self.peak_memory_mb
        if self.utilization_samples:
            found["gpu_utilization_percent"] = round(self.utilization_total / self.utilization_samples, 1)
        return found


def node_usage(readings: Mapping[str, Reading]) -> dict[str, Any]:
    """The renewal's GPU figures: memory in use on every device read, their mean utilisation."""
    if not readings:
        return {}
    rates = [rate for rate, _ in readings.values() if rate is not None]
    found: dict[str, Any] = {"gpu_memory_mb": sum(memory or 0 for _, memory in readings.values())}
    if rates:
        found["gpu_utilization_percent"] = round(sum(rates) / len(rates), 1)
    return found


class GpuMeter:
    """The samples of the node's devices (`devices`: every UUID it advertises) and of each
    held job's own, taken at each renewal (`sample`); a job's summary when it ends (`take`)."""

    def __init__(self, reader: Reader | None, devices: Iterable[str]):
        self.reader = reader
        self.devices = tuple(devices)
        self._jobs: dict[Hashable, JobUse] = {}
        self._lock = threading.Lock()  # the lease thread samples, the work loop takes

    def sample(self, held: Mapping[Hashable, Iterable[str]]) -> dict[str, Any]:
        """Read every device; add each held job's (`held`: key -> its UUIDs) to its samples;
        the node's figures for the renewal ({} when nothing was read)."""
        if self.reader is None or not self.devices:
            return {}
        try:
            readings = self.reader.read(self.devices)
        except Exception:
            log.debug("reading the GPUs failed; this renewal carries none", exc_info=True)
            return {}
        with self._lock:
            for key, uuids in held.items():
                own = [readings[uuid] for uuid in uuids if uuid in readings]
                if own:
                    self._jobs.setdefault(key, JobUse()).add(own)
        return node_usage(readings)

    def take(self, key: Hashable) -> dict[str, Any]:
        """The job's report fields, its samples forgotten ({} when none was read)."""
        with self._lock:
            use = self._jobs.pop(key, None)
        return {} if use is None else use.report()

"""What GPUs use, read through NVML (gpu_usage.py), against a recorded NVML behind the
same interface: per device, per node with each renewal, per job with its report."""
import types

import pytest


from corral.agent.gpu_usage import GpuMeter, NvmlReader, node_usage
from corral.agent.jobs import LocalJob
from corral.agent.usage import Meter

MiB = 1024 * 1024


class NotSupported(Exception):
    pass


def fake_nvml(devices, fail_init=False):
    """A module with NVML's names: `devices` maps a UUID to (utilisation or None, memory used MB)."""
    def init():
        if fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def handle(uuid):
        if uuid not in devices:
            raise KeyError(uuid)
        return uuid

    def utilization(h):
        rate = devices[h][0]
        if rate is None:
            raise NotSupported("Not Supported")  # a MIG instance
        return types.SimpleNamespace(gpu=rate, memory=0)

    return types.SimpleNamespace(
        nvmlInit=init, nvmlDeviceGetHandleByUUID=handle,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=devices[h][1] * MiB, total=81920 * MiB),
        nvmlDeviceGetUtilizationRates=utilization)


def test_a_reader_reads_each_device_and_leaves_out_what_nvml_does_not_give():
    nvml = fake_nvml({"GPU-a": (93, 30000), "MIG-b": (None, 4000)})
    reader = NvmlReader.open(lambda: nvml)
    assert reader.read(["GPU-a", "MIG-b", "GPU-gone"]) == {"GPU-a": (93.0, 30000), "MIG-b": (None, 4000)}


@pytest.mark.parametrize("importer", [lambda: None, lambda: fake_nvml({}, fail_init=True)])
def test_without_nvml_nothing_is_read(importer):
    assert NvmlReader.open(importer) is None
    meter = GpuMeter(None, ["GPU-a"])
    assert meter.sample({("job-1", 1): ["GPU-a"]}) == {} and meter.take(("job-1", 1)) == {}


def test_a_job_reports_the_peak_memory_and_mean_utilisation_of_its_own_devices():
    devices = {"GPU-a": (100, 1000), "GPU-b": (50, 3000), "GPU-c": (0, 500)}
    meter = GpuMeter(NvmlReader(fake_nvml(devices)), list(devices))
    job, other = ("job-1", 1), ("job-2", 1)
    assert meter.sample({job: ["GPU-a", "GPU-b"], other: ["GPU-c"]}) == {"gpu_memory_mb": 4500,
                                                                         "gpu_utilization_percent": 50.0}
    devices["GPU-a"], devices["GPU-b"] = (0, 8000), (10, 1000)
    meter.sample({job: ["GPU-a", "GPU-b"], other: ["GPU-c"]})
    # Samples: mean 75 then 5; memory 4000 then 9000 (both devices together).
    assert meter.take(job) == {"peak_gpu_memory_mb": 9000, "gpu_utilization_percent": 40.0}
    assert meter.take(job) == {}  # taken once
    assert meter.take(other) == {"peak_gpu_memory_mb": 500, "gpu_utilization_percent": 0.0}


def test_a_mig_instance_reports_memory_only():
    meter = GpuMeter(NvmlReader(fake_nvml({"MIG-a": (None, 2048)})), ["MIG-a"])
    assert meter.sample({("job-1", 1): ["MIG-a"]}) == {"gpu_memory_mb": 2048}
    assert meter.take(("job-1", 1)) == {"peak_gpu_memory_mb": 2048}
    assert node_usage({}) == {}


def test_a_reader_that_fails_costs_the_renewal_nothing():
    class Broken:
        def read(self, uuids):
            raise OSError("the driver went away")
    assert GpuMeter(Broken(), ["GPU-a"]).sample({("job-1", 1): ["GPU-a"]}) == {}


def test_the_renewal_carries_the_gpus_with_the_cgroups_figures():
    class Cgroup:
        def usage(self):
            return {"memory_bytes": 256 * MiB, "cpu_seconds": 1.0}
    local = LocalJob("job-1", 1, "run", "/w", 0.0, None, cgroup=Cgroup(), gpus=("GPU-a",))
    plain = LocalJob("job-2", 1, "run", "/w", 0.0, None, cgroup=Cgroup())
    meter = Meter(lambda: [local, plain], lambda: True, lambda: 10.0,
                  gpus=GpuMeter(NvmlReader(fake_nvml({"GPU-a": (80, 1200)})), ["GPU-a"]))
    assert meter.read() == {"memory_mb": 512, "cpu_percent": 0, "gpu_memory_mb": 1200,
                            "gpu_utilization_percent": 80.0}
    assert meter.gpus.take(local.key) == {"peak_gpu_memory_mb": 1200, "gpu_utilization_percent": 80.0}
    assert meter.gpus.take(plain.key) == {}

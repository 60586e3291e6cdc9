"""The node's GPUs and other countable resources: discovered through a fake NVML module
and recorded nvidia-smi answers (tests/data/nvidia-smi/) behind the same interface as
the real ones, chosen by AGENT_GPUS, declared by AGENT_RESOURCES, and advertised in the
registration body."""
import json
import os
import subprocess
from types import SimpleNamespace

import pytest

from corral.agent import gpus
from corral.agent.gpus import Gpu
from corral.agent.jobs import JobTable
from corral.agent.membership import Membership
from corral.agent.settings import AgentSettings, parse_resources
from corral.registry.contract import NodeRegistration
from corral.shared.errors import SettingError
from paths import DATA

SMI = os.path.join(DATA, "nvidia-smi")
MiB = 1024 * 1024
A100 = "NVIDIA A100-SXM4-80GB"


def recorded(name):
    with open(os.path.join(SMI, name)) as f:
        return f.read()


# --- a fake NVML: pynvml's names, two A100s, GPU 0 in MIG mode ---------------------------


class NVMLError(Exception):
    pass


class NVMLError_NotFound(NVMLError):  # noqa: N801 (pynvml's name)
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    pass


class FakeNvml:
    """The calls gpus.discover makes, answered as an A100 node's driver does: GPU 0 is
    partitioned (a 3g.40gb and a 1g.10gb instance, with an empty slot between them),
    GPU 1 is whole. Minor numbers do not follow the indexes, as on many servers."""

    NVMLError = NVMLError
    NVMLError_NotFound = NVMLError_NotFound
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, as_bytes=False, init_error=None, lost=(), mig_name=None):
        self.as_bytes = as_bytes
        self.init_error = init_error
        self.lost = set(lost)
        self.calls = []
        mig_names = mig_name or (f"{A100} MIG 3g.40gb", f"{A100} MIG 1g.10gb")
        self.devices = [
            {"name": A100, "uuid": "GPU-0fd630f1-f29d-4da9-953f-48f1a09f76b5", "total": 81920 * MiB, "minor": 1,
             "mig": [{"name": mig_names[0], "uuid": "MIG-8e81973e-0bec-47b0-b898-d190f9ebdacc", "total": 40192 * MiB},
                     None,
                     {"name": mig_names[1], "uuid": "MIG-92276658-1e27-41c0-8a6a-63ec24ede6a4", "total": 9728 * MiB}]},
            {"name": A100, "uuid": "GPU-0cb1e29c-658c-4a14-95e6-0af593bd04cf", "total": 81920 * MiB, "minor": 0,
             "mig": None},
        ]

    def _out(self, text):
        return text.encode() if self.as_bytes else text

    def nvmlInit(self):  # noqa: N802 (pynvml's names)
        self.calls.append("init")
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self):  # noqa: N802
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        if i in self.lost:
            raise NVMLError("GPU is lost")
        return self.devices[i]

    def nvmlDeviceGetName(self, handle):  # noqa: N802
        return self._out(handle["name"])

    def nvmlDeviceGetUUID(self, handle):  # noqa: N802
        return self._out(handle["uuid"])

    def nvmlDeviceGetMemoryInfo(self, handle):  # noqa: N802
        return SimpleNamespace(total=handle["total"], free=handle["total"], used=0)

    def nvmlDeviceGetMinorNumber(self, handle):  # noqa: N802
        if "minor" not in handle:
            raise NVMLError_NotSupported("not for a MIG device")
        return handle["minor"]

    def nvmlDeviceGetMigMode(self, handle):  # noqa: N802
        if handle["mig"] is None:
            raise NVMLError_NotSupported("not a MIG-capable GPU")
        return [self.NVML_DEVICE_MIG_ENABLE, self.NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):  # noqa: N802
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, slot):  # noqa: N802
        migs = handle["mig"]
        if slot >= len(migs) or migs[slot] is None:
            raise NVMLError_NotFound("no MIG device there")
        return migs[slot]


def no_smi(*args, **kwargs):
    raise AssertionError("nvidia-smi must not be asked when NVML answers")


NVML_FOUND = [
    Gpu("0:0", "MIG-8e81973e-0bec-47b0-b898-d190f9ebdacc", f"{A100} MIG 3g.40gb", 40192, 1,
        "GPU-0fd630f1-f29d-4da9-953f-48f1a09f76b5"),
    Gpu("0:1", "MIG-92276658-1e27-41c0-8a6a-63ec24ede6a4", f"{A100} MIG 1g.10gb", 9728, 1,
        "GPU-0fd630f1-f29d-4da9-953f-48f1a09f76b5"),
    Gpu("1", "GPU-0cb1e29c-658c-4a14-95e6-0af593bd04cf", A100, 81920, 0, None),
]


def test_nvml_lists_mig_instances_in_place_of_their_gpu():
    nvml = FakeNvml()
    assert gpus.discover(nvml=nvml, run=no_smi) == NVML_FOUND
    assert nvml.calls == ["init", "shutdown"]


def test_names_and_uuids_in_bytes_from_older_bindings_are_decoded():
    assert gpus.discover(nvml=FakeNvml(as_bytes=True), run=no_smi) == NVML_FOUND


def test_an_instance_named_by_its_profile_alone_gets_its_gpus_model():
    found = gpus.discover(nvml=FakeNvml(mig_name=("MIG 3g.40gb", "1g.10gb")), run=no_smi)
    assert [gpu.model for gpu in found[:2]] == [f"{A100} MIG 3g.40gb", f"{A100} MIG 1g.10gb"]


def test_a_gpu_nvml_cannot_read_is_left_out_and_nvml_is_shut_down():
    nvml = FakeNvml(lost={0})
    assert gpus.discover(nvml=nvml, run=no_smi) == NVML_FOUND[2:]
    assert nvml.calls[-1] == "shutdown"


class Smi:
    """subprocess.run answering nvidia-smi's two commands from recorded files, or
    failing as told ("missing", "exit", "timeout"); notes each command run."""

    def __init__(self, query="query-a100x8.csv", listing=None, fail=None, fail_list=None):
        self.query, self.listing, self.fail, self.fail_list = query, listing, fail, fail_list
        self.commands = []

    def __call__(self, command, capture_output, text, timeout, check):
        assert (capture_output, text, check) == (True, True, False) and timeout == gpus.SMI_TIMEOUT_SECS
        self.commands.append(tuple(command))
        listing = tuple(command) == gpus.SMI_LIST
        fail = self.fail_list if listing else self.fail
        if fail == "missing":
            raise FileNotFoundError(2, "No such file or directory", "nvidia-smi")
        if fail == "timeout":
            raise subprocess.TimeoutExpired(command, timeout)
        if fail == "exit":
            return subprocess.CompletedProcess(command, 9, "", "NVIDIA-SMI has failed because it couldn't "
                                               "communicate with the NVIDIA driver.\n")
        if listing:
            out = recorded(self.listing) if self.listing else self._plain_list()
        else:
            out = recorded(self.query)
        return subprocess.CompletedProcess(command, 0, out, "")

    def _plain_list(self):
        rows = [line.split(", ") for line in recorded(self.query).splitlines()]
        return "".join(f"GPU {row[0]}: {row[2]} (UUID: {row[1]})\n" for row in rows)


def proc_files(minors):
    """A reader of /proc/driver/nvidia/gpus/<bus>/information: {path's bus id: minor}."""
    template = recorded("proc-information.txt")

    def read(path):
        bus_id = path.split("/")[-2]
        if bus_id not in minors:
            raise FileNotFoundError(2, "No such file or directory", path)
        return template.replace("Device Minor: \t 0", f"Device Minor: \t {minors[bus_id]}")
    return read


NO_NVML = FakeNvml(init_error=NVMLError("Driver Not Loaded"))


def test_without_nvml_nvidia_smi_is_read_with_minors_from_the_driver():
    smi = Smi()
    # The driver's directories: a 4-digit domain in lower case; the minors follow its order.
    minors = {"0000:07:00.0": 2, "0000:0f:00.0": 3, "0000:47:00.0": 0, "0000:4e:00.0": 1,
              "0000:87:00.0": 6, "0000:90:00.0": 7, "0000:b7:00.0": 4}  # BD: no file
    found = gpus.discover(nvml=FakeNvml(init_error=NVMLError("Driver Not Loaded")), run=smi,
                          read_file=proc_files(minors))
    assert smi.commands == [gpus.SMI_QUERY, gpus.SMI_LIST]
    assert [gpu.index for gpu in found] == [str(i) for i in range(8)]
    assert [gpu.minor for gpu in found] == [2, 3, 0, 1, 6, 7, 4, 7]  # the last: its index
    assert found[0] == Gpu("0", "GPU-6513270e-269e-4d37-b2a7-4de452e6b438", A100, 81920, 2)
    assert {(gpu.model, gpu.memory_mb, gpu.parent_uuid) for gpu in found} == {(A100, 81920, None)}
    assert len({gpu.uuid for gpu in found}) == 8


def test_the_driver_directory_named_as_nvidia_smi_writes_it_is_read_too():
    assert gpus.proc_paths("00000000:B7:00.0") == ["/proc/driver/nvidia/gpus/0000:b7:00.0/information",
                                                   "/proc/driver/nvidia/gpus/00000000:b7:00.0/information"]
    assert gpus.minor_number("00000000:B7:00.0", proc_files({"00000000:b7:00.0": 5})) == 5
    assert gpus.minor_number("00000000:B7:00.0", proc_files({})) is None


def test_nvidia_smi_lists_mig_instances_in_place_of_their_gpu():
    found = gpus.discover(nvml=NO_NVML, run=Smi(query="query-mig.csv", listing="list-mig.txt"),
                          read_file=proc_files({"0000:17:00.0": 3, "0000:65:00.0": 0}))
    parent = "GPU-0fd630f1-f29d-4da9-953f-48f1a09f76b5"
    assert found == [
        Gpu("0:0", "MIG-8e81973e-0bec-47b0-b898-d190f9ebdacc", f"{A100} MIG 3g.40gb", 40960, 3, parent),
        Gpu("0:1", "MIG-6b4cb242-4a23-4596-a217-beaddbc496cb", f"{A100} MIG 2g.20gb", 20480, 3, parent),
        Gpu("0:2", "MIG-92276658-1e27-41c0-8a6a-63ec24ede6a4", f"{A100} MIG 1g.10gb", 10240, 3, parent),
        Gpu("0:3", "MIG-ae97ba94-d0ed-482f-8f6d-05584ef8aa38", f"{A100} MIG 1g.10gb", 10240, 3, parent),
        Gpu("1", "GPU-0cb1e29c-658c-4a14-95e6-0af593bd04cf", A100, 81920, 0),
    ]


def test_nvml_failing_at_init_falls_back_to_nvidia_smi():
    nvml = FakeNvml(init_error=NVMLError("Driver/library version mismatch"))
    smi = Smi(query="query-mig.csv", listing="list-mig.txt")
    assert len(gpus.discover(nvml=nvml, run=smi, read_file=proc_files({}))) == 5
    assert nvml.calls == ["init"] and smi.commands[0] == gpus.SMI_QUERY


@pytest.mark.parametrize("fail", ["missing", "exit", "timeout"])
def test_nvidia_smi_missing_failing_or_hanging_means_no_gpus(fail):
    smi = Smi(fail=fail)
    assert gpus.discover(nvml=NO_NVML, run=smi, read_file=proc_files({})) == []
    assert smi.commands == [gpus.SMI_QUERY]


@pytest.mark.parametrize("fail", ["exit", "timeout"])
def test_a_failing_listing_leaves_the_gpus_whole(fail):
    found = gpus.discover(nvml=NO_NVML, run=Smi(query="query-mig.csv", listing="list-mig.txt", fail_list=fail),
                          read_file=proc_files({}))
    assert [(gpu.index, gpu.minor) for gpu in found] == [("0", 0), ("1", 1)]


def test_an_unreadable_row_is_left_out():
    rows = gpus.parse_query("0, GPU-a, NVIDIA A10, 23028, 00000000:01:00.0\n"
                            "1, GPU-b, NVIDIA A10, [N/A], 00000000:02:00.0\n"
                            "garbage\n")
    assert [(gpu.index, gpu.memory_mb, bus) for gpu, bus in rows] == [("0", 23028, "00000000:01:00.0")]


def test_profile_memory():
    assert [gpus.profile_memory_mb(p) for p in ("1g.10gb", "1g.10gb+me", "1c.3g.40gb", "7g.80gb", "odd")] == \
        [10240, 10240, 40960, 81920, 0]


# --- AGENT_GPUS -----------------------------------------------------------------------


FOUND = NVML_FOUND + [Gpu("2", "GPU-9531985d-5d9d-49f8-9818-e811892f902b", A100, 81920, 2)]


def test_auto_keeps_everything_and_none_nothing():
    assert gpus.select(FOUND, "auto") == FOUND
    assert gpus.select(FOUND, "none") == []


def test_a_list_keeps_those_named_in_the_order_found():
    assert gpus.select(FOUND, "2,0:1") == [FOUND[1], FOUND[3]]
    assert gpus.select(FOUND, "GPU-0cb1e29c-658c-4a14-95e6-0af593bd04cf,MIG-8e81973e-0bec-47b0-b898-d190f9ebdacc,1") \
        == [FOUND[0], FOUND[2]]


def test_a_device_not_found_is_an_error_naming_it_and_what_was_found():
    with pytest.raises(SettingError) as refused:
        gpus.select(FOUND, "1,0,GPU-nope")
    message = refused.value.message
    assert message.startswith("AGENT_GPUS names 0, GPU-nope, which this node does not have; found: 0:0 (")
    assert "1 (NVIDIA A100-SXM4-80GB, 81920 MB, GPU-0cb1e29c" in message
    with pytest.raises(SettingError, match="found: none$"):
        gpus.select([], "0")


@pytest.mark.parametrize("raw, spec", [("auto", "auto"), (" AUTO ", "auto"), ("None", "none"),
                                       ("0, 1", "0,1"), ("0:1,GPU-ab-12", "0:1,GPU-ab-12"),
                                       ("MIG-GPU-0fd630f1/7/0", "MIG-GPU-0fd630f1/7/0"),
                                       ("/etc/corral/gpus.json", "/etc/corral/gpus.json")])
def test_the_spec_is_checked_for_its_form(raw, spec):
    assert gpus.check_spec(raw) == spec


@pytest.mark.parametrize("raw", ["all", "0,gpu0", "-1", "0:", "GPU-", "etc/gpus.json", ",,"])
def test_a_malformed_spec_is_refused_at_start(raw):
    with pytest.raises(SettingError, match="^AGENT_GPUS "):
        AgentSettings.from_env({"NODE_ID": "n1", "AGENT_GPUS": raw}, discover_gpus=no_discovery)


def no_discovery():
    raise AssertionError("discovery must not run")


def test_from_env_discovers_once_and_keeps_the_selection():
    calls = []
    settings = AgentSettings.from_env({"NODE_ID": "n1", "AGENT_GPUS": "1,2"},
                                      discover_gpus=lambda: calls.append(1) or list(FOUND))
    assert settings.gpus == (FOUND[2], FOUND[3]) and settings.gpus_spec == "1,2" and calls == [1]
    assert AgentSettings.from_env({"NODE_ID": "n1"}, discover_gpus=lambda: list(FOUND)).gpus == tuple(FOUND)
    with pytest.raises(SettingError, match="^AGENT_GPUS names 5, "):
        AgentSettings.from_env({"NODE_ID": "n1", "AGENT_GPUS": "5"}, discover_gpus=lambda: list(FOUND))


def test_none_and_a_file_do_not_discover(tmp_path):
    assert AgentSettings.from_env({"NODE_ID": "n1", "AGENT_GPUS": "none"}, discover_gpus=no_discovery).gpus == ()
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([{"index": "0", "uuid": "GPU-1", "model": "NVIDIA L4", "memory_mb": 23034}]))
    settings = AgentSettings.from_env({"NODE_ID": "n1", "AGENT_GPUS": str(path)}, discover_gpus=no_discovery)
    assert settings.gpus == (Gpu("0", "GPU-1", "NVIDIA L4", 23034, 0),)


def test_settings_built_directly_have_no_gpus_and_no_resources():
    settings = AgentSettings(node_id="n1")
    assert (settings.gpus, settings.resources, settings.gpus_spec) == ((), {}, "auto")


def test_a_file_declares_the_devices(tmp_path):
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([
        {"index": "0", "uuid": "GPU-aaaa", "model": "NVIDIA H100 80GB HBM3", "memory_mb": 81559},
        {"index": 1, "uuid": "GPU-bbbb", "model": "NVIDIA H100 80GB HBM3", "memory_mb": 81559, "minor": 4},
        {"index": "2:0", "uuid": "MIG-cccc", "model": "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "memory_mb": 9984},
    ]))
    assert gpus.select(FOUND, str(path)) == [
        Gpu("0", "GPU-aaaa", "NVIDIA H100 80GB HBM3", 81559, 0),
        Gpu("1", "GPU-bbbb", "NVIDIA H100 80GB HBM3", 81559, 4),
        Gpu("2:0", "MIG-cccc", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9984, None),
    ]
    path.write_text("[]")
    assert gpus.select(FOUND, str(path)) == []


GOOD = {"index": "0", "uuid": "GPU-aaaa", "model": "NVIDIA L4", "memory_mb": 23034}


@pytest.mark.parametrize("content, says", [
    ("not json", "the file is not JSON"),
    ('{"index": "0"}', "must hold a JSON list of devices, got dict"),
    ('["GPU-aaaa"]', "device 1: must be an object"),
    (json.dumps([GOOD, {"index": "1", "uuid": "GPU-b"}]), "device 2: missing model, memory_mb"),
    (json.dumps([{**GOOD, "memory": 1}]), "device 1: unknown key(s) memory"),
    (json.dumps([{**GOOD, "index": "gpu0"}]), 'device 1: "index" must be a GPU index'),
    (json.dumps([{**GOOD, "index": True}]), 'device 1: "index" must be a GPU index'),
    (json.dumps([{**GOOD, "uuid": "aaaa"}]), 'device 1: "uuid" must be a device UUID'),
    (json.dumps([{**GOOD, "model": ""}]), 'device 1: "model" must be a name'),
    (json.dumps([{**GOOD, "model": "x" * 129}]), 'device 1: "model" must be a name'),
    (json.dumps([{**GOOD, "memory_mb": -1}]), 'device 1: "memory_mb" must be a whole number'),
    (json.dumps([{**GOOD, "memory_mb": "23034"}]), 'device 1: "memory_mb" must be a whole number'),
    (json.dumps([{**GOOD, "memory_mb": 1.5}]), 'device 1: "memory_mb" must be a whole number'),
    (json.dumps([{**GOOD, "minor": -1}]), 'device 1: "minor" must be the /dev/nvidiaN number'),
    (json.dumps([GOOD, {**GOOD, "index": "1"}]), "more than one device has the uuid GPU-aaaa"),
    (json.dumps([GOOD, {**GOOD, "uuid": "GPU-b"}]), "more than one device has the index 0"),
])
def test_a_bad_file_is_one_clear_error(tmp_path, content, says):
    path = tmp_path / "gpus.json"
    path.write_text(content)
    with pytest.raises(SettingError) as refused:
        gpus.select([], str(path))
    assert refused.value.message.startswith(f"AGENT_GPUS={path}: ")
    assert says in refused.value.message


def test_a_missing_file_is_an_error(tmp_path):
    with pytest.raises(SettingError, match="cannot read the file"):
        gpus.select([], str(tmp_path / "absent.json"))


def test_more_devices_than_a_node_may_advertise_are_refused():
    many = [Gpu(str(i), f"GPU-{i}", A100, 81920, i) for i in range(gpus.MAX_NODE_GPUS + 1)]
    with pytest.raises(SettingError, match="more than the 256 a node may advertise"):
        gpus.resolve("auto", discover=lambda: many)
    assert gpus.resolve("auto", discover=lambda: many[:-1]) == many[:-1]


# --- labels ---------------------------------------------------------------------------


def test_labels_of_gpus_of_one_model():
    assert gpus.labels(FOUND[2:]) == {"gpu.count": "2", "gpu.model": A100, "gpu.memory_mb": "81920"}


def test_labels_of_mixed_models_leave_the_model_out_and_say_the_smallest_memory():
    assert gpus.labels(FOUND) == {"gpu.count": "4", "gpu.memory_mb": "9728"}
    assert gpus.labels([]) == {}


# --- AGENT_RESOURCES ------------------------------------------------------------------


def test_resources_are_read():
    assert parse_resources("fpga=2, scratch_gb=800,licence.matlab=0") == \
        {"fpga": 2, "scratch_gb": 800, "licence.matlab": 0}
    assert parse_resources("") == {} and parse_resources(" , ") == {}
    assert parse_resources("x=1000000000000") == {"x": 10 ** 12}
    assert len(parse_resources(",".join(f"r{i}=1" for i in range(32)))) == 32
    assert AgentSettings.from_env({"NODE_ID": "n1", "AGENT_RESOURCES": "fpga=2"},
                                  discover_gpus=lambda: []).resources == {"fpga": 2}


@pytest.mark.parametrize("raw, says", [
    ("fpga", "must look like name=N"),
    ("=2", "must look like name=N"),
    ("FPGA=2", "must look like name=N"),
    ("1fpga=2", "must look like name=N"),
    ("f" * 65 + "=2", "must look like name=N"),
    ("fpga=-1", "amounts must be whole numbers"),
    ("fpga=two", "amounts must be whole numbers"),
    ("fpga=1.5", "amounts must be whole numbers"),
    ("fpga=", "amounts must be whole numbers"),
    ("fpga=1000000000001", "amounts must be whole numbers"),
    ("fpga=²", "amounts must be whole numbers"),
    ("fpga=1,fpga=2", "declares 'fpga' twice"),
    ("gpus=2", "cannot declare 'gpus': GPUs are discovered"),
    ("memory_mb=2", "cannot declare 'memory_mb': jobs ask for memory with `memory_mb`"),
    ("cpu_percent=2", "cannot declare 'cpu_percent'"),
    ("slots=2", "cannot declare 'slots'"),
    ("jobs=2", "cannot declare 'jobs'"),
    (",".join(f"r{i}=1" for i in range(33)), "declares more than 32 resources"),
])
def test_a_bad_resource_is_one_error_naming_the_setting_and_the_entry(raw, says):
    with pytest.raises(SettingError) as refused:
        AgentSettings.from_env({"NODE_ID": "n1", "AGENT_RESOURCES": raw}, discover_gpus=no_discovery)
    message = refused.value.message
    assert message.startswith("AGENT_RESOURCES ") and says in message and "bad entry '" in message


# --- the registration -----------------------------------------------------------------


def node_info(**settings):
    membership = Membership(AgentSettings(node_id="n1", **settings), registry=None, scheduler=None,
                            jobs=JobTable(), end=lambda job, why: True, clock=lambda: 0.0,
                            default_limits=dict, limits_enforced=lambda: False)
    return membership.node_info()


def test_a_node_without_gpus_or_resources_sends_neither_key():
    info = node_info(labels={"zone": "a"})
    assert "gpus" not in info and "resources" not in info
    assert info["labels"] == {"zone": "a"}


def test_the_registration_advertises_gpus_resources_and_their_labels():
    info = node_info(gpus=tuple(FOUND[2:]), resources={"fpga": 2}, labels={"zone": "a", "gpu.model": "A100"})
    assert info["gpus"] == [
        {"index": "1", "uuid": "GPU-0cb1e29c-658c-4a14-95e6-0af593bd04cf", "model": A100, "memory_mb": 81920},
        {"index": "2", "uuid": "GPU-9531985d-5d9d-49f8-9818-e811892f902b", "model": A100, "memory_mb": 81920},
    ]
    assert info["resources"] == {"fpga": 2}
    # The operator's label wins over the derived one.
    assert info["labels"] == {"gpu.count": "2", "gpu.memory_mb": "81920", "gpu.model": "A100", "zone": "a"}


def test_mig_instances_are_advertised_without_their_parent_or_minor():
    assert node_info(gpus=tuple(NVML_FOUND[:1]))["gpus"] == [
        {"index": "0:0", "uuid": "MIG-8e81973e-0bec-47b0-b898-d190f9ebdacc", "model": f"{A100} MIG 3g.40gb",
         "memory_mb": 40192}]


def test_the_registry_takes_the_registration_with_and_without_them():
    bare = NodeRegistration.model_validate(node_info())
    assert (bare.gpus, bare.resources) == (None, None)
    full = NodeRegistration.model_validate(node_info(gpus=tuple(FOUND), resources={"fpga": 2, "licence.matlab": 4}))
    assert [gpu.model_dump() for gpu in full.gpus] == [gpu.advertised() for gpu in FOUND]
    assert full.resources == {"fpga": 2, "licence.matlab": 4}

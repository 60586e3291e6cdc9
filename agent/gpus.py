"""The node's NVIDIA GPUs: found once at start, chosen by AGENT_GPUS, advertised at registration.

Discovery asks NVML first, through NVIDIA's own bindings (`pynvml`, the optional extra
`corral[gpu]`), else `nvidia-smi`, else finds nothing: a node without the driver, or
whose driver does not answer, is a node without GPUs, never an agent that fails to
start. A GPU in MIG mode is advertised as its MIG instances, each a device of its own
(that is what a job can be given: CUDA_VISIBLE_DEVICES takes an instance's UUID), and
not as the whole GPU, which no job can use while it is partitioned.

Every source is a parameter (the NVML module, the command runner, the file reader), so
the tests run discovery against recorded answers behind the same interface. Parsing is
pure; only `discover` and the defaults it is given do I/O.
"""
from __future__ import annotations

import csv
import io
import json
import logging
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.shared.errors import SettingError
from corral.shared.limits import (GPU_INDEX_PATTERN, GPU_UUID_PATTERN, MAX_GPU_MEMORY_MB, MAX_GPU_MODEL_CHARS,
                                  MAX_NODE_GPUS)

log = logging.getLogger(__name__)

MiB = 1024 * 1024
SETTING = "AGENT_GPUS"
AUTO, NONE = "auto", "none"
# A device's index as nvidia-smi numbers it: "0", or "0:1" for MIG instance 1 of GPU 0.
# The forms and bounds below are those the registry takes (registry/contract.py: Gpu):
# a device it would refuse is refused here, at start, rather than at every registration.
INDEX_RE = re.compile(GPU_INDEX_PATTERN)
# NVIDIA's UUIDs: GPU-<uuid>, MIG-<uuid>, or the drivers before R470's MIG-GPU-<uuid>/<gi>/<ci>.
UUID_RE = re.compile(GPU_UUID_PATTERN)
MAX_MODEL_CHARS = MAX_GPU_MODEL_CHARS

SMI_TIMEOUT_SECS = 10.0
SMI_QUERY = ("nvidia-smi", "--query-gpu=index,uuid,name,memory.total,pci.bus_id",
             "--format=csv,noheader,nounits")
SMI_LIST = ("nvidia-smi", "-L")
PROC_INFORMATION = "/proc/driver/nvidia/gpus/{bus_id}/information"

# `nvidia-smi -L`: a GPU, then its MIG instances indented below it.
_LIST_GPU_RE = re.compile(r"^GPU\s+(\d+):\s+(.+?)\s+\(UUID:\s+(GPU-[^)\s]+)\)\s*$")
_LIST_MIG_RE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s+(MIG-[^)\s]+)\)\s*$")
_PROFILE_GB_RE = re.compile(r"(\d+)gb", re.IGNORECASE)
_MINOR_RE = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)
_DECLARED_KEYS = frozenset({"index", "uuid", "model", "memory_mb", "minor"})


@dataclass(frozen=True)
class Gpu:
    """One device a job can be given: a whole GPU, or one MIG instance of a GPU."""

    index: str               # "0", or "0:1" for MIG instance 1 of GPU 0
    uuid: str                # "GPU-…" or "MIG-…": what CUDA_VISIBLE_DEVICES takes
    model: str               # "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    memory_mb: int
    minor: int | None = None  # /dev/nvidiaN: a MIG instance has its parent's
    parent_uuid: str | None = None  # MIG instances only

    def advertised(self) -> dict[str, Any]:
        """The wire form in the registration: what placement needs, not the device node."""
        return {"index": self.index, "uuid": self.uuid, "model": self.model, "memory_mb": self.memory_mb}


Run = Callable[..., "subprocess.CompletedProcess[str]"]
ReadFile = Callable[[str], str]


def read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


# --- discovery ------------------------------------------------------------------------


def discover(nvml: Any = None, run: Run = subprocess.run, read_file: ReadFile = read_text) -> list[Gpu]:
    """The node's GPUs, MIG instances in place of their GPU: by NVML, else nvidia-smi,
    else none. `nvml`: a module with pynvml's names (None: import pynvml, if installed)."""
    found = _from_nvml(nvml if nvml is not None else import_nvml())
    source = "NVML"
    if found is None:
        found, source = _from_nvidia_smi(run, read_file), "nvidia-smi"
    if found:
        log.info("GPUs found by %s: %s", source, describe(found))
    else:
        log.debug("no NVIDIA GPUs found on this node")
    return found


def describe(gpus: Iterable[Gpu]) -> str:
    return ", ".join(f"{g.index} ({g.model}, {g.memory_mb} MB, {g.uuid})" for g in gpus) or "none"


def import_nvml() -> Any:
    try:
        import pynvml
    except ImportError:
        log.debug("pynvml is not installed (the corral[gpu] extra); asking nvidia-smi")
        return None
    return pynvml


def _from_nvml(nvml: Any) -> list[Gpu] | None:
    """The devices NVML lists; None when NVML cannot be used here (no bindings, no
    driver), so that nvidia-smi is asked instead."""
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        log.debug("NVML is not available (%s); asking nvidia-smi", exc)
        return None
    try:
        found: list[Gpu] = []
        for i in range(nvml.nvmlDeviceGetCount()):
            try:
                found += _nvml_device(nvml, i)
            except nvml.NVMLError as exc:
                # A GPU the driver cannot read (fallen off the bus) is one no job can use.
                log.warning("GPU %d: NVML cannot read it (%s); it is not advertised", i, exc)
        return found
    except nvml.NVMLError as exc:
        log.info("NVML could not list the GPUs (%s); asking nvidia-smi", exc)
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _nvml_device(nvml: Any, i: int) -> list[Gpu]:
    """GPU `i`, or its MIG instances when it is in MIG mode."""
    handle = nvml.nvmlDeviceGetHandleByIndex(i)
    gpu = Gpu(index=str(i), uuid=_text(nvml.nvmlDeviceGetUUID(handle)), model=_text(nvml.nvmlDeviceGetName(handle)),
              memory_mb=nvml.nvmlDeviceGetMemoryInfo(handle).total // MiB,
              minor=nvml.nvmlDeviceGetMinorNumber(handle))
    if not _mig_enabled(nvml, handle):
        return [gpu]
    not_found = getattr(nvml, "NVMLError_NotFound", nvml.NVMLError)
    instances: list[Gpu] = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except not_found:
            continue  # an empty slot: instances need not be numbered contiguously
        # Numbered as nvidia-smi -L numbers them, whichever source answers.
        instances.append(Gpu(index=f"{i}:{len(instances)}", uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                             model=_mig_model(gpu.model, _text(nvml.nvmlDeviceGetName(mig))),
                             memory_mb=nvml.nvmlDeviceGetMemoryInfo(mig).total // MiB,
                             minor=gpu.minor, parent_uuid=gpu.uuid))
    if not instances:
        log.info("GPU %d (%s) is in MIG mode without MIG instances: nothing of it can be given to jobs", i, gpu.uuid)
    return instances


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    try:
        current = nvml.nvmlDeviceGetMigMode(handle)[0]
    except nvml.NVMLError:
        return False  # NotSupported: a GPU without MIG
    except AttributeError:
        return False  # bindings older than MIG
    return bool(current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))


def _mig_model(parent_model: str, name: str) -> str:
    """Current drivers name an instance "<GPU> MIG <profile>"; some older ones only the profile."""
    if " MIG " in name:
        return name
    return f"{parent_model} MIG {name.removeprefix('MIG').strip()}"


def _text(value: str | bytes) -> str:
    """Bindings before 11.515 answer bytes."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _from_nvidia_smi(run: Run, read_file: ReadFile) -> list[Gpu]:
    answer = _smi(run, SMI_QUERY)
    if answer is None:
        return []
    gpus = [_with_minor(gpu, bus_id, read_file) for gpu, bus_id in parse_query(answer)]
    listing = _smi(run, SMI_LIST) if gpus else None
    return with_mig(gpus, parse_mig_list(listing)) if listing is not None else gpus


def _smi(run: Run, command: Sequence[str]) -> str | None:
    """nvidia-smi's answer, or None (logged) when it is not there or does not answer."""
    try:
        done = run(list(command), capture_output=True, text=True, timeout=SMI_TIMEOUT_SECS, check=False)
    except FileNotFoundError:
        log.debug("nvidia-smi is not installed: no NVIDIA GPUs")
        return None
    except subprocess.TimeoutExpired:
        log.info("`%s` did not answer within %.0fs; taking it as no GPUs", " ".join(command), SMI_TIMEOUT_SECS)
        return None
    except OSError as exc:
        log.info("`%s` could not run (%s); taking it as no GPUs", " ".join(command), exc)
        return None
    if done.returncode != 0:
        said = (done.stderr or done.stdout or "").strip().splitlines()
        log.info("`%s` exited %d (%s); taking it as no GPUs", " ".join(command), done.returncode,
                 said[-1] if said else "no message")
        return None
    return str(done.stdout)


def parse_query(text: str) -> list[tuple[Gpu, str]]:
    """The rows of SMI_QUERY's CSV: each GPU (its minor number not known yet) with its
    PCI bus id. A row that cannot be read (a field "[N/A]") is left out, and logged."""
    found = []
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not row:
            continue
        fields = [field.strip() for field in row]
        if len(fields) != 5 or not fields[0].isdigit() or not fields[3].isdigit() or not fields[1]:
            log.info("nvidia-smi: cannot read the GPU row %r; it is not advertised", ", ".join(row))
            continue
        index, uuid, name, memory, bus_id = fields
        found.append((Gpu(index=index, uuid=uuid, model=name, memory_mb=int(memory)), bus_id))
    return found


def _with_minor(gpu: Gpu, bus_id: str, read_file: ReadFile) -> Gpu:
    minor = minor_number(bus_id, read_file)
    return Gpu(gpu.index, gpu.uuid, gpu.model, gpu.memory_mb, int(gpu.index) if minor is None else minor)


def proc_paths(bus_id: str) -> list[str]:
    """Where the driver describes the GPU at `bus_id`. nvidia-smi writes the PCI domain
    with 8 hex digits in capitals (00000000:07:00.0), the driver's directory with 4 in
    lower case (0000:07:00.0): both are tried."""
    lowered = bus_id.strip().lower()
    domain, sep, rest = lowered.partition(":")
    forms = [f"{domain[-4:]:0>4}:{rest}"] if sep and len(domain) > 4 else []
    forms.append(lowered)
    return [PROC_INFORMATION.format(bus_id=form) for form in dict.fromkeys(forms)]


def minor_number(bus_id: str, read_file: ReadFile) -> int | None:
    """/dev/nvidiaN's N for the GPU at `bus_id` (its "Device Minor:"), None when unknown.
    It is not always the index: the index follows the PCI order, the minor the driver's."""
    for path in proc_paths(bus_id):
        try:
            found = _MINOR_RE.search(read_file(path))
        except OSError:
            continue
        if found:
            return int(found.group(1))
    return None


def parse_mig_list(text: str) -> dict[str, list[tuple[int, str, str]]]:
    """`nvidia-smi -L`: {parent GPU uuid: [(MIG device number, profile, MIG uuid)]},
    GPUs without MIG instances left out."""
    found: dict[str, list[tuple[int, str, str]]] = {}
    parent: str | None = None
    for line in text.splitlines():
        gpu = _LIST_GPU_RE.match(line)
        if gpu:
            parent = gpu.group(3)
            continue
        mig = _LIST_MIG_RE.match(line)
        if mig and parent is not None:
            found.setdefault(parent, []).append((int(mig.group(2)), mig.group(1), mig.group(3)))
    return found


def profile_memory_mb(profile: str) -> int:
    """A MIG profile's memory: 1g.10gb -> 10240; 0 for a name without one."""
    found = _PROFILE_GB_RE.search(profile)
    return int(found.group(1)) * 1024 if found else 0


def with_mig(gpus: Sequence[Gpu], migs: Mapping[str, Sequence[tuple[int, str, str]]]) -> list[Gpu]:
    """Each GPU with MIG instances replaced by them, in order."""
    found: list[Gpu] = []
    for gpu in gpus:
        instances = migs.get(gpu.uuid)
        if not instances:
            found.append(gpu)
            continue
        found += [Gpu(index=f"{gpu.index}:{number}", uuid=uuid, model=f"{gpu.model} MIG {profile}",
                      memory_mb=profile_memory_mb(profile), minor=gpu.minor, parent_uuid=gpu.uuid)
                  for number, profile, uuid in instances]
    return found


# --- AGENT_GPUS -----------------------------------------------------------------------


def check_spec(value: str) -> str:
    """AGENT_GPUS checked for its form (what it names is checked against what is found,
    in `select`): `auto`, `none`, a path starting with `/`, or indexes and UUIDs,
    comma-separated. Returns it normalized."""
    value = value.strip()
    if value.lower() in (AUTO, NONE):
        return value.lower()
    if value.startswith("/"):
        return value
    ids = [part.strip() for part in value.split(",") if part.strip()]
    for device in ids:
        if not INDEX_RE.match(device) and not UUID_RE.match(device):
            raise SettingError(f"{SETTING} must be auto, none, a JSON file's absolute path, or GPU indexes "
                               f"(0, 0:1) and UUIDs (GPU-…, MIG-…), comma-separated; bad entry {device!r}")
    if not ids:
        raise SettingError(f"{SETTING} names no GPU; use none for no GPUs, auto for all of them")
    return ",".join(ids)


def needs_discovery(spec: str) -> bool:
    """`none` and a file declare the devices without asking the node."""
    return spec != NONE and not spec.startswith("/")


def resolve(spec: str, discover: Callable[[], list[Gpu]] = discover,
            read_file: ReadFile = read_text) -> list[Gpu]:
    """The GPUs this node advertises for AGENT_GPUS (checked by check_spec), discovering
    them only when the spec needs it."""
    chosen = select(discover() if needs_discovery(spec) else [], spec, read_file)
    if len(chosen) > MAX_NODE_GPUS:
        raise SettingError(f"{SETTING}: {len(chosen)} devices are more than the {MAX_NODE_GPUS} a node may "
                           f"advertise; name those to advertise")
    return chosen


def select(found: Sequence[Gpu], spec: str, read_file: ReadFile = read_text) -> list[Gpu]:
    """What AGENT_GPUS keeps of the GPUs found: `auto` all, `none` none, a list of
    indexes and UUIDs those (in the order found; one not found is a SettingError), a
    path the devices its JSON declares instead."""
    if spec == AUTO:
        return list(found)
    if spec == NONE:
        return []
    if spec.startswith("/"):
        return from_file(spec, read_file)
    by_id = {gpu.index: gpu for gpu in found} | {gpu.uuid: gpu for gpu in found}
    wanted = [part.strip() for part in spec.split(",") if part.strip()]
    missing = [device for device in wanted if device not in by_id]
    if missing:
        raise SettingError(f"{SETTING} names {', '.join(missing)}, which this node does not have; "
                           f"found: {describe(found)}")
    chosen = {by_id[device].uuid for device in wanted}
    return [gpu for gpu in found if gpu.uuid in chosen]


def from_file(path: str, read_file: ReadFile = read_text) -> list[Gpu]:
    """The devices a JSON file declares: a list of {"index", "uuid", "model",
    "memory_mb", "minor"?}, for a node where discovery cannot run."""
    where = f"{SETTING}={path}"
    try:
        text = read_file(path)
    except OSError as exc:
        raise SettingError(f"{where}: cannot read the file ({exc.strerror or exc})") from None
    try:
        declared = json.loads(text)
    except ValueError as exc:
        raise SettingError(f"{where}: the file is not JSON ({exc})") from None
    if not isinstance(declared, list):
        raise SettingError(f"{where}: the file must hold a JSON list of devices, got {type(declared).__name__}")
    gpus = [_declared(where, n, entry) for n, entry in enumerate(declared, 1)]
    for key in ("index", "uuid"):
        seen = [getattr(gpu, key) for gpu in gpus]
        twice = sorted({value for value in seen if seen.count(value) > 1})
        if twice:
            raise SettingError(f"{where}: more than one device has the {key} {', '.join(twice)}")
    return gpus


def _declared(where: str, n: int, entry: object) -> Gpu:
    def bad(why: str) -> SettingError:
        return SettingError(f"{where}: device {n}: {why}")

    if not isinstance(entry, dict):
        raise bad('must be an object with "index", "uuid", "model" and "memory_mb"')
    unknown = sorted(set(entry) - _DECLARED_KEYS)
    if unknown:
        raise bad(f"unknown key(s) {', '.join(unknown)} (known: index, uuid, model, memory_mb, minor)")
    missing = [key for key in ("index", "uuid", "model", "memory_mb") if key not in entry]
    if missing:
        raise bad(f"missing {', '.join(missing)}")
    index = str(entry["index"]) if isinstance(entry["index"], int) and not isinstance(entry["index"], bool) \
        else entry["index"]
    if not isinstance(index, str) or not INDEX_RE.match(index):
        raise bad(f'"index" must be a GPU index such as "0" or "0:1" (MIG), got {entry["index"]!r}')
    uuid, model = entry["uuid"], entry["model"]
    if not isinstance(uuid, str) or not UUID_RE.match(uuid):
        raise bad(f'"uuid" must be a device UUID (GPU-…, MIG-…), got {uuid!r}')
    if not isinstance(model, str) or not model.strip() or len(model) > MAX_MODEL_CHARS or not model.isprintable():
        raise bad(f'"model" must be a name of 1-{MAX_MODEL_CHARS} printable characters, got {model!r}')
    memory_mb = entry["memory_mb"]
    if not _whole(memory_mb, MAX_GPU_MEMORY_MB):
        raise bad(f'"memory_mb" must be a whole number 0-{MAX_GPU_MEMORY_MB}, got {memory_mb!r}')
    minor = entry.get("minor", int(index) if index.isdigit() else None)
    if minor is not None and not _whole(minor, 1_000_000):
        raise bad(f'"minor" must be the /dev/nvidiaN number, got {minor!r}')
    return Gpu(index=index, uuid=uuid, model=model.strip(), memory_mb=memory_mb, minor=minor)


def _whole(value: object, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


# --- what placement reads ---------------------------------------------------------------


def labels(gpus: Sequence[Gpu]) -> dict[str, str]:
    """Labels jobs' constraints can name: how many devices, their model when they all
    share one, and the smallest memory (what any one device is sure to have)."""
    if not gpus:
        return {}
    derived = {"gpu.count": str(len(gpus)), "gpu.memory_mb": str(min(gpu.memory_mb for gpu in gpus))}
    models = {gpu.model for gpu in gpus}
    if len(models) == 1:
        derived["gpu.model"] = models.pop()
    return derived

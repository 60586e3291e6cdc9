"""scripts/gpu_check.sh and scripts/gpu_check.py without a GPU: the wrapper's syntax, the
checker's pure helpers (nvidia-smi's device list, what a probe job prints, whether two
jobs overlapped, the per-job and per-team GPU figures, the summary), and that on a
machine without nvidia-smi, without a working driver or without PyTorch both stop at
once with exit status 2 and say why, starting nothing. The checks themselves need a
machine with NVIDIA GPUs (docs/agent.md, "Checking a GPU node")."""
import datetime
import os
import shlex
import shutil
import subprocess
import sys

import pytest

import gpu_check
from paths import REPO

SCRIPT_SH = os.path.join(REPO, "scripts", "gpu_check.sh")
SCRIPT_PY = os.path.join(REPO, "scripts", "gpu_check.py")
BASH = shutil.which("bash") or "/bin/bash"

UUID_0 = "GPU-5fd4c4a2-0e3b-8d7a-1c2f-3b4a5c6d7e8f"
UUID_1 = "GPU-9a8b7c6d-5e4f-3a2b-1c0d-ef0123456789"
MIG_0 = "MIG-11111111-2222-3333-4444-555555555555"
MIG_1 = "MIG-66666666-7777-8888-9999-000000000000"


def fake(directory, name: str, body: str) -> str:
    """An executable shell script `name` in `directory`."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body + "\n")
    os.chmod(path, 0o755)
    return path


# ---- the wrapper -------------------------------------------------------------------

def test_the_wrapper_is_valid_bash():
    done = subprocess.run([BASH, "-n", SCRIPT_SH], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_without_nvidia_smi_the_wrapper_exits_2_and_starts_nothing(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    done = subprocess.run([BASH, SCRIPT_SH], env={"PATH": str(empty), "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert done.returncode == 2, done
    assert "nvidia-smi is not in PATH" in done.stderr and "nothing was started" in done.stderr
    assert done.stdout == ""  # no venv made, nothing installed, no cluster
    assert os.listdir(tmp_path) == ["bin"]


# ---- the checker refusing a machine ------------------------------------------------

def run_checker(tmp_path, path: str, *args: str) -> subprocess.CompletedProcess:
    """The checker with only `path` to find programs in and its temporary files under tmp_path/tmp."""
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    env = {"PATH": path, "HOME": str(tmp_path), "TMPDIR": str(temp)}
    return subprocess.run([sys.executable, SCRIPT_PY, *args], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)


def assert_refused(done: subprocess.CompletedProcess, tmp_path, *said: str) -> None:
    assert done.returncode == gpu_check.EXIT_CANNOT_RUN == 2, done
    for words in said:
        assert words in done.stdout, done.stdout
    assert "starting a registry" not in done.stdout
    assert os.listdir(tmp_path / "tmp") == []  # no state dir


@pytest.mark.slow
def test_without_nvidia_smi_the_checker_exits_2(tmp_path):
    (tmp_path / "bin").mkdir()
    done = run_checker(tmp_path, str(tmp_path / "bin"))
    assert_refused(done, tmp_path, "error: nvidia-smi is not in PATH")


@pytest.mark.slow
def test_a_failing_nvidia_smi_is_a_machine_without_a_driver(tmp_path):
    fake(tmp_path / "bin", "nvidia-smi", "echo \"NVIDIA-SMI has failed because it couldn't communicate with the "
                                         "NVIDIA driver.\"; exit 9")
    done = run_checker(tmp_path, str(tmp_path / "bin"))
    assert_refused(done, tmp_path, "`nvidia-smi -L` exited 9", "couldn't communicate", "driver loaded?")


@pytest.mark.slow
def test_no_gpu_listed_is_refused(tmp_path):
    fake(tmp_path / "bin", "nvidia-smi", "echo 'some warning'")
    done = run_checker(tmp_path, str(tmp_path / "bin"), "--skip-torch")
    assert_refused(done, tmp_path, "lists no usable GPU", "some warning")


@pytest.mark.slow
def test_without_pytorch_the_checker_exits_2_unless_told_to_skip_it(tmp_path):
    fake(tmp_path / "bin", "nvidia-smi", f"echo 'GPU 0: NVIDIA L4 (UUID: {UUID_0})'")
    python = fake(tmp_path / "py", "python", "echo \"ModuleNotFoundError: No module named 'torch'\" >&2; exit 1")
    done = run_checker(tmp_path, f"{tmp_path / 'bin'}:/usr/bin:/bin", "--job-python", python)
    assert_refused(done, tmp_path, "cannot import torch", "No module named 'torch'", "--skip-torch")

    cpu_only = fake(tmp_path / "py", "python-cpu", "echo '2.5.0 None False'; echo /site/torch/__init__.py")
    done = run_checker(tmp_path, f"{tmp_path / 'bin'}:/usr/bin:/bin", "--job-python", cpu_only)
    assert_refused(done, tmp_path, "PyTorch here cannot use CUDA", "2.5.0 None False")


# ---- nvidia-smi -L -----------------------------------------------------------------

def test_nvidia_smi_list_gives_each_gpu():
    text = (f"GPU 0: NVIDIA L4 (UUID: {UUID_0})\n"
            f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {UUID_1})\n")
    assert gpu_check.parse_smi_list(text) == [gpu_check.Device("0", UUID_0, "NVIDIA L4"),
                                              gpu_check.Device("1", UUID_1, "NVIDIA H100 80GB HBM3")]


def test_a_gpu_in_mig_mode_counts_as_its_instances():
    text = (f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {UUID_0})\n"
            f"  MIG 1g.10gb     Device  0: (UUID: {MIG_0})\n"
            f"  MIG 3g.40gb     Device  1: (UUID: {MIG_1})\n"
            f"GPU 1: NVIDIA A100-SXM4-80GB (UUID: {UUID_1})\n")
    assert gpu_check.parse_smi_list(text) == [
        gpu_check.Device("0:0", MIG_0, "NVIDIA A100-SXM4-80GB MIG 1g.10gb"),
        gpu_check.Device("0:1", MIG_1, "NVIDIA A100-SXM4-80GB MIG 3g.40gb"),
        gpu_check.Device("1", UUID_1, "NVIDIA A100-SXM4-80GB")]


@pytest.mark.parametrize("text", ["", "No devices were found\n", "sh: 1: nvidia-smi: not found\n",
                                  "  MIG 1g.10gb     Device  0: (UUID: MIG-1)\n"])
def test_no_device_in_other_output(text):
    assert gpu_check.parse_smi_list(text) == []


# ---- what a probe job prints ----------------------------------------------------------

@pytest.mark.slow
def test_a_probe_job_reports_its_environment_nvidia_smi_and_pytorch(tmp_path):
    """The probe's shell command, run here by /bin/sh as a job's would be, against a fake
    nvidia-smi that lists what CUDA_VISIBLE_DEVICES names; the Python given has no torch."""
    bin_dir = tmp_path / "bin"
    fake(bin_dir, "nvidia-smi", '[ -n "$CUDA_VISIBLE_DEVICES" ] || { echo "No devices were found"; exit 6; }\n'
                                'echo "GPU 0: NVIDIA L4 (UUID: $CUDA_VISIBLE_DEVICES)"')
    command = gpu_check.probe_command(sys.executable, sleep_secs=0)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": UUID_0, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    done = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    probe = gpu_check.parse_probe(done.stdout)
    assert probe.devices == [gpu_check.Device("0", UUID_0, "NVIDIA L4")] and probe.smi_rc == 0
    assert probe.values["CUDA_VISIBLE_DEVICES"] == UUID_0
    assert probe.values["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert probe.values["NVIDIA_VISIBLE_DEVICES"] == "(unset)"
    assert probe.values["torch_device_count"] in ("error", "0")  # "error": no torch in this Python

    env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run(["/bin/sh", "-c", gpu_check.probe_command(None, 0)], env=env, capture_output=True,
                          text=True, timeout=60)
    probe = gpu_check.parse_probe(done.stdout)
    assert probe.devices == [] and probe.smi_rc == 6 and probe.smi_output == "No devices were found"
    assert "torch_device_count" not in probe.values


def test_parse_probe_reads_counts_and_tolerates_nothing():
    probe = gpu_check.parse_probe("CUDA_VISIBLE_DEVICES=\nsmi| No devices were found\nsmi_rc=6\n"
                                  "torch_device_count=0\n")
    assert (probe.values["CUDA_VISIBLE_DEVICES"], probe.smi_rc, probe.torch_count) == ("", 6, 0)
    empty = gpu_check.parse_probe(None)
    assert (empty.values, empty.smi_output, empty.smi_rc, empty.torch_count, empty.devices) == ({}, "", None,
                                                                                               None, [])


def test_the_matmul_job_is_one_python_command():
    argv = shlex.split(gpu_check.matmul_command("/opt/py env/bin/python", 10, n=4096))
    assert argv == ["/opt/py env/bin/python", "-c", gpu_check.MATMUL_CODE, "10", "4096"]
    compile(gpu_check.MATMUL_CODE, "matmul", "exec")
    assert gpu_check.key_values("device=NVIDIA L4\nproducts=80\ntflops=21.5\nnoise\n") == {
        "device": "NVIDIA L4", "products": "80", "tflops": "21.5"}


# ---- one job after the other ---------------------------------------------------------

def job(job_id: str, running_at: str | None, finished_at: str | None) -> dict:
    return {"job_id": job_id, "running_at": running_at, "finished_at": finished_at}


def test_jobs_overlap_when_their_running_intervals_do():
    first = job("job-1", "2026-12-07T10:00:00.000Z", "2026-12-07T10:00:04.000Z")
    # The report that ends one job carries the claim of the next: the same instant.
    after = job("job-2", "2026-12-07T10:00:04.000Z", "2026-12-07T10:00:08.000Z")
    during = job("job-3", "2026-12-07T10:00:03.999Z", "2026-12-07T10:00:08.000Z")
    inside = job("job-4", "2026-12-07T10:00:01.000Z", "2026-12-07T10:00:02.000Z")
    assert not gpu_check.jobs_overlap(first, after) and not gpu_check.jobs_overlap(after, first)
    assert gpu_check.jobs_overlap(first, during) and gpu_check.jobs_overlap(during, first)
    assert gpu_check.jobs_overlap(first, inside) and gpu_check.jobs_overlap(inside, first)
    assert gpu_check.running_interval(first) == (gpu_check.parse_time("2026-12-07T10:00:00+00:00"),
                                                 gpu_check.parse_time("2026-12-07T10:00:04Z"))


def test_a_job_that_did_not_run_has_no_interval():
    with pytest.raises(ValueError, match="job-9 has no running_at/finished_at"):
        gpu_check.jobs_overlap(job("job-1", "2026-12-07T10:00:00Z", "2026-12-07T10:00:04Z"),
                               job("job-9", None, None))


# ---- GPU figures -------------------------------------------------------------------

def test_per_job_gpu_fields_are_not_reported_yet_when_absent():
    ok, said = gpu_check.job_gpu_fields({"job_id": "job-1", "status": "done"})
    assert ok and said == ["gpu_seconds: not reported yet", "gpu_utilization_percent: not reported yet"]
    ok, said = gpu_check.job_gpu_fields({"gpu_seconds": None})
    assert ok and said[0] == "gpu_seconds: not reported yet"


def test_per_job_gpu_fields_must_not_be_zero_when_present():
    assert gpu_check.job_gpu_fields({"gpu_seconds": 10.2, "gpu_utilization_percent": 97}) == (
        True, ["gpu_seconds: 10.2", "gpu_utilization_percent: 97"])
    ok, said = gpu_check.job_gpu_fields({"gpu_seconds": 10.2, "gpu_utilization_percent": 0})
    assert not ok and said[1] == "gpu_utilization_percent: 0 (must be above zero)"
    ok, said = gpu_check.job_gpu_fields({"gpu_seconds": 0.0})
    assert not ok and said[0] == "gpu_seconds: 0.0 (must be above zero)"
    # A job that only holds its GPU (`sleep`) may leave it idle.
    assert gpu_check.job_gpu_fields({"gpu_seconds": 4.1, "gpu_utilization_percent": 0},
                                    must_be_positive=("gpu_seconds",))[0]


def test_team_gpu_seconds_from_usage_by_team():
    usage = {"group_by": "team", "rows": [{"group": "default", "gpu_seconds": 12.5, "cpu_seconds": 3.0},
                                          {"group": "ml", "gpu_seconds": 7.0}]}
    assert gpu_check.team_gpu_seconds(usage, "default") == 12.5
    assert gpu_check.team_gpu_seconds(usage, "nobody") == 0
    assert gpu_check.team_gpu_seconds({"rows": []}, "default") == 0


# ---- the summary -------------------------------------------------------------------

def test_the_summary_is_markdown_with_the_machine_and_each_check_in_order():
    machine = ("name, driver_version, memory.total [MiB]\n"
               "NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB\n")
    results = [gpu_check.Result(2, "a gpus: 1 job sees one GPU", "FAIL", "listed 2 | not 1\nsee log"),
               gpu_check.Result(1, "discovery", "PASS", "1 GPU(s)")]
    when = datetime.datetime(2026, 12, 7, 10, 30, tzinfo=datetime.timezone.utc)
    text = gpu_check.summary(machine, when, results, ["commit abc1234", "as root"])
    assert text.splitlines() == [
        "GPU check, 2026-12-07 10:30 UTC, commit abc1234, as root:",
        "",
        "```",
        "name, driver_version, memory.total [MiB]",
        "NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB",
        "```",
        "",
        "| check | result | detail |",
        "|---|---|---|",
        "| 1. discovery | PASS | 1 GPU(s) |",
        "| 2. a gpus: 1 job sees one GPU | FAIL | listed 2 \\| not 1 see log |",
        "",
        "1 of 2 checks passed, 1 failed.",
    ]


# ---- what a job under a uid of its own can reach ------------------------------------------

def test_blocked_parent_names_the_first_directory_others_cannot_search(state_dir):
    inner = os.path.join(state_dir, "home", "venv", "bin")
    os.makedirs(inner)
    python = os.path.join(inner, "python")
    open(python, "w").close()
    os.chmod(os.path.join(state_dir, "home"), 0o755)
    assert gpu_check.blocked_parent(python) is None
    os.chmod(os.path.join(state_dir, "home"), 0o750)
    assert gpu_check.blocked_parent(python) == os.path.join(os.path.realpath(state_dir), "home")


# ---- what checks 2 and 4 make of a probe ---------------------------------------------

def probe_of(visible: str | None, *listed: str, rc: int = 0, torch: str | None = None) -> gpu_check.Probe:
    lines = [f"CUDA_VISIBLE_DEVICES={'(unset)' if visible is None else visible}", "CUDA_DEVICE_ORDER=PCI_BUS_ID",
             "NVIDIA_VISIBLE_DEVICES=" + (visible or "void")]
    lines += [f"smi| GPU {n}: NVIDIA L4 (UUID: {uuid})" for n, uuid in enumerate(listed)] or [
        "smi| No devices were found"]
    lines.append(f"smi_rc={rc if listed else 6}")
    if torch is not None:
        lines.append(f"torch_device_count={torch}")
    return gpu_check.parse_probe("\n".join(lines))


def test_check_2_passes_a_job_that_sees_its_gpu_alone():
    problems, notes = gpu_check.one_gpu_verdict(probe_of(UUID_1, UUID_1, torch="1"), [UUID_1], "job-1", "job-1",
                                                isolated=True, torch=True)
    assert problems == []
    assert notes[:2] == [f"nvidia-smi -L lists only {UUID_1}, its gpus_assigned", "PyTorch counts 1"]


def test_check_2_fails_a_job_that_can_open_other_gpus_or_sees_another():
    problems, _ = gpu_check.one_gpu_verdict(probe_of(UUID_1, UUID_0, UUID_1, torch="1"), [UUID_1], "job-1", "job-1",
                                            isolated=True, torch=True)
    assert problems == [f"nvidia-smi -L in the job listed 2 device(s) [{UUID_0}, {UUID_1}] (exit 0), not one "
                        f"{gpu_check.SMI_LISTS_ALL}"]
    problems, _ = gpu_check.one_gpu_verdict(probe_of(UUID_0, UUID_0, torch="2"), [UUID_1], "job-2", "job-1",
                                            isolated=True, torch=True)
    assert problems == [f"the job sees {UUID_0}, its gpus_assigned is {UUID_1}",
                        f"CUDA_VISIBLE_DEVICES is '{UUID_0}', not its gpus_assigned {UUID_1}",
                        f"GET /nodes showed {UUID_1} held by job-2, not job-1",
                        "PyTorch counted 2 device(s), not 1"]
    problems, _ = gpu_check.one_gpu_verdict(probe_of(None), [], None, "job-1", isolated=True, torch=False)
    assert problems == ["gpus_assigned was None while it ran, not one UUID"]


def test_check_2_without_device_isolation_goes_by_cuda_visible_devices():
    problems, notes = gpu_check.one_gpu_verdict(probe_of(UUID_1, UUID_0, UUID_1), [UUID_1], "job-1", "job-1",
                                                isolated=False, torch=False)
    assert problems == [] and "no device isolation without root" in notes[0] and "PyTorch check skipped" in notes
    problems, _ = gpu_check.one_gpu_verdict(probe_of(None, UUID_0, UUID_1), [UUID_1], "job-1", "job-1",
                                            isolated=False, torch=False)
    assert problems == [f"CUDA_VISIBLE_DEVICES is '(unset)', not its gpus_assigned {UUID_1}"]


def test_check_4_wants_no_gpu_listed_with_isolation_and_an_empty_cuda_visible_devices_without():
    assert gpu_check.no_gpu_verdict(probe_of(""), isolated=True, torch=False)[0] == []
    assert gpu_check.no_gpu_verdict(probe_of("", torch="0"), isolated=False, torch=True)[0] == []
    problems, _ = gpu_check.no_gpu_verdict(probe_of("", UUID_0, torch="0"), isolated=True, torch=True)
    assert problems == [f"nvidia-smi -L in the job listed 1 device(s) [{UUID_0}] {gpu_check.SMI_LISTS_ALL}"]
    problems, notes = gpu_check.no_gpu_verdict(probe_of(None, UUID_0, torch="1"), isolated=False, torch=True)
    assert problems == ["CUDA_VISIBLE_DEVICES is '(unset)', not set and empty", "PyTorch counted 1 device(s), not 0"]
    assert gpu_check.no_gpu_verdict(gpu_check.parse_probe(""), isolated=True, torch=False)[0] == [
        "the job printed no nvidia-smi status"]


def test_a_job_that_did_not_end_done_fails_its_check():
    done = {"job_id": "job-1", "status": "done"}
    assert gpu_check.verdict(done, [], ["fine"]) == ("PASS", "job-1: fine")
    failed = {"job_id": "job-2", "status": "failed", "exit_code": 1, "ended_by": "exit", "stderr": "a\nboom\n"}
    assert gpu_check.verdict(failed, ["more"], ["note"]) == (
        "FAIL", "job-2 ended failed (exit code 1, ended_by exit): boom; more (job-2: note)")

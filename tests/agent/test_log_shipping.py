"""Complete logs on the agent: its bounded copies of a stream (log_capture.py) and the
shipper (log_shipping.py) against a scheduler that keeps chunks as the real one does
(numbered, contiguous, idempotent, 409 with where it is), including one that fails,
one that already has part of the stream (an agent that restarted) and one that
will never take it."""
import base64
import hashlib
import os
import stat

import pytest

from corral.agent.log_capture import CapturedStream, ServiceStream
from corral.agent.log_shipping import LogShipper
from corral.shared.clients import Rejected, Unreachable
from corral.shared.wire import LOG_DROPPED_MARK

CAP = 64 * 1024


class Scheduler:
    """What PUT /jobs/{id}/attempts/{n}/logs/{stream}/{seq} does, in memory."""

    def __init__(self, fail_first: int = 0, refuse: tuple | None = None):
        self.streams: dict[tuple, list[tuple[int, bytes, bool]]] = {}
        self.fail_first = fail_first
        self.refuse = refuse  # (status, message, fields): every chunk is refused so
        self.calls = 0
        self.batches = 0

    def put_log_chunk(self, job_id, attempt, stream, seq, data, offset, final, node_id):
        self.calls += 1
        if self.fail_first:
            self.fail_first -= 1
            raise Unreachable("PUT …: connection refused", base_url="http://sched", reason="connection refused")
        if self.refuse:
            raise Rejected(*self.refuse)
        chunks = self.streams.setdefault((job_id, attempt, stream), [])
        size = sum(len(c[1]) for c in chunks)
        complete = bool(chunks) and chunks[-1][2]
        where = {"expected_seq": len(chunks), "expected_offset": size, "complete": complete}
        if seq < len(chunks):
            if chunks[seq] == (offset, data, final):
                return {"stored": False, "size": size, "complete": complete, "next_seq": len(chunks)}
            raise Rejected(409, "other bytes", {"error": "other bytes", **where})
        if complete or seq != len(chunks) or offset != size:
            raise Rejected(409, "not the next one", {"error": "not the next one", **where})
        chunks.append((offset, data, final))
        return {"stored": True, "size": size + len(data), "complete": final, "next_seq": seq + 1}

    def put_log_chunks(self, items):
        """POST /jobs/logs: each item as the PUT, a refusal as its result; a connection
        error fails the whole request."""
        self.batches += 1
        results = []
        for index, item in enumerate(items):
            try:
                answer = self.put_log_chunk(item["job_id"], item["attempt"], item["stream"], item["seq"],
                                            base64.b64decode(item["data"]), item["offset"], item["final"],
                                            item["node_id"])
                results.append({"index": index, "job_id": item["job_id"], "code": 200, **answer})
            except Rejected as exc:
                results.append({"index": index, "job_id": item["job_id"], "code": exc.status, **exc.fields})
        return results

    def stream(self, job_id="job-1", attempt=1, stream="stdout") -> tuple[bytes, bool]:
        chunks = self.streams.get((job_id, attempt, stream), [])
        return b"".join(c[1] for c in chunks), bool(chunks) and chunks[-1][2]


def pseudo_random(size: int, seed: str = "x") -> bytes:
    out, i = [], 0
    while sum(map(len, out)) < size:
        out.append(hashlib.sha256(f"{seed}{i}".encode()).digest())
        i += 1
    return b"".join(out)[:size]


@pytest.fixture
def shipper(tmp_path):
    directory = tmp_path / "output"
    directory.mkdir(mode=0o700)
    ship = LogShipper("n1", str(directory), CAP, chunk_bytes=10_000)
    yield ship
    ship.close()


def run_job(shipper, writes, job_id="job-1", attempt=1):
    out, err = shipper.capture(job_id, attempt)
    for data in writes:
        out.write(data)
    shipper.add(job_id, attempt, (out, err))
    return out, err


def ship_all(shipper, scheduler, passes=50):
    for _ in range(passes):
        try:
            shipper.ship_once(scheduler)
        except Unreachable:
            continue
        if not shipper.pending():
            return


@pytest.mark.parametrize("size", [0, 1, 9_999, 10_000, 25_000, CAP // 2, CAP - 1, CAP])
def test_a_stream_within_the_bound_is_shipped_whole_in_contiguous_chunks(shipper, size):
    output = pseudo_random(size)
    writes = [output[i:i + 777] for i in range(0, len(output), 777)]
    run_job(shipper, writes)
    shipper.finish("job-1", 1)
    scheduler = Scheduler()
    ship_all(shipper, scheduler)
    assert scheduler.stream() == (output, True)
    assert scheduler.stream(stream="stderr") == (b"", True)
    assert shipper.pending() == []
    assert os.listdir(shipper.directory) == []  # shipped: the agent's copies are gone


@pytest.mark.slow
def test_past_the_bound_the_middle_is_dropped_and_marked(shipper):
    output = pseudo_random(5 * CAP + 123)
    run_job(shipper, [output[i:i + 4096] for i in range(0, len(output), 4096)])
    # The head went while the job ran; the rest only once it ended.
    scheduler = Scheduler()
    shipper.ship_once(scheduler)
    assert scheduler.stream() == (output[:CAP // 2], False)
    shipper.finish("job-1", 1)
    ship_all(shipper, scheduler)
    half = CAP // 2
    dropped = len(output) - CAP
    assert scheduler.stream() == (output[:half] + LOG_DROPPED_MARK.format(dropped).encode() + output[-(CAP - half):],
                                  True)
    # The copies never held more than the bound.
    assert dropped > 0


@pytest.mark.slow
def test_the_agents_copies_never_grow_past_the_bound(shipper):
    out, _ = run_job(shipper, [pseudo_random(50_000, str(i)) for i in range(40)])  # 2 MB
    sizes = [os.stat(out.path).st_size, os.stat(out.path + ".tail").st_size]
    assert sum(sizes) <= CAP
    for path in (out.path, out.path + ".tail"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(shipper.directory).st_mode) == 0o700


def test_an_unreachable_scheduler_loses_nothing_and_doubles_nothing(shipper):
    output = pseudo_random(45_000)
    run_job(shipper, [output])
    shipper.finish("job-1", 1)
    scheduler = Scheduler(fail_first=3)
    ship_all(shipper, scheduler)
    assert scheduler.stream() == (output, True)


def test_a_lost_answer_is_sent_again_and_stored_once(shipper):
    output = pseudo_random(25_000)
    run_job(shipper, [output])
    shipper.finish("job-1", 1)
    scheduler = Scheduler()
    real = scheduler.put_log_chunk
    lost = []

    def answer_lost_once(*args):
        answer = real(*args)
        if not lost:
            lost.append(args)
            raise Unreachable("read timed out", base_url="http://sched", reason="read timed out")
        return answer

    scheduler.put_log_chunk = answer_lost_once
    ship_all(shipper, scheduler)
    assert scheduler.stream() == (output, True)


def test_an_agent_that_restarted_goes_on_from_where_the_scheduler_is(tmp_path, shipper):
    log_file = tmp_path / "svc.out"
    output = pseudo_random(30_000)
    log_file.write_bytes(output[:20_000])
    scheduler = Scheduler()
    first = LogShipper("n1", shipper.directory, CAP, chunk_bytes=10_000)
    first.follow_files("job-1", 1, [str(log_file), str(log_file)])
    first.ship_once(scheduler)
    first.close()  # the agent stopped; the service runs on
    with open(log_file, "ab") as f:
        f.write(output[20_000:])
    calls = scheduler.calls
    shipper.follow_files("job-1", 1, [str(log_file), str(log_file)])  # the next agent adopts it
    shipper.finish("job-1", 1)
    ship_all(shipper, scheduler)
    assert scheduler.stream() == (output, True)
    # It sent its first chunk again, learned where the stream is, and went on from there.
    assert scheduler.calls - calls <= 1 + 1 + 2  # the repeat, the rest of stdout, stderr's two


@pytest.mark.parametrize("refusal", [
    (404, "no job 'job-1'", {"error": "no job 'job-1'"}),
    (409, "attempt 1 of job-1 did not run on node 'n1'", {"error": "did not run"}),
    (413, "this stream would pass CORRAL_LOG_MAX_BYTES", {"error": "too large"}),
])
def test_a_stream_the_scheduler_will_never_take_is_given_up_and_its_files_removed(shipper, refusal):
    run_job(shipper, [b"hello\n"])
    shipper.finish("job-1", 1)
    scheduler = Scheduler(refuse=refusal)
    shipper.ship_once(scheduler)
    assert shipper.pending() == []
    assert scheduler.calls == 2  # one try per stream, no loop
    assert os.listdir(shipper.directory) == []


def test_a_service_log_emptied_past_its_bound_ships_head_mark_and_what_is_left(tmp_path, shipper):
    log_file = tmp_path / "svc.out"
    head = pseudo_random(CAP // 2 + 500, "head")
    log_file.write_bytes(head)
    shipper.follow_files("job-1", 1, [str(log_file), str(log_file)])
    scheduler = Scheduler()
    shipper.ship_once(scheduler)
    assert scheduler.stream()[0] == head[:CAP // 2]
    marker = b"[corral: log truncated after 99 bytes]\n"  # what AGENT_SERVICE_LOG_MAX_BYTES leaves
    log_file.write_bytes(marker)
    shipper.ship_once(scheduler)  # it notices the file was emptied
    with open(log_file, "ab") as f:
        f.write(b"the end\n")
    shipper.finish("job-1", 1)
    ship_all(shipper, scheduler)
    data, complete = scheduler.stream()
    assert complete and data.startswith(head[:CAP // 2]) and data.endswith(marker + b"the end\n")
    assert b"bytes dropped]" in data[CAP // 2:]


def test_a_service_stream_reads_through_its_own_descriptor(tmp_path):
    log_file = tmp_path / "svc.out"
    log_file.write_bytes(b"mine\n")
    stream = ServiceStream(str(log_file), CAP)
    try:
        other = tmp_path / "secret"
        other.write_bytes(b"not the job's\n")
        os.unlink(log_file)
        os.symlink(other, log_file)  # swapped for a link after the agent opened it
        stream.finish()
        assert stream.read(0, 100) == b"mine\n"
    finally:
        stream.close()


def test_a_capture_refuses_a_link_put_where_its_file_goes(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"keep\n")
    os.symlink(target, tmp_path / "job-1-1.stdout")
    capture = CapturedStream(str(tmp_path / "job-1-1.stdout"), CAP)
    capture.write(b"job output\n")  # never through the link
    assert capture.failed
    assert target.read_bytes() == b"keep\n"


def test_a_job_that_writes_nothing_costs_no_file(shipper):
    run_job(shipper, [])
    assert os.listdir(shipper.directory) == []


def test_the_small_pieces_of_many_jobs_go_in_one_request(shipper):
    for n in range(1, 31):
        run_job(shipper, [f"job {n} says hi\n".encode()], job_id=f"job-{n}")
        shipper.finish(f"job-{n}", 1)
    scheduler = Scheduler()
    shipper.ship_once(scheduler)
    assert scheduler.batches == 1 and scheduler.calls == 60  # 30 jobs, two streams each, one request
    assert shipper.pending() == []
    assert scheduler.stream("job-7") == (b"job 7 says hi\n", True)
    assert scheduler.stream("job-7", stream="stderr") == (b"", True)

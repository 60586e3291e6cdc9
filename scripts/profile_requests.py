"""A gunicorn config file (`corral-scheduler --gunicorn-config scripts/profile_requests.py`)
that profiles the CPU each worker spends serving requests.

Every request thread gets a cProfile profiler of its own, timed by the thread's CPU
clock (time.thread_time), so waiting on a lock, a socket or the database server
counts nothing; the profiler runs only while the thread is inside the WSGI app
(Flask, Corral's code, peewee and the database driver: not gunicorn's HTTP parsing,
not the background loops). When the worker exits, its threads' profiles are merged
into BENCH_PROFILE_DIR/<pid>.prof (pstats format). `scripts/bench.py --profile DIR`
starts the schedulers with it; `python -m pstats DIR/<pid>.prof` reads one.

Profiling slows a request down about twofold: read the shares, not the rates.
"""
import cProfile
import os
import threading
import time

_profiles: list[cProfile.Profile] = []
_lock = threading.Lock()
_local = threading.local()


def _profiler() -> cProfile.Profile:
    profiler = getattr(_local, "profiler", None)
    if profiler is None:
        profiler = _local.profiler = cProfile.Profile(time.thread_time)
        with _lock:
            _profiles.append(profiler)
    return profiler


def _profiled(app):
    def wsgi(environ, start_response):
        profiler = _profiler()
        profiler.enable()
        try:
            # The body is produced here too: Corral's answers are built before they are returned.
            return app(environ, start_response)
        finally:
            profiler.disable()
    return wsgi


def post_worker_init(worker):
    worker.wsgi = _profiled(worker.wsgi)


def worker_exit(server, worker):
    folder = os.environ.get("BENCH_PROFILE_DIR")
    with _lock:
        profiles = [p for p in _profiles if p.getstats()]
    if not folder or not profiles:
        return
    import pstats
    stats = pstats.Stats(profiles[0])
    for profile in profiles[1:]:
        stats.add(profile)
    stats.dump_stats(os.path.join(folder, f"{os.getpid()}.prof"))

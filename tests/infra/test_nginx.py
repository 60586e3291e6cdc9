"""infra/nginx/corral.conf for real: `nginx -t` accepts it, and a real nginx on loopback
in front of a real cluster carries submits, agents' long polls and the original Host
over TLS, and cuts a client that sends its headers too slowly."""
import os
import re
import shutil
import socket
import ssl
import subprocess
import time

import pytest
import requests

from cluster import Cluster, Proc, world_traversable_dir
from certs import make_certificates
from helpers import free_port, wait_for
from paths import REPO

SITE = os.path.join(REPO, "infra", "nginx", "corral.conf")
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)

pytestmark = pytest.mark.skipif(NGINX is None, reason="needs nginx (apt package nginx; .ci/run installs it)")


def site_for_test(ports: dict[str, int], upstreams: dict[str, int], cert: str, key: str) -> str:
    """The site as shipped, with loopback test ports and the test's certificate in place
    of the production ones; every replaced line must be there exactly as expected."""
    with open(SITE) as f:
        site = f.read()
    replacements = {
        "listen 9000 ssl;": f"listen 127.0.0.1:{ports['registry']} ssl;",
        "listen 9001 ssl;": f"listen 127.0.0.1:{ports['scheduler']} ssl;",
        "listen [::]:9000 ssl;": "",
        "listen [::]:9001 ssl;": "",
        "server 127.0.0.1:9100;": f"server 127.0.0.1:{upstreams['registry']};",
        "server 127.0.0.1:9101;": f"server 127.0.0.1:{upstreams['scheduler']};",
        "ssl_certificate /etc/corral/tls/server.pem;": f"ssl_certificate {cert};",
        "ssl_certificate_key /etc/corral/tls/server.key;": f"ssl_certificate_key {key};",
    }
    for old, new in replacements.items():
        assert site.count(old) >= 1, f"{SITE} no longer has {old!r}"
        site = site.replace(old, new)
    return site


def main_config(prefix: str, site_path: str) -> str:
    """nginx.conf for a private nginx: everything under `prefix`, in the foreground."""
    user = "user root;\n" if os.geteuid() == 0 else ""  # its workers write the temp dirs below
    return f"""{user}daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    include {site_path};
}}
"""


class Nginx:
    def __init__(self, tmp_path, upstreams: dict[str, int]):
        self.prefix = world_traversable_dir("corral-nginx-")
        self.ca, cert, key = make_certificates(tmp_path)
        self.ports = {"registry": free_port(), "scheduler": free_port()}
        site_path = os.path.join(self.prefix, "corral.conf")
        with open(site_path, "w") as f:
            f.write(site_for_test(self.ports, upstreams, cert, key))
        self.conf = os.path.join(self.prefix, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(main_config(self.prefix, site_path))
        self.proc: Proc | None = None

    def url(self, name: str) -> str:
        return f"https://127.0.0.1:{self.ports[name]}"

    def check(self) -> subprocess.CompletedProcess:
        return subprocess.run([NGINX, "-t", "-p", self.prefix, "-c", self.conf], capture_output=True, text=True,
                              timeout=30)

    def start(self) -> "Nginx":
        self.proc = Proc("nginx", [NGINX, "-p", self.prefix, "-c", self.conf], dict(os.environ),
                         os.path.join(self.prefix, "nginx.out"))
        wait_for(lambda: requests.get(self.url("scheduler") + "/healthz", verify=self.ca, timeout=2).ok,
                 timeout=20, message="nginx to pass /healthz on to the scheduler")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
        shutil.rmtree(self.prefix, ignore_errors=True)


class LoggedCluster(Cluster):
    """A cluster whose servers log every request with the headers nginx sets."""

    def __init__(self, tmp_path, **scheduler_env):
        super().__init__(tmp_path, **scheduler_env)
        self.conf = os.path.join(self.dir, "gunicorn.conf.py")
        with open(self.conf, "w") as f:
            f.write("access_log_format = '%(m)s %(U)s %(s)s host=%({host}i)s xff=%({x-forwarded-for}i)s "
                    "proto=%({x-forwarded-proto}i)s'\n")

    def server_flags(self, name: str) -> list[str]:
        return ["--gunicorn-config", self.conf, "--access-log", os.path.join(self.dir, f"{name}.access.log")]

    def access_log(self, name: str) -> str:
        with open(os.path.join(self.dir, f"{name}.access.log")) as f:
            return f.read()


def test_nginx_accepts_the_site(tmp_path):
    nginx = Nginx(tmp_path, {"registry": free_port(), "scheduler": free_port()})
    try:
        result = nginx.check()
        assert result.returncode == 0, result.stderr
        assert "test is successful" in result.stderr
    finally:
        nginx.stop()


@pytest.mark.e2e
def test_jobs_agents_and_the_host_go_through_nginx_and_slow_headers_are_cut(tmp_path, state_dir):
    c = LoggedCluster(tmp_path, CORRAL_ALLOWED_HOSTS="corral.example")
    nginx = None
    try:
        c.start_registry(CORRAL_ALLOWED_HOSTS="corral.example")
        c.start_scheduler()
        nginx = Nginx(tmp_path, {"registry": c.registry_port, "scheduler": c.scheduler_port}).start()
        # The agent speaks to both servers through nginx only, long polls included.
        c.start_agent("through-nginx", REGISTRY_URL=nginx.url("registry"), SCHEDULER_URL=nginx.url("scheduler"),
                      AGENT_CA_BUNDLE=nginx.ca, AGENT_LONG_POLL_SECS=20)
        c.wait_nodes_healthy("through-nginx", timeout=30)
        scheduler = nginx.url("scheduler")
        job = requests.post(scheduler + "/jobs", json={"command": "echo via nginx"}, verify=nginx.ca, timeout=10)
        assert job.status_code == 201, job.text
        done = wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed") else None)(
            requests.get(f"{scheduler}/jobs/{job.json()['job_id']}", verify=nginx.ca, timeout=5).json()),
            timeout=30, message="the job to finish")
        assert (done["status"], done["stdout"], done["node_id"]) == ("done", "via nginx\n", "through-nginx"), done
        # The client's Host, address and scheme reach the server.
        answer = requests.get(scheduler + "/healthz", headers={"Host": "corral.example"}, verify=nginx.ca, timeout=5)
        assert answer.status_code == 200, answer.text
        # gunicorn writes the access line after the answer has gone: wait for it.
        wanted = [r"GET /healthz 200 host=corral\.example xff=127\.0\.0\.1 proto=https",
                  r"POST /nodes/through-nginx/claim 200 host=127\.0\.0\.1 "]
        wait_for(lambda: all(re.search(w, c.access_log("scheduler")) for w in wanted), timeout=10,
                 message="the scheduler's access lines of the healthz and the claim")
        # nginx cuts a client that has not sent its headers within client_header_timeout (10 s);
        # nothing of it reaches the scheduler.
        with socket.create_connection(("127.0.0.1", nginx.ports["scheduler"]), timeout=30) as raw:
            tls = ssl.create_default_context(cafile=nginx.ca).wrap_socket(raw, server_hostname="127.0.0.1")
            started = time.monotonic()
            tls.sendall(b"GET /jobs/slowloris HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            try:
                assert tls.recv(4096) == b""
            except (ConnectionResetError, ssl.SSLError):
                pass  # cut without a TLS goodbye: cut all the same
            assert 9.5 <= time.monotonic() - started <= 15
        assert "slowloris" not in c.access_log("scheduler")
    finally:
        if nginx is not None:
            nginx.stop()
        c.stop()

"""AWS for tests: moto in server mode (real HTTP on 127.0.0.1), and boto3's environment.

Import the fixtures into a test module (`from aws import aws_env, moto_endpoint`)
or into conftest.py. One server per module (and so per xdist worker); it is
stopped when the module's tests are done.
"""
import pytest
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
# Explicit credentials for clients a test builds itself (the code under test reads
# the same values from the environment set by aws_env).
CLIENT_KWARGS = dict(region_name=REGION, aws_access_key_id="testing",
                     aws_secret_access_key="testing")


@pytest.fixture(scope="module")
def moto_endpoint():
    """The URL of a moto server (S3, SQS, SNS, ...) listening on 127.0.0.1."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def set_aws_env(monkeypatch, tmp_path, endpoint: str) -> None:
    """Point boto3's own environment variables at `endpoint`, with fake
    credentials, and keep the machine's ~/.aws files and profiles out of it."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN",
                 "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_SQS",
                 "AWS_ENDPOINT_URL_SNS", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)


@pytest.fixture
def aws_env(moto_endpoint, monkeypatch, tmp_path):
    """The environment of one test points boto3 at the module's moto server."""
    set_aws_env(monkeypatch, tmp_path, moto_endpoint)
    return moto_endpoint

"""AWS for tests: boto3's environment pointed at moto in server mode (real HTTP on
127.0.0.1; the fixtures `moto_endpoint` and `aws_env` are in conftest.py), and the
credentials of clients a test builds itself.
"""

REGION = "us-east-1"
# Explicit credentials for clients a test builds itself (the code under test reads
# the same values from the environment set by aws_env).
CLIENT_KWARGS = dict(region_name=REGION, aws_access_key_id="testing",
                     aws_secret_access_key="testing")


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



"""An OpenID Connect provider for tests: its discovery document and JWKS served over
real HTTP on loopback, test keys it rotates on demand, and the tokens it signs."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

AUDIENCE = "corral-test"


class Provider:
    """An identity provider's two documents over HTTP, with keys the test rotates."""

    def __init__(self):
        self.keys: dict[str, object] = {}  # kid -> private key
        self.fetches = 0
        self.down = False
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if provider.down:
                    self.send_error(503)
                    return
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": provider.issuer, "jwks_uri": f"{provider.issuer}/keys"}
                elif self.path == "/keys":
                    provider.fetches += 1
                    body = {"keys": [provider.public_jwk(kid, key) for kid, key in provider.keys.items()]}
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.issuer = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def public_jwk(kid, key):
        algorithm = jwt.algorithms.RSAAlgorithm if isinstance(key, rsa.RSAPrivateKey) else jwt.algorithms.ECAlgorithm
        jwk = json.loads(algorithm.to_jwk(key.public_key()))
        return dict(jwk, kid=kid, use="sig", alg="RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256")

    def add_key(self, kid, kind="rsa"):
        self.keys[kid] = (rsa.generate_private_key(public_exponent=65537, key_size=2048) if kind == "rsa"
                          else ec.generate_private_key(ec.SECP256R1()))
        return self.keys[kid]

    def token(self, kid="k1", alg=None, key=None, **claims):
        now = int(time.time())
        body = {"iss": self.issuer, "aud": AUDIENCE, "sub": "00u-alice", "preferred_username": "alice",
                "groups": ["corral:ml", "engineering"], "iat": now, "exp": now + 600, **claims}
        body = {name: value for name, value in body.items() if value is not None}
        signing = key or self.keys[kid]
        alg = alg or ("RS256" if isinstance(signing, rsa.RSAPrivateKey) else "ES256")
        return jwt.encode(body, signing, algorithm=alg, headers={"kid": kid})

    def close(self):
        self.server.shutdown()
        self.server.server_close()

"""A loopback stand-in for AWS CodeArtifact: one HTTPS server (a self-signed
certificate for 127.0.0.1, trusted through AWS_CA_BUNDLE and PIP_CERT) that
answers botocore's two calls, GetAuthorizationToken (`POST
/v1/authorization-token?domain=..&domain-owner=..`) and GetRepositoryEndpoint
(`GET /v1/repository/endpoint?domain=..&domain-owner=..&repository=..&format=pypi`),
as the rest-json service model has them, and serves the repository's PEP 503
index under `/pypi/<repo>/simple/`, to basic auth `aws:<token>` only.

Every request is recorded (method, path, query, whether it carried the
token, the client's user agent) so that tests can show what pip and boto3
asked for."""
import base64
import datetime
import hashlib
import json
import os
import secrets
import ssl
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from test_install import build_wheel

DOMAIN, OWNER, REPO, REGION = "tt-domain", "111122223333", "tt-repo", "eu-west-3"
ARN = "arn:aws:codeartifact:%s:%s:repository/%s/%s" % (REGION, OWNER, DOMAIN, REPO)
PACKAGE = "tt_ca_dep"
# Bounds every socket wait of the server (a client that stalls).
SOCKET_TIMEOUT_S = 30


def make_certificate(directory):
    """A self-signed CA certificate for IP 127.0.0.1 and its key, as PEM
    files; returns (cert path, key path)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path = os.path.join(directory, "loopback-ca.pem")
    key_path = os.path.join(directory, "loopback-ca.key")
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return cert_path, key_path


class FakeCodeArtifact:
    """The server's state: the token it hands out (and accepts), whether it
    refuses tokens, the files of its index, and the requests it saw."""

    def __init__(self, wheel_dir, token):
        self.token = token
        self.refuse = False
        self.echo_token_in_file_urls = False  # file links under /<token>/ (a leaky index)
        self.missing_files = False  # 404 for every file (pip then prints its URL)
        self.requests = []
        self.lock = threading.Lock()
        self.files = {}  # project -> {filename: bytes}
        for name in os.listdir(wheel_dir):
            project = name.split("-")[0].replace("_", "-").lower()
            with open(os.path.join(wheel_dir, name), "rb") as f:
                self.files.setdefault(project, {})[name] = f.read()
        self.server = None
        self.url = None

    # -- what tests read ---------------------------------------------------
    def seen(self, prefix=""):
        with self.lock:
            return [r for r in self.requests if r["path"].startswith(prefix)]

    def index_requests(self):
        return self.seen("/pypi/")

    def api_requests(self):
        return self.seen("/v1/")


def _handler(state):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = SOCKET_TIMEOUT_S

        def log_message(self, *args):
            pass

        def _send(self, status, body=b"", content_type="application/json", headers=()):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status, kind, message):
            self._send(status, json.dumps({"message": message}).encode(),
                       headers=[("x-amzn-ErrorType", kind)])

        def _authorized(self):
            header = self.headers.get("Authorization", "")
            if not header.startswith("Basic "):
                return None
            try:
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            except ValueError:
                return False
            return user == "aws" and password == state.token

        def _record(self):
            parsed = urllib.parse.urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            entry = {"method": self.command, "path": parsed.path,
                     "query": dict(urllib.parse.parse_qsl(parsed.query)),
                     "authorized": self._authorized(),
                     "signed": self.headers.get("Authorization", "").startswith("AWS4-HMAC"),
                     "agent": self.headers.get("User-Agent", "")}
            with state.lock:
                state.requests.append(entry)
            return parsed, entry

        def do_POST(self):
            parsed, entry = self._record()
            if parsed.path != "/v1/authorization-token":
                return self._error(404, "ResourceNotFoundException", "no such operation")
            if not entry["signed"]:
                return self._error(403, "UnrecognizedClientException", "request not signed")
            if state.refuse:
                return self._error(403, "AccessDeniedException",
                                   "User: arn:aws:sts::%s:assumed-role/job is not authorized to "
                                   "perform: codeartifact:GetAuthorizationToken" % OWNER)
            query = entry["query"]
            if query.get("domain") != DOMAIN or query.get("domain-owner") != OWNER:
                return self._error(404, "ResourceNotFoundException", "no such domain")
            self._send(200, json.dumps({"authorizationToken": state.token,
                                        "expiration": 4102444800}).encode())

        def do_GET(self):
            parsed, entry = self._record()
            if parsed.path == "/v1/repository/endpoint":
                query = entry["query"]
                if (query.get("domain"), query.get("domain-owner"), query.get("repository"),
                        query.get("format")) != (DOMAIN, OWNER, REPO, "pypi"):
                    return self._error(404, "ResourceNotFoundException", "no such repository")
                return self._send(200, json.dumps(
                    {"repositoryEndpoint": "%s/pypi/%s/" % (state.url, REPO)}).encode())
            prefix = "/pypi/%s/simple/" % REPO
            if not parsed.path.startswith(prefix):
                return self._send(404, b"not found", "text/plain")
            if not entry["authorized"]:
                return self._send(401, b"unauthorized", "text/plain",
                                  headers=[("WWW-Authenticate", 'Basic realm="tt-repo"')])
            rest = parsed.path[len(prefix):].strip("/").split("/")
            project = rest[0].lower() if rest and rest[0] else ""
            files = state.files.get(project)
            if files is None:
                return self._send(404, b"not found", "text/plain")
            if len(rest) == 1:
                links = []
                for filename, data in sorted(files.items()):
                    where = filename
                    if state.echo_token_in_file_urls:
                        where = "%s/%s" % (state.token, filename)
                    links.append('<a href="%s%s/%s#sha256=%s">%s</a><br/>' % (
                        prefix, project, where, hashlib.sha256(data).hexdigest(), filename))
                body = ("<!DOCTYPE html><html><body>%s</body></html>" % "".join(links)).encode()
                return self._send(200, body, "text/html")
            data = files.get(rest[-1])
            if data is None or state.missing_files:
                return self._send(404, b"not found", "text/plain")
            return self._send(200, data, "application/octet-stream")

    return Handler


@pytest.fixture
def codeartifact(tmp_path_factory):
    """A running FakeCodeArtifact (its index holds PACKAGE 1.0) and `env`,
    the variables that point boto3 and pip at it: fake static credentials,
    no instance metadata, no pip configuration of the machine's."""
    root = tmp_path_factory.mktemp("codeartifact")
    wheels = root / "wheels"
    wheels.mkdir()
    build_wheel(str(wheels), PACKAGE, value="'from codeartifact'")
    cert, key = make_certificate(str(root))
    token = "ttCAtok-%s-END" % secrets.token_hex(12)
    state = FakeCodeArtifact(str(wheels), token)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    state.server = server
    state.url = "https://127.0.0.1:%d" % server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              daemon=True)
    thread.start()
    state.cert = cert
    state.env = {
        "CA_REPOSITORY_ARN": ARN,
        "AWS_ENDPOINT_URL_CODEARTIFACT": state.url,
        "AWS_ACCESS_KEY_ID": "AKIDLOOPBACKTEST",
        "AWS_SECRET_ACCESS_KEY": "loopback-secret",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_CA_BUNDLE": cert,
        # pip's --cert; requests prefers REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE (set on
        # this machine) to a session's own bundle, so those name it too.
        "PIP_CERT": cert,
        "REQUESTS_CA_BUNDLE": cert,
        "CURL_CA_BUNDLE": cert,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_CACHE_DIR": "1",
        "PIP_DEFAULT_TIMEOUT": "20",
        "PIP_RETRIES": "0",
        "NO_PROXY": "127.0.0.1",
        "no_proxy": "127.0.0.1",
    }
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def clean_env(extra):
    """os.environ without the pip and AWS settings that would send pip or
    boto3 elsewhere, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "AWS_", "CA_REPOSITORY"))}
    env.update(extra)
    return env

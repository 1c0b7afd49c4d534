"""A SASL_SSL listener on every broker, as deployed: TLS with a certificate
signed by a CA made here, and SCRAM-SHA-512 users created as KRaft creates
them, in the cluster's metadata when its storage is formatted.

Optional (``LocalKafkaCluster(..., secure_listener=SecureListener.make(dir))``):
the PLAINTEXT listener stays, and carries inter-broker and the cluster's own
tools' traffic; the secure one is advertised beside it on a port of its own
(:attr:`localkafka.layout.ClusterLayout.secure_bootstrap_servers`).

- Certificates: ``openssl`` makes a CA and a broker certificate for
  ``127.0.0.1`` and ``localhost`` (subjectAltName: clients check the host, as
  librdkafka does by default). The broker reads a PEM key store (Kafka 2.7+,
  KIP-651): its key, encrypted PKCS#8 (``DefaultSslEngineFactory`` refuses a
  PEM key store file without ``ssl.key.password``), then its certificate.
- Users: ``StorageTool format --add-scram 'SCRAM-SHA-512=[name=U,password=P]'``
  on every node (``ScramParser``): the controllers write the credentials into
  the bootstrap metadata, which the brokers then load as
  ``UserScramCredentialRecord``s, as ``kafka-storage.sh`` does from 3.5.
- The listener's server side: ``listener.name.<name>.scram-sha-512.sasl.jaas.config``
  with ``ScramLoginModule`` and no credentials of its own (it only verifies).
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from localkafka.fetch import KafkaSetupError

LISTENER = "SECURE"
MECHANISM = "SCRAM-SHA-512"
_DAYS = "30"


@dataclass(frozen=True)
class Certificates:
    """PEM files of one CA and the broker certificate it signed."""

    ca: Path  # the CA's certificate: what clients trust (ssl.ca.location)
    broker_store: Path  # the broker's encrypted key, then its certificate (a PEM key store)
    key_password: str


@dataclass(frozen=True)
class SecureListener:
    """What the SASL_SSL listener needs: certificates and SCRAM users (name -> password)."""

    certificates: Certificates
    users: dict[str, str] = field(default_factory=dict)

    @classmethod
    def make(cls, directory: Path, users: dict[str, str]) -> SecureListener:
        """A listener with a CA and broker certificate made fresh in ``directory``."""
        return cls(make_certificates(directory), dict(users))

    def broker_properties(self) -> dict[str, str]:
        """The settings a broker adds for this listener (merged with its PLAINTEXT ones)."""
        prefix = f"listener.name.{LISTENER.lower()}"
        return {
            f"{prefix}.sasl.enabled.mechanisms": MECHANISM,
            f"{prefix}.{MECHANISM.lower()}.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            f"{prefix}.ssl.keystore.type": "PEM",
            f"{prefix}.ssl.keystore.location": str(self.certificates.broker_store),
            f"{prefix}.ssl.key.password": self.certificates.key_password,
        }

    def format_args(self) -> list[str]:
        """``StorageTool format`` arguments creating the users (``--add-scram``)."""
        args: list[str] = []
        for name, password in sorted(self.users.items()):
            if any(c in name + password for c in ',=[]"'):
                # ScramParser splits on these: such a value would not survive the trip.
                raise KafkaSetupError(f'SCRAM user {name!r}: names and passwords must not hold , = [ ] "')
            args += ["--add-scram", f"{MECHANISM}=[name={name},password={password}]"]
        return args


def make_certificates(directory: Path, *, common_name: str = "fencewatch test CA") -> Certificates:
    """A CA and a broker certificate for 127.0.0.1/localhost signed by it, in
    ``directory`` (created); each call makes a CA of its own, so a second call
    gives a CA the first one's broker does not know."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca = directory / "ca.key", directory / "ca.pem"
    key, csr, cert = directory / "broker.key", directory / "broker.csr", directory / "broker.pem"
    encrypted, store = directory / "broker-key.p8", directory / "broker-store.pem"
    extensions = directory / "broker.ext"
    password = secrets.token_hex(12)
    extensions.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "keyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca,
             "-days", _DAYS, "-subj", f"/CN={common_name}")  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=localhost")
    _openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
             "-days", _DAYS, "-extfile", extensions)  # fmt: skip
    # PKCS#12's PBE with 3DES: Kafka's PemStore asks for a SecretKeyFactory by the
    # key's algorithm name, and the JDK has none named PBES2 (openssl's default).
    _openssl("pkcs8", "-topk8", "-v1", "PBE-SHA1-3DES", "-in", key, "-out", encrypted,
             "-passout", f"pass:{password}")  # fmt: skip
    store.write_text(encrypted.read_text() + cert.read_text())
    for secret in (ca_key, key, encrypted, store):
        secret.chmod(0o600)
    return Certificates(ca, store, password)


def _openssl(*args: str | Path) -> None:
    try:
        proc = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise KafkaSetupError("openssl is not installed -- apt-get install openssl") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise KafkaSetupError(f"openssl {args[0]} failed: {last[0]}")

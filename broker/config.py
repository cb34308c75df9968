"""Node configuration: a TOML file, overridden by ``RAFTBROKER_*`` environment variables, overridden
by command-line flags; validated at start with messages that name the offending setting."""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(Exception):
    """The configuration is invalid; the message says which setting and why."""


def _check_address(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not host:port")
    return value


def is_loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# a node id or cluster id: a DNS-label-like name. A cluster id is the part of a record's origin
# ("<cluster_id>/<node_id>") before the first "/", which routes read to prevent echo loops; a node id
# is what AddNode accepts (broker.leader.membership)
ID_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
ID_RULE = "1-64 of A-Z a-z 0-9 . _ - (starting alphanumeric)"


def _check_id(value: str, info: Any) -> str:
    if not ID_RE.fullmatch(value):
        raise ValueError(f"{info.field_name} must be {ID_RULE}, got {value!r}")
    return value


class PeerConfig(BaseModel):
    """Another member of the cluster."""

    model_config = ConfigDict(extra="forbid")
    id: str
    raft_address: str
    grpc_address: str
    metrics_address: str = ""

    _addr = field_validator("raft_address", "grpc_address")(_check_address)
    _id = field_validator("id")(_check_id)

    @staticmethod
    def parse(spec: str) -> PeerConfig:
        """``ID=RAFT_HOST:PORT/GRPC_HOST:PORT`` (the form the ``--peer`` flag takes)."""
        node_id, sep, rest = spec.partition("=")
        raft, sep2, grpc_addr = rest.partition("/")
        if not sep or not sep2:
            raise ConfigError(f"--peer {spec!r}: expected ID=RAFT_HOST:PORT/GRPC_HOST:PORT")
        try:
            return PeerConfig(id=node_id, raft_address=raft, grpc_address=grpc_addr)
        except ValidationError as exc:
            raise ConfigError(f"--peer {spec!r}: {_first_error(exc)}") from None


class NodeConfig(BaseModel):
    """Everything one broker node needs to start."""

    model_config = ConfigDict(extra="forbid")
    node_id: str = "n1"
    cluster_id: str = "local"
    data_dir: Path = Path(".raftbroker/n1")
    grpc_address: str = "127.0.0.1:7001"
    raft_address: str = "127.0.0.1:7101"
    metrics_address: str = "127.0.0.1:7201"
    peers: list[PeerConfig] = Field(default_factory=list)
    max_record_bytes: int = Field(default=1 << 20, gt=0, le=64 << 20)
    max_batch_bytes: int = Field(default=8 << 20, gt=0, le=64 << 20)
    # the record bodies all `memory` topics together may hold (each node keeps them in memory);
    # an append past it is refused (RESOURCE_EXHAUSTED): broker/leader/memory_topics.py
    max_memory_topics_bytes: int = Field(default=512 << 20, gt=0, le=1 << 40)
    # the record bodies the leader keeps of all `ephemeral` topics (broker/leader/ephemeral.py)
    max_ephemeral_bytes: int = Field(default=256 << 20, gt=0, le=1 << 40)
    # topics in the cluster, groups' dead-letter topics included; a create past it is RESOURCE_EXHAUSTED
    max_topics: int = Field(default=10_000, gt=0, le=1_000_000)
    commit_timeout_ms: int = Field(default=5000, gt=0)
    raft_password: str | None = None  # encrypts and authenticates the Raft transport (Fernet)
    raft_password_salt: str | None = None  # random, per cluster, same on every node (default: from cluster_id)
    housekeeping_period_ms: int = Field(default=10_000, ge=50)  # retention by age, dedup-key expiry, formats
    # keep the cluster's command format where it is although every member applies a newer one (a
    # rollback window during an upgrade; docs/deploy.md, docs/design/command-formats.md)
    hold_command_format: bool = False
    # take over a data directory recorded as another node's or cluster's (a restored copy), only when
    # this node starts alone, without peers (broker/data_dir.py, docs/deploy.md "Back up and restore")
    adopt_data_dir: bool = False
    # how often the leader compares the members' apply digests (docs/operations.md, "Verifying replicas")
    verify_replicas_period_ms: int = Field(default=60_000, ge=50)
    raft_compaction_min_entries: int = Field(default=20_000, ge=2)  # snapshot when the log is longer...
    raft_compaction_min_time_s: float = Field(default=300.0, gt=0)  # ...or this long after the last one
    # the Raft journal's segment files: a full one is sealed and a new one started; space comes back a
    # whole segment at a time, once a compaction has passed every entry in it
    raft_journal_segment_bytes: int = Field(default=64 * 1024 * 1024, ge=64 * 1024, le=1024 * 1024 * 1024)
    # the newest Raft commands kept in memory; older entries are read back from the segments
    raft_journal_cache_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024, le=4 * 1024 * 1024 * 1024)
    # Raft journal records at least this long are written with O_DIRECT, past the page cache (0: none);
    # docs/operations.md, "The journal's direct writes"
    raft_journal_direct_write_min_bytes: int = Field(default=64 * 1024, ge=0, le=1024 * 1024 * 1024)
    # the store (RocksDB) writes its table files with O_DIRECT, past the page cache, where the file
    # system allows it; docs/operations.md, "The store's direct writes"
    store_direct_writes: bool = True
    # the store drops a table file from the page cache once a reader has read past it; docs/operations.md,
    # "The store's direct writes"
    store_drop_behind: bool = True
    # the store's table files: "none", or "lz4", "zstd", "snappy" for compressible records (JSON, logs);
    # docs/operations.md, "The store's compression"
    store_compression: Literal["none", "lz4", "snappy", "zstd"] = "none"
    # a follower that hears nothing from the leader for a random time in this range starts an election
    # (behind a pre-vote); raise both on a host whose threads stall that long (docs/operations.md)
    raft_election_timeout_min_s: float = Field(default=0.4, ge=0.2, le=60.0)
    raft_election_timeout_max_s: float = Field(default=0.8, gt=0.2, le=120.0)
    raft_leader_fallback_timeout_s: float = Field(default=3.0, ge=0.1)  # a leader without a majority steps down
    raft_connection_timeout_s: float = Field(default=3.5, ge=1.0)  # a peer sent to, silent this long: disconnected
    # a Raft peer this node is not connected to is dialled again this often (the node with the greater
    # raft_address dials): how long a restarted member can wait to hear the leader
    raft_connection_retry_s: float = Field(default=1.0, ge=0.1, le=60.0)
    max_streams: int = Field(default=4096, ge=1, le=1_000_000)  # open Subscribe/PublishStream streams
    insecure: bool = False
    # security (SPEC §8, docs/security.md): TLS for gRPC, bearer tokens, ACLs, the Raft secret from a file
    tls_cert_file: Path | None = None  # PEM certificate chain of this node's gRPC port (re-read on change)
    tls_key_file: Path | None = None  # its PEM private key
    tls_client_ca_file: Path | None = None  # set: clients must present a certificate this CA signed (mTLS)
    tls_ca_file: Path | None = None  # CA of the other nodes' certificates (node-to-node calls); default: the client CA
    tls_principal_from_cert: bool = False  # a call without a token is its client certificate's common name
    tokens_file: Path | None = None  # bearer tokens → principals, hashed (re-read on change)
    acl_file: Path | None = None  # grants per principal, topic and group (re-read on change)
    raft_password_file: Path | None = None  # raft_password read from a file (a mounted Secret)
    route_client_config: Path | None = None  # client config (TLS, token) routes use towards other clusters

    _addr = field_validator("grpc_address", "raft_address", "metrics_address")(_check_address)
    _ids = field_validator("node_id", "cluster_id")(_check_id)

    @model_validator(mode="after")
    def _consistent(self) -> NodeConfig:
        ids = [self.node_id, *(p.id for p in self.peers)]
        if len(set(ids)) != len(ids):
            raise ValueError(f"node ids must be unique, got {ids}")
        if self.max_record_bytes > self.max_batch_bytes:
            raise ValueError("max_record_bytes must not exceed max_batch_bytes")
        if self.raft_election_timeout_max_s <= self.raft_election_timeout_min_s:
            raise ValueError("raft_election_timeout_max_s must exceed raft_election_timeout_min_s")
        if self.raft_connection_timeout_s < self.raft_election_timeout_max_s:
            raise ValueError("raft_connection_timeout_s must be at least raft_election_timeout_max_s")
        self._check_security()
        # the metrics endpoint is unauthenticated too: it needs the same explicit opt-in as gRPC
        exposed = [a for a in (self.grpc_address, self.raft_address, self.metrics_address) if not is_loopback(a)]
        if self.authenticated:  # gRPC is TLS + auth, Raft needs its secret (below), metrics carry no record data
            exposed = []
        if exposed and not self.insecure:
            raise ValueError(
                f"refusing to bind {', '.join(exposed)} beyond loopback without authentication; "
                "configure TLS and tokens (tls_cert_file, tls_key_file, tokens_file, acl_file; see "
                "docs/security.md), or pass --insecure to accept that explicitly")
        if not is_loopback(self.raft_address) and not (self.raft_password or self.raft_password_file):
            raise ValueError("a non-loopback Raft address needs raft_password (it encrypts and authenticates the "
                             "Raft transport; set it in the config file or RAFTBROKER_RAFT_PASSWORD), or "
                             "raft_password_file (--raft-password-file, a mounted Secret)")
        if self.raft_password == "" or self.raft_password_salt == "":
            raise ValueError("raft_password and raft_password_salt must not be empty when set")
        return self

    @property
    def authenticated(self) -> bool:
        """gRPC calls are authenticated (TLS with tokens or client-certificate principals)."""
        return self.tls_cert_file is not None and (self.tokens_file is not None or self.tls_principal_from_cert)

    def _check_security(self) -> None:
        for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file", "tls_ca_file", "tokens_file",
                     "acl_file", "raft_password_file", "route_client_config"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name}: {path} is not a readable file")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        tls = self.tls_cert_file is not None
        if (self.tokens_file is not None or self.tls_client_ca_file is not None) and not tls:
            raise ValueError("tokens_file and tls_client_ca_file need TLS (tls_cert_file and tls_key_file): "
                             "tokens must not cross the network in plaintext")
        if self.tls_principal_from_cert and self.tls_client_ca_file is None:
            raise ValueError("tls_principal_from_cert needs tls_client_ca_file (verified client certificates)")
        if self.authenticated != (self.acl_file is not None):
            raise ValueError("authentication (tokens_file or tls_principal_from_cert) and acl_file go together: "
                             "an authenticated node needs an ACL, and an ACL needs authenticated principals")
        if self.raft_password is not None and self.raft_password_file is not None:
            raise ValueError("give raft_password or raft_password_file, not both")

    def raft_secret(self) -> str | None:
        """The Raft password: ``raft_password``, or the first line of ``raft_password_file``."""
        if self.raft_password_file is None:
            return self.raft_password
        secret = Path(self.raft_password_file).read_text().strip()
        if not secret:
            raise ConfigError(f"raft_password_file {self.raft_password_file} is empty")
        return secret

    def raft_salt(self) -> str:
        """The salt of the Raft password's key derivation: ``raft_password_salt``, else one derived from
        ``cluster_id`` (distinct per cluster id, but guessable: set a random salt in production)."""
        return self.raft_password_salt or f"raftbroker-cluster:{self.cluster_id}"


def _first_error(exc: ValidationError) -> str:
    """The first error, as one line: the setting and what is wrong with it. A check across settings
    (a model validator) names its settings itself, so it goes without pydantic's location and its
    "Value error, " prefix."""
    err = exc.errors()[0]
    msg = err["msg"].removeprefix("Value error, ")
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {msg}" if where else msg


_ENV_PREFIX = "RAFTBROKER_"


def _from_env(environ: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in NodeConfig.model_fields:
        value = environ.get(_ENV_PREFIX + name.upper())
        if value is not None and name != "peers":
            out[name] = value
    peers = environ.get(_ENV_PREFIX + "PEERS")
    if peers:
        out["peers"] = [PeerConfig.parse(s).model_dump() for s in peers.split(",") if s.strip()]
    return out


def _without_self(data: dict[str, Any]) -> list[Any]:
    """The peers less this node's own entry, so that every member can be given the same full list (a
    StatefulSet renders one list for all its pods). An entry with this node's id but other Raft or
    gRPC addresses than its own stays, and validation rejects it (ids must be unique)."""
    node_id = data.get("node_id", NodeConfig.model_fields["node_id"].default)
    me = (data.get("raft_address", NodeConfig.model_fields["raft_address"].default),
          data.get("grpc_address", NodeConfig.model_fields["grpc_address"].default))
    peers: list[Any] = list(data.get("peers") or [])
    return [p for p in peers
            if not (isinstance(p, dict) and p.get("id") == node_id
                    and (p.get("raft_address"), p.get("grpc_address")) == me)]


def load_config(path: Path | None, overrides: dict[str, Any], environ: dict[str, str] | None = None) -> NodeConfig:
    """File < environment < ``overrides`` (flags; ``None`` values are ignored)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
        except OSError as exc:  # unreadable (permissions of a mounted file), a directory, ...
            raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    data.update(_from_env(dict(os.environ) if environ is None else environ))
    data.update({k: v for k, v in overrides.items() if v is not None})
    data["peers"] = _without_self(data)
    try:
        return NodeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration: {_first_error(exc)}") from None

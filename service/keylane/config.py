"""Settings: every knob keylane reads from the environment, read in this one place.

Precedence, highest first: an explicit override (a CLI flag), the environment, the default.
Values are validated when Settings is built, so a bad value fails at start-up with a
ConfigError naming the variable, never later inside the worker.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from keylane.errors import ConfigError
from keylane.signing import Keyring

# Kafka's legal topic characters; the prefix is part of every topic name.
_TOPIC_CHARS = re.compile(r"^[A-Za-z0-9._-]*$")
_HOST_PORT = re.compile(r"^[^\s:,]+:(\d{1,5})$")
MAX_PREFIX_LEN = 200  # leaves room for the longest catalog name within Kafka's 249
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DEFAULT_KAFKA_STATE = ".kafka-local"
"""Where `make run` and `make broker` keep a local broker's state, and its keylane.env
(deploy/kafka/local_kafka.py); KEYLANE_KAFKA_STATE names another."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Process-wide configuration. Build it with :meth:`from_env`."""

    bootstrap_servers: str = "127.0.0.1:9092"
    """Comma-separated host:port list (KEYLANE_BOOTSTRAP_SERVERS, or KAFKA_BOOTSTRAP_SERVERS;
    when neither is set, the address `make run` / `make broker` wrote to
    $KEYLANE_KAFKA_STATE/keylane.env, default .kafka-local/keylane.env)."""

    bootstrap_source: str = field(default="the default", compare=False)
    """Where bootstrap_servers came from, for error messages: a flag, a variable, a file."""

    topic_prefix: str = ""
    """Prepended to every catalog topic name (KEYLANE_TOPIC_PREFIX)."""

    replication_factor: int | None = None
    """Overrides the catalog's replication factor for every topic (KEYLANE_REPLICATION_FACTOR)."""

    app_id: str = ""
    """Faust application id: consumer group and changelog topic prefix (KEYLANE_APP_ID).
    Unset: ``keylane``, behind the topic prefix when there is one (``prod.keylane``), so that a
    prefix alone keeps two deployments on one cluster out of each other's group and state."""

    data_dir: Path = field(default_factory=lambda: Path(".keylane-data"))
    """Where RocksDB tables live (KEYLANE_DATA_DIR)."""

    metrics_port: int = 9464
    """Port of the Prometheus /metrics endpoint; 0 disables it (KEYLANE_METRICS_PORT)."""

    metrics_host: str = "0.0.0.0"  # noqa: S104  (a scraper in another container must reach it)
    """Address /metrics, /healthz and /readyz listen on (KEYLANE_METRICS_HOST): every
    interface by default, as a scraper in another container or pod needs; 127.0.0.1 keeps
    them on the machine."""

    log_level: str = "info"
    """Logging level for the worker (KEYLANE_LOG_LEVEL)."""

    signing_keys: str = field(default="", repr=False)
    """Trusted HMAC keys, ``kid:secret[,kid:secret]``; the first signs (KEYLANE_SIGNING_KEYS)."""

    intent_signatures: str = "off"
    """How the effector checks intent signatures: off | permissive | require
    (KEYLANE_INTENT_SIGNATURES)."""

    approval_signatures: str = "off"
    """How the worker checks approval signatures: off | permissive | require
    (KEYLANE_APPROVAL_SIGNATURES)."""

    result_signatures: str = "off"
    """How the worker checks the effector's ToolResult signatures: off | permissive | require
    (KEYLANE_RESULT_SIGNATURES). The effector signs its results whenever it has keys."""

    session_timeout_s: float = 10.0
    """Consumer-group session timeout: how long a crashed worker keeps its partitions before
    the group moves them (KEYLANE_SESSION_TIMEOUT_S; the broker's minimum is 6)."""

    group_instance_id: str | None = None
    """The consumer's static group membership id, unique per process of the group, stable
    across its restarts (KEYLANE_GROUP_INSTANCE_ID, e.g. the pod name). None: dynamic
    membership. A static member that stops sends no LeaveGroup, and rejoining within the
    session timeout gets its partitions back without a rebalance (docs/deploy.md)."""

    provider: str = ""
    """The worker's model provider as a URL, replacing the agent config's provider_factory
    (KEYLANE_PROVIDER; see docs/providers.md). Empty: the agent config decides."""

    def __post_init__(self) -> None:
        if not self.app_id:
            object.__setattr__(self, "app_id", f"{self.topic_prefix}keylane")
        servers = [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()]
        matches = [_HOST_PORT.match(s) for s in servers]
        if not servers or not all(m and 0 < int(m.group(1)) <= 65535 for m in matches):
            raise ConfigError(
                f"bootstrap servers {self.bootstrap_servers!r} ({self.bootstrap_source}) are not "
                "host:port[,host:port] with ports 1-65535; set KEYLANE_BOOTSTRAP_SERVERS or "
                "--bootstrap-servers, e.g. 127.0.0.1:9092"
            )
        if not _TOPIC_CHARS.match(self.topic_prefix) or len(self.topic_prefix) > MAX_PREFIX_LEN:
            raise ConfigError(
                f"topic prefix {self.topic_prefix!r} is not a legal Kafka topic prefix; "
                f"use at most {MAX_PREFIX_LEN} of the characters a-z A-Z 0-9 . _ - (e.g. 'prod.')"
            )
        if self.topic_prefix in {".", ".."}:
            raise ConfigError("topic prefix must not be '.' or '..'; use a name such as 'prod.'")
        if self.replication_factor is not None and self.replication_factor < 1:
            raise ConfigError("KEYLANE_REPLICATION_FACTOR must be a whole number >= 1")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(
                f"KEYLANE_METRICS_PORT={self.metrics_port} is not a port; "
                "use 1-65535, or 0 to disable /metrics"
            )
        if not self.metrics_host.strip() or any(c.isspace() for c in self.metrics_host):
            raise ConfigError(
                f"KEYLANE_METRICS_HOST={self.metrics_host!r} is not an address to listen on; "
                "use e.g. 0.0.0.0 (every interface) or 127.0.0.1"
            )
        if self.log_level.lower() not in LOG_LEVELS:
            raise ConfigError(
                f"KEYLANE_LOG_LEVEL={self.log_level!r} is not a log level; use one of {', '.join(LOG_LEVELS)}"
            )
        for variable, mode in (
            ("KEYLANE_INTENT_SIGNATURES", self.intent_signatures),
            ("KEYLANE_APPROVAL_SIGNATURES", self.approval_signatures),
            ("KEYLANE_RESULT_SIGNATURES", self.result_signatures),
        ):
            if mode not in ("off", "permissive", "require"):
                raise ConfigError(f"{variable}={mode!r} must be one of off, permissive, require")
            if mode == "require" and not self.keyring().keys:
                raise ConfigError(f"{variable}=require needs keys: set KEYLANE_SIGNING_KEYS=keyid:secret")
        if self.session_timeout_s < 6:
            raise ConfigError("KEYLANE_SESSION_TIMEOUT_S must be at least 6 (the broker's minimum)")
        instance = self.group_instance_id
        if instance is not None and (not instance.strip() or not instance.isprintable()):
            raise ConfigError(
                f"KEYLANE_GROUP_INSTANCE_ID={instance!r} must be a non-empty printable name, unique per "
                "process and stable across its restarts (e.g. the pod name); unset it for dynamic membership"
            )
        if not _TOPIC_CHARS.match(self.app_id) or not self.app_id:
            raise ConfigError(f"app id {self.app_id!r} must be non-empty and use a-z A-Z 0-9 . _ -")

    def keyring(self) -> Keyring:
        """The signing keys, parsed."""
        return Keyring.parse(self.signing_keys)

    @property
    def bootstrap_list(self) -> list[str]:
        """The bootstrap servers as a list of host:port strings."""
        return [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Read settings from ``environ`` (default: the process environment).

        ``overrides`` with a value of None are ignored, so CLI flags that were not given
        fall through to the environment.
        """
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        values.update(_bootstrap(env))
        if "KEYLANE_TOPIC_PREFIX" in env:
            values["topic_prefix"] = env["KEYLANE_TOPIC_PREFIX"]
        if env.get("KEYLANE_REPLICATION_FACTOR"):
            values["replication_factor"] = _int(env, "KEYLANE_REPLICATION_FACTOR", example="3")
        if env.get("KEYLANE_APP_ID"):
            values["app_id"] = env["KEYLANE_APP_ID"]
        if env.get("KEYLANE_DATA_DIR"):
            values["data_dir"] = Path(env["KEYLANE_DATA_DIR"])
        if env.get("KEYLANE_METRICS_PORT"):
            values["metrics_port"] = _int(env, "KEYLANE_METRICS_PORT", example="9464")
        if env.get("KEYLANE_METRICS_HOST"):
            values["metrics_host"] = env["KEYLANE_METRICS_HOST"]
        if env.get("KEYLANE_SESSION_TIMEOUT_S"):
            values["session_timeout_s"] = _float(env, "KEYLANE_SESSION_TIMEOUT_S", example="10")
        if "KEYLANE_GROUP_INSTANCE_ID" in env:  # set but empty is refused, not read as unset
            values["group_instance_id"] = env["KEYLANE_GROUP_INSTANCE_ID"]
        for variable, name in (
            ("KEYLANE_SIGNING_KEYS", "signing_keys"),
            ("KEYLANE_INTENT_SIGNATURES", "intent_signatures"),
            ("KEYLANE_APPROVAL_SIGNATURES", "approval_signatures"),
            ("KEYLANE_RESULT_SIGNATURES", "result_signatures"),
            ("KEYLANE_PROVIDER", "provider"),
        ):
            if env.get(variable):
                values[name] = env[variable]
        if env.get("KEYLANE_LOG_LEVEL"):
            values["log_level"] = env["KEYLANE_LOG_LEVEL"]
        known = {f.name for f in fields(cls)}
        for name, value in overrides.items():
            if name not in known:
                raise TypeError(f"unknown setting {name!r}")
            if value is not None:
                values[name] = value
                if name == "bootstrap_servers":
                    values["bootstrap_source"] = "--bootstrap-servers"
        return cls(**values)  # type: ignore[arg-type]

    def with_overrides(self, **changes: object) -> Settings:
        """A copy with the given fields replaced (None values are ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})  # type: ignore[arg-type]


def _bootstrap(env: Mapping[str, str]) -> dict[str, object]:
    """The bootstrap servers and where they came from: KEYLANE_BOOTSTRAP_SERVERS, else
    KAFKA_BOOTSTRAP_SERVERS, else the keylane.env a local broker (`make run`, `make broker`)
    wrote while it runs; none of them: the default."""
    for variable in ("KEYLANE_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS"):
        if env.get(variable):
            return {"bootstrap_servers": env[variable], "bootstrap_source": variable}
    written = Path(env.get("KEYLANE_KAFKA_STATE") or DEFAULT_KAFKA_STATE) / "keylane.env"
    try:
        lines = written.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    found = dict(line.partition("=")[::2] for line in lines if "=" in line)
    bootstrap = found.get("KEYLANE_BOOTSTRAP_SERVERS", "").strip()
    if not bootstrap:
        return {}
    source = f"from {written}"
    gone = _stopped_broker_pids(written.parent / "cluster.json")
    if gone:  # killed, not stopped: `stop` would have removed keylane.env
        source += f", whose broker is not running (process {', '.join(map(str, gone))} is gone)"
    values: dict[str, object] = {"bootstrap_servers": bootstrap, "bootstrap_source": source}
    replication = found.get("KEYLANE_REPLICATION_FACTOR", "").strip()
    if replication and not env.get("KEYLANE_REPLICATION_FACTOR"):  # a 3-node `make broker` says 3
        values["replication_factor"] = _int(found, "KEYLANE_REPLICATION_FACTOR", example="3")
    return values


def _stopped_broker_pids(cluster_json: Path) -> list[int]:
    """The recorded broker processes of a local cluster (deploy/kafka/local_kafka.py's
    cluster.json) that no longer run; none when there is no such record."""
    try:
        nodes = json.loads(cluster_json.read_text())["nodes"]
        pids = [int(node["pid"]) for node in nodes]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    gone = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            gone.append(pid)
        except PermissionError:  # alive, another user's
            pass
    return gone


def _int(env: Mapping[str, str], name: str, *, example: str) -> int:
    raw = env[name]
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(
            f"{name}={raw!r} is not a whole number; set it to one, e.g. {name}={example}"
        ) from None


def _float(env: Mapping[str, str], name: str, *, example: str) -> float:
    raw = env[name]
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number; set it to one, e.g. {name}={example}") from None

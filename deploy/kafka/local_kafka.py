#!/usr/bin/env python3
"""Run a real Apache Kafka (KRaft) cluster on 127.0.0.1 from Maven Central jars, no Docker.

Used by ``make broker`` / ``make broker-stop``, by ``make run`` and by the test suite's
broker fixture. Standard library only, so it works before the project is installed.

Lifecycle of ``start`` (in order):

1. cache the jars: ``mvn dependency:copy-dependencies`` on ``deploy/kafka/pom.xml`` into
   ``$KEYLANE_KAFKA_CACHE`` (default ``~/.cache/keylane/kafka-<version>``), once;
2. derive per node: node id ``i`` (1..N), broker port ``base + 2(i-1)``, controller port
   ``base + 2(i-1) + 1``, its own data dir ``<state-dir>/node-<i>``;
3. format each node's KRaft storage with one cluster id (``--ignore-formatted``, so a
   restart keeps the data);
4. start each node as its own session (Ctrl-C in a terminal does not reach it; ``stop``
   does);
5. wait until every node answers a Metadata request listing all N brokers, then write
   ``<state-dir>/cluster.json`` and ``<state-dir>/keylane.env`` (the bootstrap address and
   the replication factor keylane's topics should get) and print the bootstrap address.

Replication follows what Kafka operators run: topics default to replication factor
``min(3, N)`` and ``min.insync.replicas`` ``min(2, N)``, the internal topics too, so an
N >= 3 cluster survives one broker down without losing an acknowledged (acks=all) write.
keylane also sets both on its own topics explicitly (KEYLANE_REPLICATION_FACTOR).

``stop`` sends SIGTERM (a controlled shutdown), waits, then SIGKILLs what is left, and removes
``cluster.json`` and ``keylane.env``: nothing in the state dir names a broker that is not
running (the ``keylane`` command reads ``keylane.env`` when no address is exported). A start
that fails or is interrupted removes them as well. The nodes' data stays.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

KAFKA_VERSION = "3.9.1"
HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
DEFAULT_STATE_DIR = HERE.parent.parent / ".kafka-local"
START_TIMEOUT_S = 120.0
START_ATTEMPTS = 3
# Brokers this process started, kept referenced until stopped: a Popen that is garbage
# collected while its process runs raises ResourceWarning (an error under pytest -W error).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
STOP_TIMEOUT_S = 30.0


class LauncherError(Exception):
    """Something an operator must fix; the message says what."""


class PortTaken(LauncherError):
    """A node could not bind its port: something else took it after the probe."""


@dataclass(frozen=True)
class Node:
    node_id: int
    port: int
    controller_port: int
    data_dir: str
    pid: int = 0


@dataclass(frozen=True)
class Cluster:
    state_dir: str
    nodes: list[Node]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)


def jar_cache() -> Path:
    default = Path.home() / ".cache" / "keylane" / f"kafka-{KAFKA_VERSION}"
    return Path(os.environ.get("KEYLANE_KAFKA_CACHE", default))


def ensure_jars() -> Path:
    """Return the directory of cached broker jars, resolving them with Maven once."""
    libs = jar_cache() / "libs"
    marker = libs / ".complete"
    if marker.exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LauncherError("Maven (mvn) is not installed: run 'apt-get install -y maven' first")
    libs.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [
            mvn,
            "-B",
            "-q",
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={libs}",
            "-Dmdep.includeScope=runtime",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip().splitlines()[-5:]
        raise LauncherError("mvn could not resolve the Kafka jars: " + " | ".join(tail))
    marker.write_text(KAFKA_VERSION)
    return libs


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home, "bin", "java") if home else None
    found = str(candidate) if candidate and candidate.exists() else shutil.which("java")
    if found is None:
        raise LauncherError("Java 17+ is not installed: run 'apt-get install -y openjdk-17-jre-headless'")
    return found


# Below Linux's default ephemeral range (32768-60999): a port the kernel hands to outgoing
# connections can be taken between our probe and the broker's bind. keylane.testing.processes
# .free_port picks below it too, from 10000-20000; this script keeps its own picker, since it
# is stdlib-only: it runs before keylane is installed.
PORT_RANGE = (20000, 32000)


def free_port_pair(nodes: int = 1) -> int:
    """An even base port whose next 2N ports were free a moment ago, outside the ephemeral range."""
    for _ in range(200):
        base = secrets.randbelow((PORT_RANGE[1] - PORT_RANGE[0]) // 2) * 2 + PORT_RANGE[0]
        if all(_port_free(base + k) for k in range(2 * nodes)):
            return base
    raise LauncherError("no free port range found on 127.0.0.1; pass --port")


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def plan_nodes(state_dir: Path, count: int, base_port: int) -> list[Node]:
    return [
        Node(
            node_id=i,
            port=base_port + 2 * (i - 1),
            controller_port=base_port + 2 * (i - 1) + 1,
            data_dir=str(state_dir / f"node-{i}"),
        )
        for i in range(1, count + 1)
    ]


def replication_factor(nodes: int) -> int:
    """The replication factor topics on an N-node cluster get: 3, or N when smaller."""
    return min(3, nodes)


def min_insync_replicas(nodes: int) -> int:
    """Replicas an acks=all write needs: 2 (one broker may be down), or 1 on one node."""
    return min(2, replication_factor(nodes))


def server_properties(node: Node, nodes: list[Node]) -> str:
    voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in nodes)
    internal_rf = replication_factor(len(nodes))
    min_isr = min_insync_replicas(len(nodes))
    return "\n".join(
        [
            "process.roles=broker,controller",
            f"node.id={node.node_id}",
            f"controller.quorum.voters={voters}",
            f"listeners=PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{node.port}",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            f"log.dirs={node.data_dir}/data",
            "num.partitions=1",
            # Topics come from the catalog (keylane topics apply) or from Faust's admin calls;
            # a typo in a topic name must fail, not create a topic silently.
            "auto.create.topics.enable=false",
            # Broker defaults for any topic created without its own settings; keylane's
            # catalog and changelog topics carry both explicitly.
            f"default.replication.factor={internal_rf}",
            f"min.insync.replicas={min_isr}",
            f"offsets.topic.replication.factor={internal_rf}",
            "offsets.topic.num.partitions=10",
            f"transaction.state.log.replication.factor={internal_rf}",
            f"transaction.state.log.min.isr={min_isr}",
            # Local cluster: no reason to hold a new consumer group's first join for 3 s.
            "group.initial.rebalance.delay.ms=0",
            "log.segment.bytes=67108864",
            "",
        ]
    )


LOG4J = """log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={log}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka=INFO
log4j.logger.org.apache.kafka=INFO
"""


def _java_cmd(libs: Path, node_dir: Path, main: str, *args: str) -> list[str]:
    return [
        java(),
        "-Xms128m",
        "-Xmx512m",
        "-XX:+UseG1GC",
        "-XX:TieredStopAtLevel=1",
        "-Djava.awt.headless=true",
        f"-Dlog4j.configuration=file:{node_dir / 'log4j.properties'}",
        "-cp",
        f"{libs}/*",
        main,
        *args,
    ]


def metadata_brokers(host: str, port: int, timeout: float = 2.0) -> list[int]:
    """Send a Kafka Metadata v4 request (no topics) and return the broker ids it lists."""
    client_id = b"keylane-launcher"
    body = struct.pack(">hhih", 3, 4, 1, len(client_id)) + client_id
    body += struct.pack(">ib", 0, 0)  # topics: empty array; allow_auto_topic_creation: false
    with socket.create_connection((host, port), timeout=timeout) as conn:
        conn.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", _recv_exact(conn, 4))[0]
        payload = _recv_exact(conn, size)
    offset = 4 + 4  # correlation id, throttle_time_ms
    (count,) = struct.unpack_from(">i", payload, offset)
    offset += 4
    ids = []
    for _ in range(count):
        (node_id,) = struct.unpack_from(">i", payload, offset)
        offset += 4
        (host_len,) = struct.unpack_from(">h", payload, offset)
        offset += 2 + host_len + 4  # host, port
        (rack_len,) = struct.unpack_from(">h", payload, offset)
        offset += 2 + max(rack_len, 0)
        ids.append(node_id)
    return ids


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = conn.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        chunks += chunk
    return bytes(chunks)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _CHILDREN[pid]
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0); reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == 0


def read_cluster(state_dir: Path) -> Cluster | None:
    path = state_dir / "cluster.json"
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    return Cluster(state_dir=raw["state_dir"], nodes=[Node(**n) for n in raw["nodes"]])


def running_cluster(state_dir: Path) -> Cluster | None:
    cluster = read_cluster(state_dir)
    if cluster and all(_alive(n.pid) for n in cluster.nodes):
        return cluster
    return None


def start(state_dir: Path, nodes: int = 1, port: int = 0, quiet: bool = False) -> Cluster:
    """Start (or reuse) an N-node KRaft cluster under state_dir; return it once it serves."""
    state_dir = state_dir.resolve()
    existing = running_cluster(state_dir)
    if existing is not None:
        if len(existing.nodes) != nodes:
            raise LauncherError(
                f"a {len(existing.nodes)}-node cluster already runs in {state_dir}; "
                "stop it first (make broker-stop)"
            )
        return existing
    if nodes < 1:
        raise LauncherError("--nodes must be at least 1")
    previous = read_cluster(state_dir)
    if previous is not None:
        stop(state_dir, quiet=True)  # half-dead leftovers from a crash
        if port == 0 and len(previous.nodes) == nodes:
            port = previous.nodes[0].port  # keep the address a user may have noted
    libs = ensure_jars()
    attempts = 1 if port else START_ATTEMPTS  # ports we chose ourselves may be chosen again
    for attempt in range(attempts):
        try:
            return _start_once(state_dir, libs, nodes, port or free_port_pair(nodes), quiet)
        except PortTaken:
            if attempt == attempts - 1:
                raise
            stop(state_dir, quiet=True)
    raise LauncherError("no attempt to start kafka was made")


def _start_once(state_dir: Path, libs: Path, nodes: int, base: int, quiet: bool) -> Cluster:
    planned = plan_nodes(state_dir, nodes, base)
    busy = [p for n in planned for p in (n.port, n.controller_port) if not _port_free(p)]
    if busy:
        raise PortTaken(f"ports {busy} on 127.0.0.1 are in use; pass another --port")

    cluster_id_file = state_dir / "cluster-id"
    state_dir.mkdir(parents=True, exist_ok=True)
    if not cluster_id_file.exists():
        cluster_id_file.write_text(_kafka_uuid())
    cluster_id = cluster_id_file.read_text().strip()

    started: list[Node] = []
    try:
        for node in planned:
            node_dir = Path(node.data_dir)
            node_dir.mkdir(parents=True, exist_ok=True)
            props = node_dir / "server.properties"
            props.write_text(server_properties(node, planned))
            (node_dir / "server.log").unlink(missing_ok=True)  # this start's log only
            (node_dir / "log4j.properties").write_text(LOG4J.format(log=node_dir / "server.log"))
            fmt = subprocess.run(
                _java_cmd(
                    libs,
                    node_dir,
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(props),
                    "--ignore-formatted",
                ),
                capture_output=True,
                text=True,
                check=False,
            )
            if fmt.returncode != 0:
                raise LauncherError(f"formatting node {node.node_id} failed: {fmt.stderr.strip()[-300:]}")
            started.append(_launch(libs, node))
        cluster = Cluster(state_dir=str(state_dir), nodes=started)
        _write_cluster(cluster)
        _wait_ready(cluster)
    except BaseException:
        _kill_nodes(started, quiet=True)
        _forget_cluster(state_dir)
        raise
    if not quiet:
        print(f"kafka {KAFKA_VERSION}: {nodes} node(s) ready at {cluster.bootstrap} (data: {state_dir})")
        if nodes > 1:
            print(
                f"keylane on this cluster: set -a; . {state_dir / 'keylane.env'}; set +a  "
                f"(replication factor {replication_factor(nodes)}, min.insync.replicas "
                f"{min_insync_replicas(nodes)})"
            )
    return cluster


def _launch(libs: Path, node: Node) -> Node:
    """Start one formatted node's JVM as its own session; the node with its pid."""
    node_dir = Path(node.data_dir)
    with open(node_dir / "stdout.log", "ab") as out:
        proc = subprocess.Popen(
            _java_cmd(libs, node_dir, "kafka.Kafka", str(node_dir / "server.properties")),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    _CHILDREN[proc.pid] = proc
    return Node(**{**asdict(node), "pid": proc.pid})


def _recorded_node(state_dir: Path, node_id: int) -> tuple[Cluster, Node]:
    cluster = read_cluster(state_dir.resolve())
    if cluster is None:
        raise LauncherError(f"no local kafka recorded in {state_dir}")
    for node in cluster.nodes:
        if node.node_id == node_id:
            return cluster, node
    raise LauncherError(f"the cluster in {state_dir} has no node {node_id}")


def kill_node(state_dir: Path, node_id: int) -> None:
    """kill -9 one node of the cluster: a crash, no controlled shutdown (for fault tests)."""
    _cluster, node = _recorded_node(state_dir, node_id)
    if _alive(node.pid):
        _signal_group(node.pid, signal.SIGKILL)
    while _alive(node.pid):
        time.sleep(0.05)


def restart_node(state_dir: Path, node_id: int) -> Cluster:
    """Start a stopped node again on its data and ports; returns once every node lists all
    brokers (the node's log, appended to, keeps what it said before the crash)."""
    cluster, node = _recorded_node(state_dir, node_id)
    if _alive(node.pid):
        raise LauncherError(f"node {node_id} still runs (pid {node.pid}); kill it first")
    restarted = _launch(ensure_jars(), node)
    cluster = Cluster(
        state_dir=cluster.state_dir,
        nodes=[restarted if n.node_id == node_id else n for n in cluster.nodes],
    )
    _write_cluster(cluster)
    _wait_ready(cluster)
    return cluster


def _kafka_uuid() -> str:
    """A KRaft cluster id; like Kafka's Uuid.randomUuid, never one that starts with '-'
    (the storage tool's argument parser would read it as an option)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def keylane_env(cluster: Cluster) -> dict[str, str]:
    """The environment keylane's processes need for this cluster."""
    return {
        "KEYLANE_BOOTSTRAP_SERVERS": cluster.bootstrap,
        "KEYLANE_REPLICATION_FACTOR": str(replication_factor(len(cluster.nodes))),
    }


def _write_cluster(cluster: Cluster) -> None:
    env = "".join(f"{name}={value}\n" for name, value in keylane_env(cluster).items())
    (Path(cluster.state_dir) / "keylane.env").write_text(env)
    path = Path(cluster.state_dir) / "cluster.json"
    path.write_text(
        json.dumps(
            {
                "state_dir": cluster.state_dir,
                "bootstrap": cluster.bootstrap,
                "nodes": [asdict(n) for n in cluster.nodes],
            },
            indent=2,
        )
    )


def _forget_cluster(state_dir: Path) -> None:
    """Remove what advertises the cluster (its address, its pids) once its nodes are stopped."""
    for name in ("keylane.env", "cluster.json"):
        (state_dir / name).unlink(missing_ok=True)


def _wait_ready(cluster: Cluster) -> None:
    want = {n.node_id for n in cluster.nodes}
    deadline = time.monotonic() + START_TIMEOUT_S
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        dead = [n for n in cluster.nodes if not _alive(n.pid)]
        if dead:
            log = Path(dead[0].data_dir) / "server.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            if "Address already in use" in text:
                raise PortTaken(
                    f"kafka node {dead[0].node_id}: port {dead[0].port} was taken during start-up"
                )
            hint = text.strip().splitlines()[-3:]
            raise LauncherError(f"kafka node {dead[0].node_id} exited during start-up: {' | '.join(hint)}")
        try:
            if all(set(metadata_brokers("127.0.0.1", n.port)) >= want for n in cluster.nodes):
                return
            last_error = "not every broker is registered yet"
        except (OSError, struct.error) as exc:
            last_error = str(exc)
        time.sleep(0.25)
    raise LauncherError(
        f"kafka did not answer metadata requests within {START_TIMEOUT_S:.0f}s ({last_error})"
    )


def _kill_nodes(nodes: list[Node], quiet: bool) -> None:
    for node in nodes:
        if _alive(node.pid):
            _signal_group(node.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and any(_alive(n.pid) for n in nodes):
        time.sleep(0.2)
    for node in nodes:
        if _alive(node.pid):
            if not quiet:
                print(f"node {node.node_id} did not stop in {STOP_TIMEOUT_S:.0f}s; killing it")
            _signal_group(node.pid, signal.SIGKILL)
            while _alive(node.pid):
                time.sleep(0.05)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stop(state_dir: Path, quiet: bool = False) -> bool:
    """Stop every node recorded under state_dir and remove its cluster.json and keylane.env
    (a keylane.env with no cluster.json beside it too); True when something was running."""
    cluster = read_cluster(state_dir.resolve())
    if cluster is None:
        _forget_cluster(state_dir.resolve())  # an address nothing records as running
        if not quiet:
            print(f"no local kafka recorded in {state_dir}")
        return False
    was_running = any(_alive(n.pid) for n in cluster.nodes)
    _kill_nodes(cluster.nodes, quiet)
    _forget_cluster(Path(cluster.state_dir))
    if not quiet:
        print(f"kafka stopped ({len(cluster.nodes)} node(s), data kept in {cluster.state_dir})")
    return was_running


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Local Apache Kafka (KRaft) from Maven Central jars.")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(os.environ.get("KEYLANE_KAFKA_STATE", DEFAULT_STATE_DIR)),
        help="where data dirs, logs and cluster.json live (default: .kafka-local)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    start_p = sub.add_parser("start", help="start a cluster and wait until it serves")
    start_p.add_argument("--nodes", type=int, default=1, help="number of broker+controller nodes (default 1)")
    start_p.add_argument("--port", type=int, default=0, help="first broker port (default: a free one)")
    sub.add_parser("stop", help="stop the cluster (SIGTERM, then SIGKILL after 30 s)")
    sub.add_parser("status", help="print the bootstrap address of a running cluster")
    sub.add_parser("jars", help="only resolve and cache the jars")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            start(args.state_dir, nodes=args.nodes, port=args.port)
        elif args.command == "stop":
            stop(args.state_dir)
        elif args.command == "jars":
            print(ensure_jars())
        else:
            cluster = running_cluster(args.state_dir.resolve())
            if cluster is None:
                print("not running")
                return 1
            print(cluster.bootstrap)
    except LauncherError as exc:
        print(f"local_kafka: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Ray engine (the `ray` extra): the groups of jobs as a Ray Data dataset built in memory,
one row a group (so that Ray's batching cannot regroup them), drawn by `map_batches` over a pool
of actors, one pipeline built inside each actor.

The dataset comes from the planned jobs, not from a read step: a read task waiting for a CPU
that the actor pool holds would deadlock. Ray's own checkpointing is not used: the driver's
manifest (store.py) is what a resumed run starts from. The cluster is the one RAY_ADDRESS or
`address` names, checked before Ray is started (Ray's own connection to an address that does not
answer waits for minutes and ignores Ctrl-C), else the one started on this machine, else a local
one started here (and stopped at the end); its nodes are checked to hold the actors asked for.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import signal
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from minit2i.core.checks import read_limited
from minit2i.console import Terminated
from minit2i.core.errors import MiniT2IError
from minit2i.waits import addresses, signals_end_within

from .worker import Job, Painter, Spec

GPU_BACKENDS = ("cupy",)
# A cluster's address: its head's GCS, host:port as `ray start --head` prints it; "auto" the
# cluster started on this machine, "local" a new one.
ADDRESS = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]{1,253}):(?P<port>[0-9]{1,5})")
RAY_WORDS = ("auto", "local")
# The opening of an HTTP/2 connection (RFC 9113 3.4): the client's preface and an empty SETTINGS
# frame, to which a gRPC server answers with a SETTINGS frame; then a gRPC call (a HEADERS frame,
# its header block in HPACK's plainest form, RFC 7541 6.2.2, and an empty message in a DATA
# frame), which a gRPC server answers with HEADERS (or refuses: RST_STREAM, GOAWAY).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HTTP2_FRAME_HEADER = 9
HTTP2_MAX_FRAME = 2**14  # the frame size a server may send before it is told of a larger one
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY = 0, 1, 3, 4, 7
END_STREAM, ACK, END_HEADERS = 1, 1, 4
CALLED = "/grpc.health.v1.Health/Check"  # any method: a gRPC server answers even one it lacks
ADDRESS_FILE_LIMIT = 4096  # Ray's file of the last cluster's address: one HOST:PORT
LAST_CLUSTER_FIX = ("start it again (ray start --head), or stop what is left of it (ray stop) to have a local cluster "
                    "started for the run, or pass --ray-address")
# How long a cluster's address is given to answer, all together (the lookup of its host, a TCP
# connection, the opening of HTTP/2, a gRPC call): a head on the same network answers in
# milliseconds; Ray itself would wait for minutes.
ANSWER_SECONDS = 10
# How long ray.init is given to return to Python after Ctrl-C or SIGTERM: it returns within a second
# unless it waits in C, where it can stay for half a minute.
SIGNAL_GRACE_SECONDS = 5


class RayPainter:
    """One actor of the pool: a `Painter` built here; a batch of rows, each a group of jobs (JSON,
    `group_row`) -> one row per job with its pixels."""

    def __init__(self, spec: Spec):
        self.painter = Painter(spec)
        self.setup = json.dumps(self.painter.setup)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        work = [[Job(*fields) for fields in json.loads(str(row))] for row in batch["group"]]
        jobs = [job for group in work for job in group]
        return {"number": np.array([job.number for job in jobs]),
                "pixels": np.concatenate([self.painter.draw(group) for group in work]),
                "setup": np.array([self.setup] * len(jobs))}


def group_row(group: list[Job]) -> dict[str, str]:
    """A group as one dataset row: its jobs' fields as JSON (a prompt of any length or character
    travels as it is)."""
    return {"group": json.dumps([[job.number, job.index, job.k, job.prompt, job.seed] for job in group])}


def checked_address(address: str | None) -> str | None:
    """The cluster's address (`address`, else RAY_ADDRESS; None where neither is set: Ray joins
    the cluster started on this machine, else starts a local one), checked before Ray is
    started: Ray installed, the address a head's HOST:PORT (or "auto", "local") and answering
    within ANSWER_SECONDS (`check_answers`). A Ray Client address (ray://) is refused: Ray Data,
    which this engine runs on, does not run over Ray Client."""
    if importlib.util.find_spec("ray") is None:
        raise MiniT2IError("--engine ray needs Ray: pip install 'minit2i[ray]'")
    name = "--ray-address"
    if address is None:
        name, address = "RAY_ADDRESS", os.environ.get("RAY_ADDRESS") or None
    if address in (None, "auto"):
        check_last_cluster()
    if address is None or address in RAY_WORDS:
        return address
    if address.startswith("ray://"):
        raise MiniT2IError(f"{name} {json.dumps(address)} is a Ray Client address, and Ray Data, which --engine ray "
                           "runs on, does not run over Ray Client; run minit2i on a node of the cluster, with the "
                           "head's HOST:PORT (as ray start --head prints it)")
    form = ADDRESS.fullmatch(address)
    if not form or not 1 <= int(form["port"]) <= 65535:
        raise MiniT2IError(f"{name} {json.dumps(address)} is not a Ray cluster's address; pass the head's HOST:PORT "
                           f"(as ray start --head prints it), or {' or '.join(RAY_WORDS)}")
    check_answers(form["host"].strip("[]"), int(form["port"]), f"{name} {address}")
    return address


def check_last_cluster() -> None:
    """Without an address (or with "auto") Ray joins the cluster `ray start` last started on this
    machine, whose address it keeps in a file (Ray 2.60's, found with its own function), and
    waits for minutes if that cluster is gone without `ray stop`: it must answer as an address
    given does."""
    from ray._private.utils import get_ray_address_file

    path = Path(get_ray_address_file(None))
    if not path.exists():
        return
    address = read_limited(path, "Ray's address file", ADDRESS_FILE_LIMIT).decode("utf-8", "replace").strip()
    form = ADDRESS.fullmatch(address)
    named = f"the Ray cluster last started on this machine ({path}: {json.dumps(address)})"
    if not form:
        raise MiniT2IError(f"{named} is not an address; {LAST_CLUSTER_FIX}")
    check_answers(form["host"].strip("[]"), int(form["port"]), named, LAST_CLUSTER_FIX)


def check_answers(host: str, port: int, named: str,
                  fix: str = "start the cluster (ray start --head) or correct the address") -> None:
    """The Ray head at `host`:`port` resolves, takes a TCP connection, answers the opening of an
    HTTP/2 connection with its settings and a gRPC call with its headers, as the gRPC server of
    its GCS does, all within ANSWER_SECONDS, and Ctrl-C or SIGTERM ends every wait: otherwise
    one line. Ray's own connection, tried on an address that does not answer, waits for minutes
    and ignores Ctrl-C."""
    deadline = time.monotonic() + ANSWER_SECONDS
    try:
        found = addresses(host, port, ANSWER_SECONDS)
    except socket.gaierror as err:
        raise MiniT2IError(f"{named}: cannot find the host {host} ({err.strerror}); {fix}") from None
    with connected(found, deadline, named, fix) as connection:
        try:
            connection.sendall(HTTP2_PREFACE + frame(SETTINGS, 0, 0, b""))
            answered = read_frame(connection, deadline)[0] == SETTINGS
        except (OSError, ValueError):  # a timeout, the connection reset, a frame no HTTP/2 server sends
            answered = False
        if not answered:
            raise MiniT2IError(f"{named}: something takes connections there but does not answer as a Ray cluster "
                               f"(no HTTP/2 settings within {ANSWER_SECONDS} s); {fix}")
        try:
            connection.sendall(frame(SETTINGS, ACK, 0, b"") + grpc_call(f"{host}:{port}" if ":" not in host
                                                                         else f"[{host}]:{port}"))
            while read_frame(connection, deadline)[0] not in (HEADERS, RST_STREAM, GOAWAY):
                pass  # settings, window updates, pings: not yet the answer
        except (OSError, ValueError):
            raise MiniT2IError(f"{named}: something there opens HTTP/2 connections but does not answer a call as a "
                               f"Ray cluster does (no answer within {ANSWER_SECONDS} s); {fix}") from None


@contextlib.contextmanager
def connected(found: list[tuple], deadline: float, named: str, fix: str) -> Iterator[socket.socket]:
    """A TCP connection to the first of the `found` addresses (socket.getaddrinfo's) that takes
    one before `deadline` (time.monotonic's); none is one line."""
    failure: OSError = TimeoutError()
    for family, kind, protocol, _, address in found:
        connection = socket.socket(family, kind, protocol)
        try:
            connection.settimeout(max(deadline - time.monotonic(), 0.001))
            connection.connect(address)
            break
        except OSError as err:
            connection.close()
            failure = err
    else:
        if isinstance(failure, TimeoutError):
            raise MiniT2IError(f"{named}: the Ray cluster does not answer (no connection within {ANSWER_SECONDS} s); "
                               f"{fix}")
        raise MiniT2IError(f"{named}: the Ray cluster does not answer ({failure.strerror or failure}); {fix}")
    with connection:
        yield connection


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    """An HTTP/2 frame (RFC 9113 4.1): length, type, flags, stream, payload."""
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def read_frame(connection: socket.socket, deadline: float) -> tuple[int, int, bytes]:
    """(type, stream, payload) of the next frame the server sends before `deadline`; TimeoutError
    after it, ValueError for a frame larger than a server may send, ConnectionError at the end."""
    header = received(connection, HTTP2_FRAME_HEADER, deadline)
    length = int.from_bytes(header[:3], "big")
    if length > HTTP2_MAX_FRAME:
        raise ValueError(f"an HTTP/2 frame of {length} bytes")
    return header[3], int.from_bytes(header[5:9], "big") & 0x7FFFFFFF, received(connection, length, deadline)


def received(connection: socket.socket, size: int, deadline: float) -> bytes:
    """Exactly `size` bytes from `connection` before `deadline`."""
    data = b""
    while len(data) < size:
        connection.settimeout(max(deadline - time.monotonic(), 0.001))
        part = connection.recv(size - len(data))
        if not part:
            raise ConnectionError("the connection was closed")
        data += part
    return data


def grpc_call(authority: str) -> bytes:
    """The frames of a gRPC call of CALLED on stream 1 with an empty message: HEADERS (each field
    a literal without indexing, RFC 7541 6.2.2) and DATA (the message's 5-byte prefix)."""
    fields = ((":method", "POST"), (":scheme", "http"), (":path", CALLED), (":authority", authority),
              ("content-type", "application/grpc"), ("te", "trailers"))
    block = b"".join(b"\0" + hpack_string(name) + hpack_string(value) for name, value in fields)
    return frame(HEADERS, END_HEADERS, 1, block) + frame(DATA, END_STREAM, 1, bytes(5))


def hpack_string(text: str) -> bytes:
    """A string literal of HPACK (RFC 7541 5.2), not Huffman-coded: its length as a 7-bit-prefix
    integer (5.1), then its bytes."""
    data, length = text.encode(), len(text.encode())
    if length < 127:
        return bytes([length]) + data
    prefix, length = [127], length - 127
    while length >= 128:
        prefix.append(length % 128 + 128)
        length //= 128
    return bytes([*prefix, length]) + data


@contextlib.contextmanager
def joined_cluster(spec: Spec, workers: int | None, address: str | None):
    """The Ray cluster at `address` (checked by `checked_address`; None: the one started on this
    machine, else a local one started here and stopped at the end) joined, and the actors it can
    hold counted (`actor_count`), before the run folder is touched -> a function of the jobs to
    their (number, pixels, numerical setup) as the actors draw them (`on_ray`)."""
    import ray
    import ray.data  # before the loggers' levels are set: importing it sets its own

    for name in ("ray", "ray.data"):  # its notes would break the driver's progress bar
        logging.getLogger(name).setLevel(logging.ERROR)
    started = not ray.is_initialized()
    if started:
        # ray.init makes SIGTERM a bare sys.exit as it starts (status 15, no message, no clean-up):
        # that exit is the CLI's SIGTERM, and the handler it replaced (the CLI's, which ends the run
        # as Ctrl-C does) is put back, whatever ray.init ends with. It can wait in C for tens of
        # seconds, deaf to signals, for a cluster whose processes a SIGTERM to the process group
        # ended: a signal ends it within SIGNAL_GRACE_SECONDS (the run folder is not yet touched).
        terminate = signal.getsignal(signal.SIGTERM)
        try:
            with signals_end_within(SIGNAL_GRACE_SECONDS):
                ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        except SystemExit as exit_:
            if exit_.code != signal.SIGTERM:
                raise
            raise Terminated from None
        except (ConnectionError, ValueError, RuntimeError, TimeoutError) as err:
            reason = " ".join(str(err).split())
            raise MiniT2IError(f"cannot join the Ray cluster at {address or 'this machine'}: {reason[:300]}; check "
                               "that it runs (ray status), and for a cluster with token authentication (Ray's "
                               "default) set RAY_AUTH_MODE=token") from None
        finally:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, terminate)
    try:
        gpus = 1 if spec.backend in GPU_BACKENDS else 0
        nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
        actors = actor_count(nodes, spec.threads, gpus, workers)
        yield lambda work: on_ray(work, spec, actors, gpus)
    finally:
        if started:
            ray.shutdown()


def on_ray(work: list[list[Job]], spec: Spec, actors: int, gpus: int) -> Iterator[tuple]:
    """Each group drawn on the joined cluster by a pool of `actors` actors (no more than the
    groups: Ray Data warns of each actor left without one) of `spec.threads` CPUs and `gpus` GPUs
    each."""
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the driver's bar counts the images
    rows = [group_row(group) for group in work]
    # max_restarts=0: an actor that dies stops the run, which its rerun continues (store.py). Ray
    # Data restarts actors by default, and Ray then logs an error line on every run (their
    # constructor's arguments in the object store could be lost); 2.60 takes the setting only as
    # a keyword it deprecates.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        drawn = ray.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
            RayPainter, fn_constructor_kwargs={"spec": spec}, batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=min(actors, len(rows))), num_cpus=spec.threads, num_gpus=gpus,
            max_restarts=0)
    try:
        for batch in drawn.iter_batches(batch_size=None, batch_format="numpy"):
            for number, pixels, setup in zip(batch["number"], batch["pixels"], batch["setup"]):
                yield int(number), pixels, json.loads(str(setup))
    except Exception as err:  # noqa: BLE001 - raised again, unwrapped where Ray wrapped ours
        raise actor_error(err) from None


def actor_count(nodes: list[dict], threads: int, gpus: int, workers: int | None) -> int:
    """The actors to start on a cluster whose live nodes have the resources `nodes` ({"CPU": 2.0,
    "GPU": 1.0, ...} each), each actor asking for `threads` CPUs and `gpus` GPUs: `workers`, or
    as many as the nodes hold. An actor no node can hold would wait for ever: refused in one
    line, as are more `workers` than the nodes hold."""
    def held(node: dict) -> int:
        cpu_slots = int(node.get("CPU", 0) // threads)
        return min(cpu_slots, int(node.get("GPU", 0) // gpus)) if gpus else cpu_slots

    room = sum(held(node) for node in nodes)
    if not room:
        most = max((int(node.get("CPU", 0)) for node in nodes), default=0)
        if gpus and not any(node.get("GPU", 0) for node in nodes):
            raise MiniT2IError(f"the Ray cluster has no GPU for --backend {', '.join(GPU_BACKENDS)}; add a GPU node "
                               "or use --backend numpy")
        raise MiniT2IError(f"--threads {threads}: each actor asks for {threads} CPUs, and no node of the Ray cluster "
                           f"has that many (the largest has {most}); pass --threads {max(most, 1)} or fewer")
    if workers is not None and workers > room:
        raise MiniT2IError(f"--workers {workers}: the Ray cluster's nodes hold {room} actors of {threads} CPUs"
                           f"{' and 1 GPU' if gpus else ''} each; pass --workers {room} or fewer, or fewer --threads")
    return workers or room


def actor_error(err: BaseException) -> BaseException:
    """The MiniT2IError an actor raised (a NaN image, a model file gone), found in the chain of
    Ray's wrappers, whose own message is the actor's whole traceback; else `err` itself."""
    from ray.exceptions import RayError

    seen, link = set(), err
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        for candidate in (link, getattr(link, "cause", None)):
            if isinstance(candidate, MiniT2IError) and not isinstance(candidate, RayError):
                return candidate
        link = link.__cause__ or link.__context__ or getattr(link, "cause", None)
    return err

"""The hosts of an ``hpp profile-network`` run: a roll call before any rank starts, and who stopped answering.

Every host runs ``hpp profile-network`` with its ``--node-rank``, the same ``--nnodes`` and
``--rdzv-endpoint HOST:PORT`` (node rank 0's address). Before torchrun starts any rank, node rank 0's
launcher listens on ``PORT`` (:mod:`multiprocessing.connection`, authenticated, JSON messages) and every
other launcher connects and says who it is (:class:`HostInfo`: host name, device type and count, zone,
the flags every host must share). Node rank 0 answers all of them at once, when all ``nnodes`` have
answered, with the table of hosts and the port of torchrun's rendezvous, or with the one-line error
every host then prints (exit 2): the node ranks that did not answer within the rendezvous timeout, a
node rank given twice, flags that differ between hosts, zones given on some hosts only. A host that
cannot reach node rank 0 within the timeout says so, naming it.

The connections stay open while the ranks measure. A launcher that goes away (killed, its host down)
closes its connection; node rank 0 sees it at once and tells the others, so that when the ranks then
fail (their peers' sockets closed), every surviving host names the host that stopped
(:meth:`Rendezvous.lost`) instead of its own ranks. A launcher that ends says so first (``done``), with
its failure line if it failed, so that an orderly end is not taken for a lost host.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from hpp.errors import HppInputError
from hpp.wording import count

__all__ = ["HostInfo", "Rendezvous", "AUTH_KEY"]

logger = logging.getLogger(__name__)

#: The launchers' handshake key (not a secret: it keeps other programs that connect to the port out of the roll call).
AUTH_KEY = b"hpp profile-network"
_POLL_S = 0.2
#: Seconds node rank 0 waits, at the end, for the other launchers to say they are done.
_DONE_WAIT_S = 60.0
#: Seconds another launcher waits, at the end, for node rank 0's summary (its torchrun may end later).
_SUMMARY_WAIT_S = 60.0


@dataclass(frozen=True)
class HostInfo:
    """What a host says in the roll call.

    Attributes
    ----------
    node_rank : int
    hostname : str
    device_type : str
        The type of all its devices (a node holds one type).
    num_devices : int
        Ranks it starts (one per device).
    zone : str or None
    memory_bytes : int
        Memory of one device [bytes] (CUDA: the GPU's; CPU: the host's memory / its devices).
    settings : dict
        The flags every host must be given alike (message sizes, repeats, backend), by flag name.
    """

    node_rank: int
    hostname: str
    device_type: str
    num_devices: int
    zone: str | None
    memory_bytes: int
    settings: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``node rank R (hostname)``."""
        return f"node rank {self.node_rank} ({self.hostname})"


def _send(conn: Connection, msg: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps(msg).encode())


def _recv(conn: Connection) -> dict[str, Any]:
    return json.loads(conn.recv_bytes().decode())


def _free_port() -> int:
    """A TCP port free on every interface of this host right now (torchrun's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class Rendezvous:
    """The roll call of one host (module docstring). Node rank 0 serves it; the others connect.

    Parameters
    ----------
    endpoint : str or None
        ``HOST:PORT`` of node rank 0 (None with one host: nothing to call).
    nnodes, node_rank : int
    timeout_s : float
        How long the roll call waits for every host [s].

    Use :meth:`gather` once, then :meth:`failed` if this host's ranks failed or :meth:`finish` if they succeeded;
    as a context manager, the connections are closed at its end whatever happened.
    """

    def __init__(self, endpoint: str | None, *, nnodes: int, node_rank: int, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.nnodes = nnodes
        self.node_rank = node_rank
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._hosts: dict[int, HostInfo] = {}
        self._conns: dict[int, Connection] = {}
        self._claims: dict[int, int] = {}
        self._lost: dict[int, str] = {}          # node rank -> what is known of it (stopped / its failure line)
        self._done: dict[int, dict[str, Any]] = {}
        self._summary: dict[str, Any] | None = None
        self._listener: Listener | None = None
        self._server: Connection | None = None   # a client's connection to node rank 0
        self._closing = False
        self._verdict_given = False
        self._extra: list[Connection] = []        # hosts that claimed a node rank another host has

    # ------------------------------------------------------------------ the roll call

    def gather(self, me: HostInfo) -> tuple[tuple[HostInfo, ...], int | None]:
        """Every host's :class:`HostInfo` by node rank, and the port of torchrun's rendezvous on node rank 0's host
        (None with one host).

        Raises
        ------
        HppInputError
            A host that did not answer within the timeout (naming its node rank), node rank 0 unreachable, a node
            rank given twice, flags that differ, zones on some hosts only, a port node rank 0 cannot listen on.
        """
        if self.nnodes == 1:
            return (me,), None
        return self._serve(me) if self.node_rank == 0 else self._call(me)

    def _where(self) -> tuple[str, int]:
        host, _, port = str(self.endpoint).rpartition(":")
        return host, int(port)

    def _serve(self, me: HostInfo) -> tuple[tuple[HostInfo, ...], int]:
        host, port = self._where()
        try:
            self._listener = Listener(("", port), authkey=AUTH_KEY)
        except OSError as exc:
            raise HppInputError(f"node rank 0 cannot listen on port {port} ({exc.strerror or exc})",
                                field="--rdzv-endpoint", fix="give a free port of this host") from None
        self._hosts[0] = me
        threading.Thread(target=self._accept, daemon=True, name="hpp-rendezvous-accept").start()
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            self._cond.wait_for(lambda: all(r in self._hosts for r in range(self.nnodes)),
                                timeout=max(0.0, deadline - time.monotonic()))
            self._verdict_given = True
            hosts = dict(self._hosts)
            claims = dict(self._claims)
        error = self._verdict_error(hosts, claims, me)
        torchrun_port = _free_port()
        for conn in [*self._conns.values(), *self._extra]:
            try:
                _send(conn, {"error": error} if error else
                      {"hosts": [asdict(hosts[i]) for i in range(self.nnodes)], "port": torchrun_port})
            except OSError:
                pass
        if error:
            raise HppInputError(error)
        return tuple(hosts[i] for i in range(self.nnodes)), torchrun_port

    def _verdict_error(self, hosts: dict[int, HostInfo], claims: dict[int, int], me: HostInfo) -> str | None:
        """The one-line error of the roll call, None if every host answered and agrees."""
        extra = sorted(r for r in hosts if not 0 <= r < self.nnodes)
        if extra:
            return (f"{hosts[extra[0]].label} is not a node rank of {self.nnodes} hosts (0..{self.nnodes - 1}). Fix: "
                    f"give every host --nnodes {self.nnodes} and its own --node-rank in 0..{self.nnodes - 1}")
        missing = [r for r in range(self.nnodes) if r not in hosts]
        if missing:
            who = f"node rank {missing[0]}" if len(missing) == 1 else f"node ranks {missing}"
            return (f"{who} did not answer within {self.timeout_s:g} s at {self.endpoint} (rendezvous; "
                    f"{count(len(hosts), 'host')} of {self.nnodes} answered). Fix: start hpp profile-network on "
                    f"{'that host' if len(missing) == 1 else 'those hosts'} with --nnodes {self.nnodes} "
                    f"--node-rank R --rdzv-endpoint {self.endpoint}, or check the address and the firewall")
        twice = sorted(r for r, n in claims.items() if n > 1)
        if twice:
            return (f"node rank {twice[0]} was given to {claims[twice[0]]} hosts. Fix: give each host its own "
                    f"--node-rank in 0..{self.nnodes - 1}")
        for r in range(1, self.nnodes):
            for flag, value in me.settings.items():
                theirs = hosts[r].settings.get(flag)
                if theirs != value:
                    return (f"{hosts[r].label} was started with {flag} {theirs}, {me.label} with {value}. Fix: give "
                            f"every host the same {flag}")
        zoned = [h for h in hosts.values() if h.zone is not None]
        if zoned and len(zoned) != len(hosts):
            bare = next(h for h in hosts.values() if h.zone is None)
            return (f"{bare.label} has no --zone while {zoned[0].label} is in zone {zoned[0].zone}. Fix: give every "
                    "host its --zone, or none")
        return None

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn = self._listener.accept()
            except Exception as exc:  # noqa: BLE001 - a stranger on the port (bad handshake) must not end the call
                if self._closing:                 # the listener was closed: the run is over
                    return
                logger.info("ignored a connection to the rendezvous port: %s", exc)
                time.sleep(_POLL_S)
                continue
            if self._closing:
                conn.close()
                return
            threading.Thread(target=self._serve_one, args=(conn,), daemon=True, name="hpp-rendezvous-host").start()

    def _serve_one(self, conn: Connection) -> None:
        """Read one host's roll-call answer, then follow it until it says it is done or goes away."""
        try:
            if not conn.poll(self.timeout_s):
                conn.close()
                return
            info = HostInfo(**_recv(conn)["host"])
        except (OSError, EOFError, ValueError, TypeError, KeyError):
            conn.close()
            return
        r = info.node_rank
        with self._cond:
            late = self._verdict_given
            if not late:
                self._claims[r] = self._claims.get(r, 1 if r == 0 else 0) + 1
                if r not in self._hosts:
                    self._hosts[r] = info
                    self._conns[r] = conn
                else:                             # a second host with this node rank: told by the verdict
                    self._extra.append(conn)
            self._cond.notify_all()
        if late:                                  # the roll call ended without it
            try:
                _send(conn, {"error": f"{info.label} answered after node rank 0 stopped waiting "
                                      f"({self.timeout_s:g} s): start every host within the rendezvous timeout"})
            finally:
                conn.close()
            return
        if self._conns.get(r) is not conn:
            return
        while True:
            try:
                msg = _recv(conn)
            except (OSError, EOFError, ValueError):
                with self._cond:
                    if r not in self._done and not self._closing:
                        self._lost[r] = "stopped answering (its launcher went away)"
                        self._tell_others(r, {"lost": r, "what": self._lost[r]})
                    self._cond.notify_all()
                return
            with self._cond:
                if "done" in msg:
                    self._done[r] = msg
                    if not msg.get("ok"):
                        self._lost.setdefault(r, f"failed: {msg.get('line', '')}")
                        self._tell_others(r, {"lost": r, "what": self._lost[r]})
                self._cond.notify_all()

    def _tell_others(self, about: int, msg: dict[str, Any]) -> None:
        for r, conn in self._conns.items():
            if r != about and r not in self._done:
                try:
                    _send(conn, msg)
                except OSError:
                    pass

    def _call(self, me: HostInfo) -> tuple[tuple[HostInfo, ...], int]:
        host, port = self._where()
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:                                  # a bounded connect first: Client's own waits for the OS's timeout
                socket.create_connection((host, port), timeout=max(0.5, min(5.0, deadline - time.monotonic()))).close()
                self._server = Client((host, port), authkey=AUTH_KEY)
                break
            except (ConnectionRefusedError, socket.timeout, OSError) as exc:
                if time.monotonic() >= deadline:
                    raise HppInputError(f"node rank 0 did not answer within {self.timeout_s:g} s at {self.endpoint} "
                                        f"(rendezvous: {getattr(exc, 'strerror', None) or exc})",
                                        fix="start hpp profile-network with --node-rank 0 on that host, or check "
                                            "the address, the port and the firewall") from None
                time.sleep(_POLL_S)
        try:
            _send(self._server, {"host": asdict(me)})
            ready = self._server.poll(max(0.0, deadline - time.monotonic()) + self.timeout_s)
            verdict = _recv(self._server) if ready else None
        except (OSError, EOFError, ValueError):
            verdict = {"error": f"node rank 0 at {self.endpoint} went away during the rendezvous"}
        if verdict is None:
            raise HppInputError(f"node rank 0 at {self.endpoint} did not start the run within {2 * self.timeout_s:g} s",
                                fix="look at node rank 0's output: it names the hosts it waited for")
        if "error" in verdict:
            raise HppInputError(verdict["error"])
        threading.Thread(target=self._follow_server, daemon=True, name="hpp-rendezvous-follow").start()
        return tuple(HostInfo(**h) for h in verdict["hosts"]), int(verdict["port"])

    def _follow_server(self) -> None:
        """A client's watch of node rank 0: who it says was lost, the summary at the end, or its own end."""
        while True:
            try:
                msg = _recv(self._server)
            except (OSError, EOFError, ValueError):
                with self._cond:
                    if self._summary is None and not self._closing:
                        self._lost.setdefault(0, "stopped answering (its launcher went away)")
                    self._cond.notify_all()
                return
            with self._cond:
                if "lost" in msg:
                    self._lost.setdefault(int(msg["lost"]), str(msg.get("what", "stopped answering")))
                if "summary" in msg:
                    self._summary = msg["summary"]
                self._cond.notify_all()

    # ------------------------------------------------------------------ after the ranks

    def news(self) -> dict[int, str]:
        """What is known now of other hosts that failed or went away (node rank -> what), without waiting."""
        with self._cond:
            return {r: w for r, w in sorted(self._lost.items()) if r != self.node_rank}

    def failed(self, line: str, *, wait_s: float = 3.0) -> dict[int, str]:
        """This host's ranks failed (``line``): tell the other hosts (through node rank 0), then return what is known
        of the others (node rank -> ``stopped answering ...`` or ``failed: LINE``), waiting up to ``wait_s`` for news
        (a host's end reaches node rank 0, and from it the others, a moment after its ranks' sockets closed)."""
        if self.nnodes == 1:
            return {}
        news = {"lost": self.node_rank, "what": f"failed: {line}"}
        try:
            if self.node_rank == 0:
                with self._cond:
                    self._tell_others(0, news)
            elif self._server is not None:
                _send(self._server, {"done": True, "ok": False, "line": line})
        except OSError:
            pass
        with self._cond:
            self._cond.wait_for(lambda: any("stopped" in w for r, w in self._lost.items() if r != self.node_rank),
                                timeout=wait_s)
            return {r: w for r, w in sorted(self._lost.items()) if r != self.node_rank}

    def finish(self, summary: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """A run that succeeded: a client says it is done and returns node rank 0's ``summary`` (None if none came
        within a minute); node rank 0 waits for the others to be done, sends them ``summary``, and returns it."""
        if self.nnodes == 1:
            return summary
        if self.node_rank != 0:
            got = None
            if self._server is not None:
                try:
                    _send(self._server, {"done": True, "ok": True})
                    with self._cond:
                        self._cond.wait_for(lambda: self._summary is not None or 0 in self._lost,
                                            timeout=_SUMMARY_WAIT_S)
                        got = self._summary
                except OSError:
                    pass
            self.close()
            return got
        with self._cond:
            self._cond.wait_for(lambda: all(r in self._done or r in self._lost for r in self._conns),
                                timeout=_DONE_WAIT_S)
        for conn in list(self._conns.values()):
            try:
                _send(conn, {"summary": summary})
            except OSError:
                pass
        self.close()
        return summary

    def close(self) -> None:
        """Close the listener and every connection (idempotent)."""
        with self._cond:
            self._closing = True
            conns = [*self._conns.values(), *self._extra, *([self._server] if self._server is not None else [])]
        for conn in conns:
            try:
                conn.close()
            except OSError:
                pass
        if self._listener is not None:
            try:
                self._listener.close()
            except OSError:
                pass

    def __enter__(self) -> "Rendezvous":
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()

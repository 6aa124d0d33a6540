"""One cluster node process: media driver, archive and consensus agent on the conductor thread,
the clustered service on the service thread.

Start-up order (the reference's): the mark file (a second node on the same directory refuses to
start), logging, the media driver, the archive (which repairs a log torn by a crash before anything
reads it), the archive client, the consensus agent (node-state file, recording.log, recovery plan,
its channels), the service thread, then the election. SIGTERM or SIGINT is a graceful stop: the
log publication is closed, so followers see end of stream and elect at once; kill -9 is a crash,
which the files are built to survive. A cluster SHUTDOWN or ABORT (``cluster-node tool``) ends
the process the same way once this member has stopped at the termination position (exit 0).

The node writes ``READY member=<id> pid=<pid>`` on stdout once it runs, for supervisors
(``cluster-node up``) and tests, and ``STOPPED member=<id> pid=<pid> reason=<SIGTERM|SIGINT|
cluster-termination>`` once it has stopped as asked (a failure instead ends with one line on
stderr and its own exit code: cluster_node.exit_codes).
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import sys
import time
from contextlib import asynccontextmanager

import structlog
import trio

from cluster_node import affinity
from cluster_node.archive.client import ArchiveClient
from cluster_node.archive.conductor import ArchiveConfig, open_archive
from cluster_node.archive.storage import ArchiveDamagedError
from cluster_node.auth import AuthLoadError, load_authenticator, load_authorisation
from cluster_node.config import NodeConfig, free_fixed_udp_ports
from cluster_node.consensus.agent import ConsensusAgent
from cluster_node.consensus.node_files import MarkFile, MarkFileInUseError
from cluster_node.damaged_files import check_node_files, damaged
from cluster_node.driver_dir import claim, in_shm_root, prepare, sweep_orphans
from cluster_node.exit_codes import ExitCode, NodeFailure, fail
from cluster_node.keep_awake import KeepAwake
from cluster_node.media.distinct_errors import ERROR_TABLE_FILES
from cluster_node.media.driver import open_media_driver
from cluster_node.media.private_files import UnsafeDirectoryError, make_private_dir, tighten_own_dir
from cluster_node.node_identity import (
    NodeIdentityDamagedError,
    NodeIdentityError,
    check_identity,
    record_identity,
)
from cluster_node.secret_file import SecretFileError, read_key
from cluster_node.service.api import load_service
from cluster_node.service.container import ServiceContainer
from cluster_node.service.errors import SERVICE_ERRORS_TYPE_ID, ServiceErrorStop, service_errors_label
from cluster_node.service.skips import SkipListError
from cluster_node.service.skips import skip_positions as skip_positions_of

__all__ = ["run_node", "NodeStartError", "exit_on_component_failure"]

log = structlog.get_logger("node")


class NodeStartError(Exception):
    """The node cannot start (one line for the operator)."""


_GIL_SWITCH_INTERVAL_S = 0.0002
"""How soon a thread waiting for the GIL gets it (Python's default is 5 ms). The conductor and
service threads hand work to each other many times per client request; with the default, a
thread woken by a doorbell could wait up to 5 ms for the busy other one to let go."""


def _prepare_driver_dir(cfg: NodeConfig) -> None:
    """The driver directory (and the shared-memory root it is in) must be this user's alone
    (cluster_node.driver_dir.prepare). For one in shared memory (the default): remove those of
    deleted node directories, which nothing else would, and mark this one as the node
    directory's."""
    try:
        prepare(cfg.driver_dir)
    except UnsafeDirectoryError as e:
        raise NodeStartError(str(e)) from None
    except OSError as e:
        raise NodeStartError(
            f"cannot use the driver directory {cfg.driver_dir}: {e.strerror or e} "
            f"(set [driver] dir in the config to another directory)"
        ) from None
    if cfg.driver.dir or not in_shm_root(cfg.driver_dir):
        return
    removed = sweep_orphans()
    if removed:
        log.info(
            "driver directories of deleted node directories removed",
            count=len(removed),
            root=str(cfg.driver_dir.parent),
        )
    try:
        claim(cfg.driver_dir, cfg.node_dir)
    except OSError as e:
        raise NodeStartError(
            f"cannot use the driver directory {cfg.driver_dir}: {e.strerror or e} "
            f"(set [driver] dir in the config to another directory)"
        ) from None


@asynccontextmanager
async def _open_archive_or_refuse(driver, config: ArchiveConfig):
    """The node's archive; a damaged catalog or log found as it opens ends the node with
    DATA_DAMAGED and the archive's one line (which recording, where, what to do)."""
    opened = False
    try:
        async with open_archive(driver, config) as archive:
            opened = True
            yield archive
    except ArchiveDamagedError as e:
        if opened:
            raise
        fail(ExitCode.DATA_DAMAGED, str(e))


def member_keys(cfg: NodeConfig) -> dict:
    """The driver settings of member authentication: the keys of ``cluster.secret_file`` and
    ``cluster.previous_secret_file`` (none when unset). A file that cannot be used stops the
    start with one line naming the key and the file (cluster_node.secret_file)."""
    c = cfg.cluster
    if not c.member_auth:
        return {}
    keys = {}
    for name, arg in (("secret_file", "mac_key"), ("previous_secret_file", "mac_previous_key")):
        path = getattr(c, name).strip()
        if path:
            try:
                keys[arg] = read_key(path)
            except SecretFileError as e:
                raise NodeStartError(f"cluster.{name}: {e}") from None
    return keys


def member_hosts(cfg: NodeConfig) -> frozenset[str] | None:
    """The hosts members send from (each one's consensus host, where its driver binds its
    publications); None when one is a wildcard, which names no address to check against."""
    hosts = {m.send_host for m in cfg.cluster.members}
    if None in hosts:
        return None
    # A backup (cluster-node backup) copies from members' archives: its host is let in too.
    return frozenset(hosts | {h.strip() for h in cfg.cluster.backup_hosts.split(",") if h.strip()})


async def run_node(cfg: NodeConfig, *, announce: bool = True) -> None:
    sys.setswitchinterval(_GIL_SWITCH_INTERVAL_S)
    keys = member_keys(cfg)  # first: a node without its key does nothing else
    auth = "|auth=mac" if keys else ""
    node_dir = cfg.node_dir
    try:
        # Its files are the member's whole history: no other user reads them (cluster_node.media.private_files).
        make_private_dir(node_dir)
        tighten_own_dir(node_dir)
    except OSError as e:
        raise NodeStartError(f"cannot make the node directory {node_dir}: {e.strerror or e}") from None
    try:
        identity_recorded = check_identity(node_dir, cfg.member_id, cfg.node.cluster_id)
    except NodeIdentityDamagedError as e:
        raise damaged(str(e)) from None
    except NodeIdentityError as e:
        raise NodeStartError(str(e)) from None
    try:
        # Where this node keeps its files, for tools that only have the node directory.
        details = {
            "node_dir": str(node_dir.resolve()),
            "driver_dir": str(cfg.driver_dir.resolve()),
            "archive_dir": str(cfg.archive_dir.resolve()),
            "log_file": str(cfg.log_file.resolve()),
            "members": cfg.members_text,
            "service": cfg.node.service,
        }
        mark = MarkFile.open(node_dir, member_id=cfg.member_id, cluster_id=cfg.node.cluster_id, details=details)
    except MarkFileInUseError as e:
        raise NodeStartError(str(e)) from None
    if not identity_recorded:
        try:
            record_identity(node_dir, cfg.member_id, cfg.node.cluster_id)
        except OSError as e:
            mark.close()
            raise NodeStartError(
                f"cannot record the node directory's identity in {node_dir}: {e.strerror or e}"
            ) from None
    try:
        check_node_files(node_dir, cfg.archive_dir)
    except BaseException:
        mark.close()
        raise
    _prepare_driver_dir(cfg)
    service = load_service(cfg.node.service)
    try:
        authenticator = load_authenticator(cfg.auth)
        authorisation = load_authorisation(cfg.auth)
    except (AuthLoadError, SecretFileError) as e:
        mark.close()
        raise NodeStartError(str(e)) from None
    try:
        skip_positions = skip_positions_of(node_dir)
    except SkipListError as e:
        raise NodeStartError(str(e)) from None
    me = cfg.this_member
    agent = None
    try:
        async with open_media_driver(**cfg.driver_kwargs(), **keys) as driver:
            exit_on_component_failure(driver, ExitCode.DRIVER_FAILED)
            # Where other archives answer this one and replay to it when it replicates: concrete
            # ports, since the remote side must be told where to send. They are bound only when a
            # replication starts, maybe minutes from now, so they come from below the kernel's
            # ephemeral range: one from it could meanwhile be handed to any socket bound to port
            # 0 (a client, another node's publication), and the replication would find it taken.
            archive_host = me.archive.rpartition(":")[0]
            response_port, replication_port = free_fixed_udp_ports(2, archive_host)
            archive_cfg = ArchiveConfig(
                dir=cfg.archive_dir,
                control_channel=f"aeron:udp?endpoint={me.archive}{auth}",
                control_stream_id=cfg.archive.control_request_stream_id,
                segment_file_length=cfg.archive.segment_length,
                sync_level=cfg.archive.file_sync_level,
                frame_checksums=cfg.archive.frame_checksums,
                low_space_threshold=cfg.archive.low_space_threshold,
                replication_channel=f"aeron:udp?endpoint={archive_host}:{replication_port}{auth}",
                control_response_channel=f"aeron:udp?endpoint={archive_host}:{response_port}{auth}",
                # The control port takes requests from members' hosts only (with a key, MAC'd
                # ones too: a captured request sent on from elsewhere is refused as well).
                control_hosts=member_hosts(cfg),
            )
            async with _open_archive_or_refuse(driver, archive_cfg) as _archive:
                exit_on_component_failure(_archive, ExitCode.ARCHIVE_FAILED)
                _archive.on_data_damaged = lambda line: fail(ExitCode.DATA_DAMAGED, line)
                _archive.on_storage_failure = lambda line: fail(ExitCode.STORAGE_FAILED, line)
                client = await ArchiveClient.connect(driver)
                token = trio.lowlevel.current_trio_token()

                def open_egress(channel: str, stream_id: int):
                    # Called on the service thread (itself a trio loop, so trio.from_thread is
                    # refused): run the driver call on the conductor loop and wait for it.
                    done: concurrent.futures.Future = concurrent.futures.Future()

                    def call() -> None:
                        try:
                            # Exclusive: only the service thread offers to it (the agent's
                            # session events go out on publications of its own), so its offers
                            # skip the shared publication's lock, once per reply.
                            done.set_result(driver.add_publication(channel, stream_id, exclusive=True))
                        except BaseException as e:  # noqa: BLE001 - handed to the service thread
                            done.set_exception(e)

                    token.run_sync_soon(call)
                    return done.result(timeout=10)

                container_holder: list[ServiceContainer] = []
                agent = ConsensusAgent(
                    cfg, driver, client, service_bell=b"", authenticator=authenticator, authorisation=authorisation
                )
                # The archive's bad requests and failed requests count as the node's errors too
                # (an operator watches one counter).
                _archive.errors.on_record = agent.counters["errors"].add
                # Each component's distinct errors, with counts and times, for `tool errors`.
                for errors, component in (
                    (driver.errors, "driver"),
                    (_archive.errors, "archive"),
                    (agent.input_errors, "consensus"),
                ):
                    errors.path = node_dir / ERROR_TABLE_FILES[component]
                    errors.path.unlink(missing_ok=True)  # an earlier process's table
                container = ServiceContainer(
                    service,
                    member_id=cfg.member_id,
                    driver_dir=driver.dir,
                    commit_position=agent.counters["commit-pos"].get,
                    role=agent.counters["role"].get,
                    open_egress=open_egress,
                    hold_egress=driver.hold_sends,
                    release_egress=driver.release_sends,
                    liveness_timeout_ns=cfg.driver.image_liveness_timeout_ns,
                    snapshot_stream_id=cfg.cluster.service_snapshot_stream_id,
                    service_errors=cfg.node.service_errors,
                    skip_positions=skip_positions,
                    error_counter=driver.counters.allocate(
                        service_errors_label(cfg.member_id), SERVICE_ERRORS_TYPE_ID, cfg.member_id
                    ),
                    recovery_state=agent.recovery_state,
                )
                agent.service_bell = container.commit_doorbell.name
                agent.service_parked = container.is_parked
                service_ended = trio.Event()

                def on_service_exit() -> None:  # on the service thread, as it ends
                    try:
                        token.run_sync_soon(service_ended.set)
                    except trio.RunFinishedError:
                        pass

                container.on_exit = on_service_exit
                agent.wait_recording = _archive.wait_for_progress
                if cfg.node.keep_cpus_awake:
                    n = cfg.node
                    agent.keep_awake = KeepAwake(set(n.leader_cpus) | set(n.follower_cpus) or affinity.available_cpus())
                agent.record_now = _archive.record_now
                container_holder.append(container)
                if agent.keep_awake is not None:
                    agent.keep_awake.start()
                async with trio.open_nursery() as nursery:
                    await agent.start(nursery)
                    container.start()
                    agent_scope = trio.CancelScope()

                    async def run_agent() -> None:
                        with agent_scope:
                            try:
                                await agent.run()
                            except NodeFailure as e:  # its own exit code and line (PERSIST_FAILED)
                                fail(e.code, str(e))
                            except Exception as e:  # every failure ends the node alike
                                log.error("consensus module failed", error=repr(e), exc_info=True)
                                fail(ExitCode.CONSENSUS_FAILED, f"the consensus module failed: {type(e).__name__}: {e}")
                        agent_done.set()

                    agent_done = trio.Event()
                    nursery.start_soon(run_agent)
                    nursery.start_soon(_mark_file_activity, mark, cfg.timeouts.mark_file_update_interval_ns, driver)
                    nursery.start_soon(_watch_service, container, service_ended)
                    if announce:
                        print(f"READY member={cfg.member_id} pid={os.getpid()}", flush=True)
                    log.info("node started", member_id=cfg.member_id, pid=os.getpid(), service=cfg.node.service)
                    stop_reason = "?"
                    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                        async with trio.open_nursery() as waiters:

                            async def on_signal() -> None:
                                nonlocal stop_reason
                                async for signum in signals:
                                    stop_reason = signal.Signals(signum).name
                                    log.info("stopping", signal=stop_reason)
                                    break
                                waiters.cancel_scope.cancel()

                            async def on_termination() -> None:
                                nonlocal stop_reason
                                # SHUTDOWN or ABORT: the cluster stopped at a common position.
                                await agent.wait_terminated()
                                stop_reason = "cluster termination"
                                log.info("stopping", reason=stop_reason)
                                waiters.cancel_scope.cancel()

                            waiters.start_soon(on_signal)
                            waiters.start_soon(on_termination)
                    # The duty cycle stops first: closing uses the archive client, which must
                    # not have two readers.
                    agent_scope.cancel()
                    await agent_done.wait()
                    await agent.close()
                    container.stop()
                    await trio.to_thread.run_sync(container.join, 5.0)
                    nursery.cancel_scope.cancel()
                await client.close()
        if announce:
            # The counterpart of READY, for supervisors and for an operator at the console.
            print(
                f"STOPPED member={cfg.member_id} pid={os.getpid()} reason={stop_reason.replace(' ', '-')}", flush=True
            )
    finally:
        if agent is not None and agent.keep_awake is not None:
            agent.keep_awake.close()
        mark.close()


def exit_on_component_failure(component, code: ExitCode) -> None:
    """A task of ``component`` (the media driver or the archive) that fails ends the node with
    ``code`` and one line naming the task (cluster_node.media.task_failure, cluster_node.exit_codes), rather
    than unwinding the process under the service thread."""
    component.on_task_failure = lambda failure: fail(code, str(failure))


async def _mark_file_activity(mark: MarkFile, interval_ns: int, driver) -> None:
    """The mark file's liveness timestamp, on the driver's timer grid (it then shares a wake-up
    with the driver's heartbeats instead of costing one of its own)."""
    while True:
        mark.update_activity(time.time_ns() // 1_000_000)
        now = time.monotonic_ns()
        await trio.sleep(max(0, driver.coalesce(now + interval_ns, now) - now) / 1e9)


async def _watch_service(container: ServiceContainer, ended: trio.Event) -> None:
    """A service thread that dies takes the node down at once, with an exit code that says why
    (never 0: a supervisor must see a failure): its state would no longer follow the log, and a
    member without a service must not go on acking entries. SERVICE_ERROR_STOP when a callback
    raised under ``service_errors = "stop"``, SERVICE_FAILED for anything else (``on_start``,
    loading the snapshot, a callback outside the log's entries, a bug in the container). The
    thread sets ``ended`` as it finishes (``ServiceContainer.on_exit``); a thread that ends
    without an error was asked to (the node is stopping) and needs nothing."""
    await ended.wait()
    await trio.to_thread.run_sync(container.join, 5.0)
    error = container.error
    if error is None:
        return
    if isinstance(error, ServiceErrorStop):
        f = error.failure
        fail(
            ExitCode.SERVICE_ERROR_STOP,
            f"{error} (service_errors = stop; to pass over it on every member: cluster-node tool --dir <node dir>"
            f" skip-entry --position {f.log_position})",
            log_position=f.log_position,
            callback=f.callback,
        )
    text = " ".join(str(error).split())
    fail(ExitCode.SERVICE_FAILED, f"the service failed: {type(error).__name__}" + (f": {text}" if text else ""))

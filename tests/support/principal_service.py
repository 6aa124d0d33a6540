"""A kv service that tells which principal a session has, on every member: a GET of
``__whoami__<tag>`` makes each member write its session's ``encoded_principal`` (hex) to
``$CLUSTER_TEST_DIGEST_DIR/member<i>-whoami-<tag>.txt``. The GET goes through the log, so every
member answers for the same session at the same position: equal files prove every member's
service sees the same principal (after a replay, a snapshot load, a leader change alike)."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from tests.support.cluster import DigestKvService

WHOAMI_PREFIX = "__whoami__"


def whoami_file(digest_dir: Path, member_id: int, tag: str) -> Path:
    return Path(digest_dir) / f"member{member_id}-whoami-{tag}.txt"


class PrincipalKvService(DigestKvService):
    def on_session_message(self, session, timestamp: int, payload) -> None:
        super().on_session_message(session, timestamp, payload)
        try:
            request = msgspec.msgpack.decode(payload)
        except (msgspec.MsgspecError, ValueError, RecursionError):
            return
        if (
            isinstance(request, list)
            and len(request) == 3
            and request[0] == 2
            and isinstance(request[2], str)
            and request[2].startswith(WHOAMI_PREFIX)
            and session is not None
            and self.cluster is not None
        ):
            directory = os.environ.get("CLUSTER_TEST_DIGEST_DIR")
            if directory:
                tag = request[2][len(WHOAMI_PREFIX) :]
                whoami_file(Path(directory), self.cluster.member_id, tag).write_text(
                    f"{session.id} {bytes(session.encoded_principal).hex()}\n"
                )

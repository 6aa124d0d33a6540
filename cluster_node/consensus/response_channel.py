"""The rules of a client's response (egress) channel: which one a leader may answer on (core).

A connect request names the channel the client wants its egress on. A leader answers only on a
plain UDP endpoint of the request's own source host, on the cluster's egress stream, so that a
forged request cannot turn the cluster into a traffic source aimed at a third host; and a
session's later ingress must come from the host its egress goes to.
"""

from __future__ import annotations

from cluster_node.media.channel import ChannelError, parse, reply_channel_refusal


def response_channel_refusal(
    channel: str, stream_id: int, source_host: str | None, egress_stream_id: int
) -> str | None:
    """Why a connect request's response channel is refused, or None when it may be used:
    ``cluster_node.media.channel.reply_channel_refusal`` (a plain UDP endpoint of the request's own source),
    and the cluster's egress stream. The kind of refusal is the text before the first colon."""
    refusal = reply_channel_refusal(channel, source_host)
    if refusal is None and stream_id != egress_stream_id:
        return f"stream: the response stream must be the cluster's egress stream {egress_stream_id}, not {stream_id}"
    return refusal


def _response_host(channel: str) -> str | None:
    """The host a response channel sends to (None for IPC; "" when there is none): a client's
    ingress comes from the host it receives egress on (the client's driver sends from its
    egress host, and the leader answers a connect only on a channel naming the request's
    source)."""
    try:
        uri = parse(channel)
    except ChannelError:
        return ""
    if uri.is_ipc:
        return None
    return uri.endpoint[0] if uri.endpoint is not None else ""

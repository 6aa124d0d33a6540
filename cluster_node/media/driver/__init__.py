"""The media driver: the trio shell that owns sockets, log buffers and counters.

One driver per process (per node). It runs inside the caller's trio loop as a few tasks, each a
part of this package:

* ``sender_agent``: UDP publications and the sender task, which asks each publication's
  :class:`~cluster_node.media.sender_core.SenderCore` what to send and sends it;
* ``offers``: the sends made outside the sender task (a lone offer, a duty cycle's held sends,
  offers from another thread);
* ``receiver_agent``: UDP subscriptions, receive endpoints and images: what a received datagram
  does, checked by ``cluster_node.media.frames`` and each image's :class:`~cluster_node.media.receiver_core.ImageReceiverCore`;
* ``invoker``: the epoll set of every socket, and who reads it: the receiver task, or a duty
  cycle that claimed it (claim, park, receive work);
* ``conductor``: the periodic work (status messages, liveness, IPC, counters) and the timer grid;
* ``media_driver``: :class:`MediaDriver`, which holds the state and wires the parts, and
  :func:`open_media_driver`; ``config``: :class:`DriverConfig`; ``net_state``: the shell state of
  publications, images and endpoints the parts share.

**Why the parts are mixins of one object** rather than objects that call each other: the paths
taken per datagram and per offer cross the parts (a datagram read by the invoker lands in an image
of the receiver agent, whose status message goes out through the sender agent's socket helpers,
and may poke the conductor or wake the sender), and each crossing would cost an attribute lookup
and a call through another object on the hottest paths of the process. As mixins, every part's
methods and state are plain attributes of the driver. The state is created in one place,
``MediaDriver.__init__``, with a comment saying which part owns each field.

The driver's state is touched from its trio thread only, except a UDP publication's sender
state, which an offer from another thread may send under the publication's lock (``offers``).
UDP subscriptions are polled from that thread; a UDP publication may be *offered* from any thread
of the process; an exclusive one from one thread at a time. IPC publications and subscriptions can
be used from any thread or process that maps the same driver directory.
"""

from cluster_node.media.driver.config import DriverConfig
from cluster_node.media.driver.media_driver import MediaDriver, open_media_driver

# The driver's logger, as cluster_node.media.driver.log (a library logger: silent until logging is configured).
from cluster_node.media.driver.net_state import log as log

__all__ = ["DriverConfig", "MediaDriver", "open_media_driver"]

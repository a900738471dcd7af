#!/usr/bin/env python3
"""Holds every packet of one NFQUEUE queue for a fixed time, then lets it go: latency for the
host rig (`scripts/hosts.sh fault latency MS A B`), on a kernel without netem. hosts.sh runs one
in a host's network namespace, whose nftables output chain queues its packets to the other
group. Standard library only: nfnetlink_queue spoken over a raw netlink socket.

    rig-delay.py QUEUE MS

Prints "bound QUEUE" once it holds the queue. On SIGTERM it lets every held packet go and exits.
The queue is fail-open (a full queue passes packets undelayed rather than dropping them).
"""

import collections
import errno
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_FAIL_OPEN = 1
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
QUEUE_MAXLEN = 65536


def attr(kind, payload):
    """One netlink attribute, padded to 4 bytes."""
    head = struct.pack("=HH", 4 + len(payload), kind)
    return head + payload + b"\0" * (-len(payload) % 4)


def message(kind, queue, attrs, seq, flags=NLM_F_REQUEST):
    """A netlink message of the queue subsystem: nlmsghdr, nfgenmsg, attributes."""
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + b"".join(attrs)
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, seq, 0) + body


def messages(data):
    """(type, payload) of each netlink message in one datagram."""
    off = 0
    while off + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, off)
        if length < 16 or off + length > len(data):
            return
        yield kind, data[off + 16 : off + length]
        off += (length + 3) & ~3


def packet_id(payload):
    """The id in a packet message's NFQA_PACKET_HDR, or None."""
    off = 4  # nfgenmsg
    while off + 4 <= len(payload):
        length, kind = struct.unpack_from("=HH", payload, off)
        if length < 4:
            return None
        if kind & 0x7FFF == NFQA_PACKET_HDR and length >= 8:
            return struct.unpack_from("!I", payload, off + 4)[0]
        off += (length + 3) & ~3
    return None


def configure(sock, queue):
    """Binds the queue, asks for metadata only, makes it long and fail-open; raises on refusal."""
    requests = [
        [attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, 0))],
        [attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))],
        [attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN))],
        [attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN)), attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN))],
    ]
    for seq, attrs in enumerate(requests, 1):
        sock.send(message(NFQNL_MSG_CONFIG, queue, attrs, seq, NLM_F_REQUEST | NLM_F_ACK))
        for kind, payload in messages(sock.recv(65536)):
            if kind == NLMSG_ERROR:
                code = struct.unpack_from("=i", payload)[0]
                if code != 0:
                    raise OSError(-code, f"configure queue {queue} (request {seq})")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: rig-delay.py QUEUE MS")
    queue, delay_s = int(sys.argv[1]), int(sys.argv[2]) / 1000.0
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((0, 0))
    configure(sock, queue)
    print(f"bound {queue}", flush=True)

    held = collections.deque()  # (due, packet id), due in order: the delay is the same for all
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))

    def release(until):
        while held and held[0][0] <= until:
            _, pid = held.popleft()
            verdict = attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, pid))
            sock.send(message(NFQNL_MSG_VERDICT, queue, [verdict], 0))

    while not stopping:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else 1.0
        try:
            ready, _, _ = select.select([sock], [], [], timeout)
            if ready:
                now = time.monotonic()
                for kind, payload in messages(sock.recv(1 << 20)):
                    pid = packet_id(payload) if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET else None
                    if pid is not None:
                        held.append((now + delay_s, pid))
        except InterruptedError:
            continue
        except OSError as e:
            # Notifications lost to a full socket buffer (8 MiB: tens of thousands of packets held):
            # their packets get no verdict; go on with the others.
            if e.errno != errno.ENOBUFS:
                raise
        release(time.monotonic())
    release(float("inf"))


if __name__ == "__main__":
    main()

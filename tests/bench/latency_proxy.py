"""A loopback TCP proxy that delays every chunk it forwards, in each
direction, by a fixed time (issue 27 point 5: Redis behind 1 ms of added
latency, with no root and no tc netem). Chunks keep their order and are not
held back by one another: a chunk read at t leaves at t + delay, so a
pipeline sees the delay once, as on a real link.

  p = LatencyProxy(("127.0.0.1", redis_port), delay_s=0.001); p.port ...; p.close()
"""
import collections
import socket
import threading
import time


class LatencyProxy:
    def __init__(self, target, delay_s=0.001):
        self.target, self.delay = target, delay_s
        self.ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(64)
        self.port = self.ls.getsockname()[1]
        self.closed = False
        self.socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            s = socket.create_connection(self.target)
            for x in (c, s):
                x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.socks += [c, s]
            self._pipe(c, s)
            self._pipe(s, c)

    def _pipe(self, src, dst):
        q, cv = collections.deque(), threading.Condition()

        def reader():
            while True:
                try:
                    data = src.recv(1 << 16)
                except OSError:
                    data = b""
                with cv:
                    q.append((time.monotonic() + self.delay, data))
                    cv.notify()
                if not data:
                    return

        def writer():
            while True:
                with cv:
                    while not q:
                        cv.wait()
                    due, data = q.popleft()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    return
                try:
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=reader, daemon=True).start()
        threading.Thread(target=writer, daemon=True).start()

    def close(self):
        self.closed = True
        self.ls.close()
        for x in self.socks:
            try:
                x.close()
            except OSError:
                pass

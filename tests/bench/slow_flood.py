"""Slow clients for the front door's tests and its attack bench (issue 26):
tests/integration/test_door.py and tests/bench/attack_door.py both flood it
with this one class, so the test and the bench measure the same attack.

SlowFlood keeps n connections that send a request line and then one header
byte every `every` seconds, never finishing; each one the server closes is
opened again at once. sources: the local addresses they come from, round
robin (127.0.0.x: one address per attacker). Plain sockets and a selector
on a thread of its own; use it as a context manager.
"""
import selectors
import socket
import threading
import time


class SlowFlood:
    def __init__(self, port, n, sources, every=0.5):
        self.port, self.n, self.sources, self.every = port, n, sources, every
        self.sel = selectors.DefaultSelector()
        self.pending = {}  # socket -> what it sends next (the request line first)
        self.opened = self.reopened = 0
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def open_one(self, i):
        s = socket.socket()
        s.setblocking(False)
        s.bind((self.sources[i % len(self.sources)], 0))
        try:
            s.connect(("127.0.0.1", self.port))
        except BlockingIOError:
            pass
        self.sel.register(s, selectors.EVENT_READ, i)
        self.pending[s] = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        self.opened += 1

    def run(self):
        for i in range(self.n):
            self.open_one(i)
        next_tick = time.time()
        while not self.stop.is_set():
            for key, _ in self.sel.select(0.05):
                s, i = key.fileobj, key.data
                try:
                    gone = s.recv(4096) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    self.sel.unregister(s)
                    self.pending.pop(s, None)
                    s.close()
                    self.open_one(i)
                    self.reopened += 1
            if time.time() >= next_tick:
                next_tick += self.every
                for key in list(self.sel.get_map().values()):
                    s = key.fileobj
                    try:
                        s.send(self.pending.get(s) or b"X")
                        self.pending[s] = None
                    except OSError:  # BlockingIOError too: the byte waits for the next tick
                        pass
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join(10)

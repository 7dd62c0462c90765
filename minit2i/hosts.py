"""Host names looked up with a deadline that Ctrl-C and SIGTERM can end.

`socket.getaddrinfo` has no deadline of its own: with a name server that does not answer it
waits for the resolver's retries (28 s seen, 11 s with the default settings), in C, where Python
runs no signal handler, so a Ctrl-C waits for it too. Here the lookup runs in a thread of its
own, and the caller waits for it in a wait that a signal ends (a lock's, which Python's handlers
interrupt); a lookup left behind ends with the process (a daemon thread).
"""

from __future__ import annotations

import socket
import threading


def addresses(host: str, port: int, seconds: float) -> list[tuple]:
    """socket.getaddrinfo(host, port, type=SOCK_STREAM) -> [(family, type, proto, canonname,
    sockaddr)], within `seconds`. A name that does not resolve, cannot be a name (an empty label,
    one over 63 bytes: the codec's UnicodeError) or gets no answer in time is a socket.gaierror
    whose strerror says which."""
    found: list = []
    done = threading.Event()

    def look_up() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except UnicodeError:
            found.append(socket.gaierror(socket.EAI_NONAME, "not a host name: a part between dots is empty or longer "
                                                            "than 63 characters"))
        except OSError as err:
            found.append(err if isinstance(err, socket.gaierror) else socket.gaierror(socket.EAI_SYSTEM, str(err)))
        finally:
            done.set()

    threading.Thread(target=look_up, name=f"lookup of {host}", daemon=True).start()
    if not done.wait(seconds):
        raise socket.gaierror(socket.EAI_AGAIN, f"no answer from the name server within {seconds:g} s")
    if isinstance(found[0], socket.gaierror):
        raise found[0]
    return found[0]

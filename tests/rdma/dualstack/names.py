"""Socket addresses as the C library returns them, for the dual-stack cells.

`raw(fn, sock)` calls getsockname/getpeername through the process's own symbol lookup (the
shim's hook when preloaded, as the program's own calls go) and decodes the bytes: length,
family, address, port, flowinfo, scope id. Python's tuples alone would hide a wrong length
or family (a sockaddr_in read as the start of a sockaddr_in6).
"""

import ctypes
import socket
import struct

_libc = ctypes.CDLL(None, use_errno=True)


def raw(name, sock):
    fn = getattr(_libc, name)
    buf = ctypes.create_string_buffer(128)
    ln = ctypes.c_uint32(128)
    if fn(sock.fileno(), buf, ctypes.byref(ln)) != 0:
        return {"error": ctypes.get_errno()}
    b = buf.raw[: ln.value]
    fam = struct.unpack_from("=H", b)[0]
    out = {"len": ln.value, "family": fam}
    if fam == socket.AF_INET and ln.value >= 16:
        out["addr"] = socket.inet_ntop(socket.AF_INET, b[4:8])
        out["port"] = struct.unpack_from("!H", b, 2)[0]
    elif fam == socket.AF_INET6 and ln.value >= 28:
        out["addr"] = socket.inet_ntop(socket.AF_INET6, b[8:24])
        out["port"], out["flowinfo"] = struct.unpack_from("!HI", b, 2)
        out["scope_id"] = struct.unpack_from("=I", b, 24)[0]
    return out


def names(sock):
    """Both names of a connected socket, raw."""
    return {"local": raw("getsockname", sock), "peer": raw("getpeername", sock)}

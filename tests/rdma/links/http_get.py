"""N HTTP/1.0 GETs of one file, one connection each, one after another (tests/rdma/links.sh
links_prefork): every body must be the file's bytes (sha256). Prints `ok N`."""
import hashlib
import socket
import sys


def get(addr, port, path):
    with socket.create_connection((addr, port)) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n".encode())
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0]
    if b" 200 " not in status:
        raise SystemExit(f"GET {path}: {status!r}")
    return body


def main():
    addr, port, path, local, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    want = hashlib.sha256(open(local, "rb").read()).hexdigest()
    for i in range(n):
        got = hashlib.sha256(get(addr, port, path)).hexdigest()
        if got != want:
            raise SystemExit(f"request {i}: body sha256 {got}, file {want}")
    print(f"ok {n}")


main()

"""An IMAP client (Python's imaplib): logs in, APPENDs a message whose body is FILE in
base64, FETCHes it back and prints `appended=N fetched_sha=HEX` (the sha256 of the decoded
body, to compare with the file's). Exits 1 on any IMAP error.

    imap_roundtrip.py ADDR USER PASSWORD FILE
"""

import base64
import hashlib
import imaplib
import sys


def main():
    addr, user, password, path = sys.argv[1:5]
    data = open(path, "rb").read()
    body = base64.encodebytes(data).replace(b"\n", b"\r\n")
    msg = b"From: a@localhost\r\nTo: %s@localhost\r\nSubject: rsock\r\n\r\n" % user.encode() + body
    m = imaplib.IMAP4(addr)
    m.login(user, password)
    typ, _ = m.append("INBOX", None, None, msg)
    if typ != "OK":
        sys.exit("APPEND: %s" % typ)
    m.select("INBOX")
    _, found = m.search(None, "ALL")
    last = found[0].split()[-1]
    typ, got = m.fetch(last, "(BODY[TEXT])")
    if typ != "OK":
        sys.exit("FETCH: %s" % typ)
    text = got[0][1].replace(b"\r\n", b"\n")
    print("appended=%d fetched_sha=%s" % (len(msg), hashlib.sha256(base64.decodebytes(text)).hexdigest()))
    m.logout()


if __name__ == "__main__":
    main()

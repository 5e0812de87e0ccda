#!/usr/bin/env python3
"""Assertions over `rsock stat --json` output (one JSON object per process, one per line).

usage: stats_check.py JSONFILE EXPR...

Each EXPR is a Python expression evaluated with these names bound:
  procs     the list of process objects (as parsed from JSON)
  nproc     len(procs)
  conns, tx, rx, fallback, waits, grown, links
            the per-path / per-reason counters summed over all processes, with attribute
            access: conns.tcp, rx.tcp, fallback.no_device, waits.woke_late, links.made, ...
  sockets   all live-connection entries of all processes, concatenated
  comms     sorted list of the processes' comm names
  alive     number of processes still alive
Any extra NAME=VALUE arguments given before the expressions as `-D NAME=VALUE` are bound too
(VALUE is parsed as a Python literal when possible, else kept as a string).

Exit status 0 when every expression is true; otherwise 1, printing on stdout one line per
false expression with the values of the names it uses, e.g.
  conns.tcp==2 is false: conns.tcp=1
"""

import ast
import json
import sys
import types


def load(path):
    procs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                procs.append(json.loads(line))
    return procs


def summed(procs, key):
    out = {}
    for p in procs:
        for k, v in p.get(key, {}).items():
            out[k] = out.get(k, 0) + v
    return types.SimpleNamespace(**out)


def names_used(expr):
    """Dotted names (a, a.b) read by expr, in order, for the failure message."""
    seen = []

    def dotted(n):
        if isinstance(n, ast.Name):
            return n.id
        if isinstance(n, ast.Attribute):
            base = dotted(n.value)
            return base and base + "." + n.attr
        return None

    for node in ast.walk(ast.parse(expr, mode="eval")):
        d = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        if d and d not in seen and not any(s.startswith(d + ".") for s in seen):
            seen.append(d)
    return seen


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    path, rest = argv[0], argv[1:]
    extra = {}
    while len(rest) >= 2 and rest[0] == "-D":
        k, _, v = rest[1].partition("=")
        try:
            extra[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            extra[k] = v
        rest = rest[2:]
    try:
        procs = load(path)
    except (OSError, ValueError) as e:
        print(f"cannot read stats {path}: {e}")
        return 1
    env = {
        "procs": procs,
        "nproc": len(procs),
        "conns": summed(procs, "conns"),
        "tx": summed(procs, "tx"),
        "rx": summed(procs, "rx"),
        "fallback": summed(procs, "fallback"),
        "waits": summed(procs, "waits"),
        "grown": summed(procs, "grown"),
        "links": summed(procs, "links"),
        "branches": summed(procs, "branches"),
        "sockets": [s for p in procs for s in p.get("sockets", [])],
        "comms": sorted(p.get("comm", "") for p in procs),
        "alive": sum(1 for p in procs if p.get("alive")),
    }
    env.update(extra)
    env["__builtins__"] = __builtins__  # one namespace: comprehensions see the names too
    failed = 0
    for expr in rest:
        try:
            ok = bool(eval(expr, env))
            err = ""
        except Exception as e:  # a missing counter is a failure, not a crash
            ok, err = False, f" ({type(e).__name__}: {e})"
        if not ok:
            failed += 1
            vals = []
            for n in names_used(expr):
                try:
                    v = eval(n, env)
                except Exception:
                    continue
                if callable(v) or isinstance(v, types.ModuleType):
                    continue
                vals.append(f"{n}={v!r}" if not isinstance(v, types.SimpleNamespace) else f"{n}={vars(v)}")
            print(f"{expr} is false{err}: {', '.join(vals) or '(no values)'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

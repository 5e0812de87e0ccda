"""CPU per GB moved: raw verbs (ib_write_bw, 64 KiB), iperf3 -P 1 under rsock, and iperf3 on
kernel TCP, in one boot of the Soft-RoCE bed. Both processes' CPU (getrusage of the children)
and the whole guest's busy time (/proc/stat), per GB. A benchmark, not a test: it asserts
nothing. Run it after building the shim:

    cargo build --release && tests/rdma-vm/run.sh -- python3 bench/rdma/cpu_per_gb.py
"""
import subprocess, time, resource, sys, os, json, re
A = os.environ.get("RDMA_VM_ADDR", "10.77.0.1")
SO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../target/release/librsock.so")
def stat():
    f = open("/proc/stat").readline().split()[1:]
    v = list(map(int, f)); return sum(v) - v[3] - v[4]  # busy jiffies (all but idle, iowait)
def run(name, srv, cli, nbytes_fn, env=None):
    e = dict(os.environ); e.update(env or {})
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN); s0 = stat(); t0 = time.time()
    ps = subprocess.Popen(srv, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(1.5)
    out = subprocess.run(cli, env=e, capture_output=True, text=True).stdout
    sout = ps.communicate(timeout=60)[0].decode()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN); s1 = stat(); t1 = time.time()
    proc = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    sysw = (s1 - s0) / os.sysconf("SC_CLK_TCK")
    gb = nbytes_fn(out, sout) / 1e9
    print("%-28s %.3f GB  process CPU %.1f s/GB  whole guest CPU %.1f s/GB  (%.1f s wall)" % (name, gb, proc / gb, sysw / gb, t1 - t0), flush=True)
n = 15000
run("ib_write_bw 64KiB", ["ib_write_bw", "-R", "-s", "65536", "-n", str(n)], ["ib_write_bw", "-R", "-s", "65536", "-n", str(n), A], lambda o, s: n * 65536)
def iperf_bytes(o, s):
    j = json.loads(o); return j["end"]["sum_received"]["bytes"]
for name, env in [("iperf3 -P1 rsock", {"LD_PRELOAD": SO}), ("iperf3 -P1 kernel TCP", {})]:
    run(name, ["iperf3", "-s", "-1", "-B", A, "-p", "5299"], ["iperf3", "-c", A, "-p", "5299", "-t", "5", "-J"], iperf_bytes, env)

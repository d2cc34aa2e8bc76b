#!/usr/bin/python3
"""PyTorch DDP's own gradient bucketing over gloo, on a data/fusion tensor list (the peer of
loom-fusion-bench; perf/fusion-compare.sh runs both in interleaved rounds).

Run with Debian's python (/usr/bin/python3, python3-torch: scripts/bench-deps.sh). P local
processes (gloo over 127.0.0.1, CPU tensors) each hold a module whose parameters are the list's
tensors, registered in forward order; the loss chains every parameter's term so that autograd
produces the gradients in the list's (backward) order, which is the order DDP's buckets assume.
DDP runs with its defaults (bucket_cap_mb=25, first bucket 1 MB as DDP sizes it internally).
Each step's gradients are exact-sum values (rank-dependent constants, as in loom-fusion-bench),
checked after the step.

Reported (medians over the rounds, slowest rank):
  ddp_us     loss.backward() of the DDP-wrapped module: gradients and their allreduce
  local_us   the same backward without DDP (no communication)
  comm_us    ddp_us - local_us: what DDP's communication added
Last line: ddp model=<name> ranks=<p> ddp_us=<t> local_us=<t> comm_us=<t> bucket_mb=<b> wrong=<n>
"""
import argparse
import os
import queue
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))


def load(model):
    path = model if ("/" in model or model.endswith(".csv")) else os.path.join(
        HERE, "..", "data", "fusion", model + ".csv")
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith("#") or line.startswith("name,") or not line.strip():
                continue
            name, count, dtype, _ = line.strip().split(",")
            if dtype != "float32":
                sys.exit("%s: %s: only float32 lists" % (path, name))
            rows.append((name, int(count)))
    return os.path.basename(path).split(".")[0], rows


class Grads(torch.nn.Module):
    def __init__(self, counts_fwd):
        super().__init__()
        self.ps = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.zeros(c)) for c in counts_fwd])

    def forward(self, consts):
        # a chain: the last parameter's term is nearest the loss, so its gradient comes first
        x = torch.zeros(())
        for p, c in zip(self.ps, consts):
            x = x + (p * c).sum()
        return x


def worker(rank, args, port, rows, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    p = args.ranks
    dist.init_process_group("gloo", rank=rank, world_size=p)
    n = len(rows)
    # list index i (backward order) is forward position n-1-i
    fwd = list(reversed(range(n)))
    consts = []
    for i in fwd:
        j = torch.arange(rows[i][1], dtype=torch.int64)
        consts.append(((rank + 1) * (j % 7 + 1) + i % 5).to(torch.float32))
    expect = []
    for i in fwd:
        j = torch.arange(rows[i][1], dtype=torch.int64)
        expect.append(((j % 7 + 1) * (p * (p + 1) // 2) + p * (i % 5)).to(torch.float32))
    local = Grads([rows[i][1] for i in fwd])
    ddp_mod = torch.nn.parallel.DistributedDataParallel(
        Grads([rows[i][1] for i in fwd]), bucket_cap_mb=args.bucket_mb)
    wrong = 0

    def step(mod, check):
        nonlocal wrong
        for q in mod.parameters():
            q.grad = None
        loss = mod(consts)
        dist.barrier()
        t0 = time.perf_counter()
        loss.backward()
        t = time.perf_counter() - t0
        if check:
            for q, e in zip(mod.parameters(), expect):
                # DDP averages: the sum is p times the gradient (exact for these small integers
                # when p is a power of two; otherwise within one rounding of the division)
                s = q.grad * p
                bad = (s != e) if (p & (p - 1)) == 0 else ((s - e).abs() > 1e-5 * e.abs())
                wrong += int(bad.sum())
        tt = torch.tensor([t], dtype=torch.float64)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        return float(tt[0])

    ts_ddp, ts_loc = [], []
    for it in range(args.warmup + args.iters):
        a = step(ddp_mod, True)
        b = step(local, False)
        if it >= args.warmup:
            ts_ddp.append(a)
            ts_loc.append(b)
    w = torch.tensor([wrong], dtype=torch.float64)
    dist.all_reduce(w)
    if rank == 0:
        out.put((statistics.median(ts_ddp), statistics.median(ts_loc), int(w[0])))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-P", "--ranks", type=int, default=4)
    ap.add_argument("-m", "--model", default="resnet50")
    ap.add_argument("-n", "--iters", type=int, default=5)
    ap.add_argument("-w", "--warmup", type=int, default=1)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb (25)")
    args = ap.parse_args()
    name, rows = load(args.model)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, port, rows, out)) for r in range(args.ranks)]
    for pr in procs:
        pr.start()
    res = None
    try:
        deadline = time.time() + 1800
        while res is None and time.time() < deadline:
            try:
                res = out.get(timeout=1)
            except queue.Empty:
                if any(pr.exitcode not in (None, 0) for pr in procs):
                    break
    finally:
        for pr in procs:
            pr.join(timeout=60)
            if pr.is_alive():
                pr.kill()
    if res is None or any(pr.exitcode != 0 for pr in procs):
        sys.exit("fusion-ddp: a rank failed")
    ddp, loc, wrong = res
    total = sum(c for _, c in rows)
    print("# fusion-ddp: model %s, %d tensors, %.1f MB, %d ranks, gloo, bucket_cap_mb %g" %
          (name, len(rows), total * 4 / 1e6, args.ranks, args.bucket_mb))
    print("ddp model=%s ranks=%d ddp_us=%.1f local_us=%.1f comm_us=%.1f bucket_mb=%g wrong=%d" %
          (name, args.ranks, ddp * 1e6, loc * 1e6, (ddp - loc) * 1e6, args.bucket_mb, wrong))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

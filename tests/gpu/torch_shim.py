#!/usr/bin/env python3
"""PyTorch on loom's NCCL shim, checked against PyTorch on NVIDIA's NCCL (tests/gpu/torch_shim.sh).

Three modes:

  torch_shim.py probe
      Exit 0 when this machine can run the check (torch with NCCL, CUDA, at least 2 GPUs), else
      77 with the reason. Needs torch.

  torch_shim.py run --tag TAG --out DIR [--expect-shim PATH | --forbid-shim PATH]
      One rank of a job started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
      MASTER_PORT): backend "nccl", CUDA tensors. Runs every collective on every dtype and size
      and checks each result bit for bit against the exact expected value, trains a small MLP
      with DistributedDataParallel, and writes DIR/TAG.rank<R>.json. --expect-shim: the run is on
      the shim (tools/loom-run), so /proc/self/maps must hold no libnccl.so but PATH, and loom's
      log (LOOM_DEBUG_FILE) must hold the shim's "NCCL shim active" line. --forbid-shim: the run
      is on NVIDIA's NCCL, so PATH must not be mapped.

  torch_shim.py run ... --selftest-cpu
      The same on CPU tensors with the gloo backend, for checking this script on a machine
      without GPUs (gloo refuses some of the cases; both runs then record the same refusal).

  torch_shim.py compare --plain DIR --loom DIR
      Compares the two runs' files: every collective result exact in both and bit-identical
      between them, DDP losses within rtol 1e-5 / atol 1e-6, the maps and log checks. Prints the
      differences and a summary line; exit 0 when all agree, 1 otherwise. Needs no torch.

Inputs are small integers (times 0.25 for floating types) chosen so that every sum, average,
maximum and pre-multiplied sum is exact in every dtype, bfloat16 included: any correct
implementation gives the same bits, whatever its reduction order.
"""

import argparse
import ctypes
import hashlib
import json
import math
import os
import socket
import sys
import time
import traceback

SIZES = [1, 1000, 1 << 20]
DTYPE_NAMES = ["float32", "float16", "bfloat16", "int32", "int64"]
PREMUL_FACTOR = 0.25
DDP_STEPS = 50
LOSS_RTOL = 1e-5
LOSS_ATOL = 1e-6
SHIM_LINE = "NCCL shim active"


# ---------------------------------------------------------------------------------------------
# probe


def probe():
    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # noqa: BLE001 - any import failure means "no usable torch"
        print(f"SKIP: cannot import torch ({type(e).__name__}: {e})")
        return 77
    if not dist.is_available() or not dist.is_nccl_available():
        print(f"SKIP: torch {torch.__version__} has no NCCL backend")
        return 77
    if not torch.cuda.is_available():
        print(f"SKIP: torch {torch.__version__} sees no CUDA device")
        return 77
    n = torch.cuda.device_count()
    if n < 2:
        print(f"SKIP: {n} CUDA device(s); the check needs 2")
        return 77
    try:
        nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception as e:  # noqa: BLE001
        nccl = f"unknown ({e})"
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}, {n} GPUs: "
          + ", ".join(torch.cuda.get_device_name(i) for i in range(n)))
    return 0


# ---------------------------------------------------------------------------------------------
# helpers for one rank


def mapped_nccl():
    """Resolved paths of every libnccl* file mapped into this process."""
    found = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 6:
                continue
            path = parts[5].strip()
            if path.endswith(" (deleted)"):
                path = path[: -len(" (deleted)")]
            if os.path.basename(path).startswith("libnccl"):
                found.add(os.path.realpath(path))
    return sorted(found)


def loom_log_files():
    """The files loom logs to in this process: LOOM_DEBUG_FILE with %h and %p expanded as loom
    expands them (host name up to its first dot, pid)."""
    pattern = os.environ.get("LOOM_DEBUG_FILE", "")
    if not pattern:
        return []
    host = socket.gethostname().split(".")[0]
    path = pattern.replace("%h", host).replace("%p", str(os.getpid()))
    return [path]


def shim_log_line():
    for path in loom_log_files():
        try:
            with open(path, errors="replace") as f:
                for line in f:
                    if SHIM_LINE in line:
                        return line.strip()
        except OSError:
            pass
    return None


def digest(t):
    """SHA-256 of a CPU tensor's bytes (no numpy needed)."""
    t = t.contiguous()
    n = t.numel() * t.element_size()
    return hashlib.sha256(ctypes.string_at(t.data_ptr(), n) if n else b"").hexdigest()


class Results:
    def __init__(self, torch):
        self.torch = torch
        self.cases = {}

    def _bits(self, t):
        torch = self.torch
        if t.is_floating_point():
            return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
        return t

    def check(self, key, got, want):
        """got (any device) must equal want (CPU) bit for bit."""
        got = got.detach().cpu().contiguous()
        want = want.contiguous()
        entry = {"status": "ok", "dtype": str(got.dtype).replace("torch.", ""),
                 "numel": got.numel(), "sha256": digest(got)}
        if got.dtype != want.dtype or got.shape != want.shape:
            entry["status"] = "wrong"
            entry["detail"] = (f"got {got.dtype} {tuple(got.shape)}, expected {want.dtype} "
                               f"{tuple(want.shape)}")
        else:
            bad = self._bits(got).flatten() != self._bits(want).flatten()
            nbad = int(bad.sum().item())
            if nbad:
                i = int(bad.nonzero()[0][0].item())
                g, w = got.flatten()[i].item(), want.flatten()[i].item()
                entry["status"] = "wrong"
                entry["detail"] = (f"{nbad} of {got.numel()} elements differ from the exact "
                                   f"result; first at [{i}]: got {g!r}, expected {w!r}")
                entry["head"] = [x for x in got.flatten()[:8].tolist()]
        self.cases[key] = entry

    def error(self, key, exc):
        text = f"{type(exc).__name__}: {exc}".strip()
        self.cases[key] = {"status": "error", "detail": text[:600]}

    def skip(self, key, why):
        self.cases[key] = {"status": "skipped", "detail": why}

    def run(self, key, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - recorded, compared with the other run
            self.error(key, e)
            print(f"rank {os.environ.get('RANK')}: {key}: {type(e).__name__}: {e}",
                  file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# one rank of the job


def run_rank(args):
    # Before CUDA starts: deterministic cuBLAS, and no NVLink SHARP in NVIDIA's NCCL (loom
    # ignores NCCL_* variables).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import datetime

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    cpu = args.selftest_cpu
    if cpu:
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)

    report = {"tag": args.tag, "rank": rank, "world": world, "local_rank": local,
              "pid": os.getpid(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "selftest_cpu": args.selftest_cpu, "notes": [], "checks": {}}
    try:
        report["nccl_version"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception as e:  # noqa: BLE001
        report["nccl_version"] = f"unknown ({e})"

    timeout = datetime.timedelta(seconds=args.timeout)
    if cpu:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
        report["notes"].append("CPU self-test on gloo: says nothing about NCCL or loom")
    else:
        try:
            dist.init_process_group("nccl", rank=rank, world_size=world, timeout=timeout,
                                    device_id=device)
            report["notes"].append("process group bound to its device (eager NCCL init)")
        except TypeError:  # a torch without device_id
            dist.init_process_group("nccl", rank=rank, world_size=world, timeout=timeout)

    res = Results(torch)
    dtypes = {name: getattr(torch, name) for name in DTYPE_NAMES}
    premul = getattr(dist, "_make_nccl_premul_sum", None) or getattr(
        dist.distributed_c10d, "_make_nccl_premul_sum", None)
    if premul is None:
        report["notes"].append("premul-sum skipped: torch has no _make_nccl_premul_sum")

    def ints(count, r, salt=0):
        """Integers in [-62, 62]. salt 0: multiples of world on every rank, so that sums and
        averages are exact integers; other salts move the larger element between ranks (max) or
        make every block of an all-to-all distinct."""
        i = torch.arange(count, dtype=torch.int64)
        if salt == 0:
            return world * ((i % 61) - 30 + r)
        return ((i * (2 * salt + 1) + 17 * salt * (r + 1)) % 61) - 30

    def value(k, dtype):
        """The exact value of integers k in dtype (float64 first: exact, then exact cast)."""
        if dtype.is_floating_point:
            return (k.to(torch.float64) * 0.25).to(dtype)
        return k.to(dtype)

    def inp(count, r, dtype, salt=0):
        return value(ints(count, r, salt), dtype)

    def exact(fn, dtype):
        """fn over float64/int64 inputs, cast to dtype (exact for these inputs)."""
        t = fn(torch.float64 if dtype.is_floating_point else torch.int64)
        return t.to(dtype)

    def ranks_sum(count, dtype, salt=0, factor=None):
        def f(wide):
            acc = torch.zeros(count, dtype=wide)
            for r in range(world):
                x = inp(count, r, wide, salt)
                acc += x * factor if factor is not None else x
            return acc
        return exact(f, dtype)

    for dname in DTYPE_NAMES:
        dt = dtypes[dname]
        for n in SIZES:
            sfx = f"{dname}/{n}"

            def all_reduce(op, key, want, salt=0):
                def body():
                    t = inp(n, rank, dt, salt).to(device)
                    dist.all_reduce(t, op=op)
                    res.check(key, t, want())
                res.run(key, body)

            all_reduce(dist.ReduceOp.SUM, f"all_reduce/sum/{sfx}", lambda: ranks_sum(n, dt))
            all_reduce(dist.ReduceOp.AVG, f"all_reduce/avg/{sfx}",
                       lambda: exact(lambda w: ranks_sum(n, w) / world
                                     if w.is_floating_point else ranks_sum(n, w) // world, dt))
            all_reduce(dist.ReduceOp.MAX, f"all_reduce/max/{sfx}",
                       lambda: exact(lambda w: torch.stack([inp(n, r, w, 1)
                                                            for r in range(world)]).amax(0), dt),
                       salt=1)
            key = f"all_reduce/premul_sum/{sfx}"
            if premul is None:
                res.skip(key, "torch has no _make_nccl_premul_sum")
            elif not dt.is_floating_point:
                res.skip(key, "torch's NCCL backend takes pre-multiplied sums of floating types "
                              "only")
            else:
                try:
                    op = premul(PREMUL_FACTOR)
                except Exception as e:  # noqa: BLE001 - recorded like a failed call
                    res.error(key, e)
                else:
                    all_reduce(op, key, lambda: ranks_sum(n, dt, factor=PREMUL_FACTOR))

            def broadcast():
                src = world - 1
                t = inp(n, rank, dt).to(device)
                dist.broadcast(t, src=src)
                res.check(f"broadcast/{sfx}", t, inp(n, src, dt))
            res.run(f"broadcast/{sfx}", broadcast)

            def reduce():
                t = inp(n, rank, dt).to(device)
                dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
                if rank == 0:  # elsewhere NCCL leaves the buffer to the library
                    res.check(f"reduce/{sfx}", t, ranks_sum(n, dt))
            res.run(f"reduce/{sfx}", reduce)

            def all_gather_into_tensor():
                out = torch.full((world * n,), -1, dtype=dt, device=device)
                dist.all_gather_into_tensor(out, inp(n, rank, dt).to(device))
                res.check(f"all_gather_into_tensor/{sfx}", out,
                          torch.cat([inp(n, r, dt) for r in range(world)]))
            res.run(f"all_gather_into_tensor/{sfx}", all_gather_into_tensor)

            def all_gather():
                outs = [torch.full((n,), -1, dtype=dt, device=device) for _ in range(world)]
                dist.all_gather(outs, inp(n, rank, dt).to(device))
                res.check(f"all_gather/{sfx}", torch.cat(outs),
                          torch.cat([inp(n, r, dt) for r in range(world)]))
            res.run(f"all_gather/{sfx}", all_gather)

            def rs_want():
                return ranks_sum(world * n, dt)[rank * n:(rank + 1) * n]

            def reduce_scatter_tensor():
                out = torch.full((n,), -1, dtype=dt, device=device)
                dist.reduce_scatter_tensor(out, inp(world * n, rank, dt).to(device),
                                           op=dist.ReduceOp.SUM)
                res.check(f"reduce_scatter_tensor/{sfx}", out, rs_want())
            res.run(f"reduce_scatter_tensor/{sfx}", reduce_scatter_tensor)

            def reduce_scatter():
                out = torch.full((n,), -1, dtype=dt, device=device)
                parts = list(inp(world * n, rank, dt).to(device).chunk(world))
                dist.reduce_scatter(out, parts, op=dist.ReduceOp.SUM)
                res.check(f"reduce_scatter/{sfx}", out, rs_want())
            res.run(f"reduce_scatter/{sfx}", reduce_scatter)

            def all_to_all_single():
                out = torch.full((world * n,), -1, dtype=dt, device=device)
                dist.all_to_all_single(out, inp(world * n, rank, dt, 2).to(device))
                want = torch.cat([inp(world * n, j, dt, 2)[rank * n:(rank + 1) * n]
                                  for j in range(world)])
                res.check(f"all_to_all_single/{sfx}", out, want)
            res.run(f"all_to_all_single/{sfx}", all_to_all_single)

            def send_recv():
                # Rank 0 to rank 1 with the blocking calls; the others take no part.
                if rank == 0:
                    dist.send(inp(n, 0, dt, 3).to(device), dst=1)
                elif rank == 1:
                    t = torch.full((n,), -1, dtype=dt, device=device)
                    dist.recv(t, src=0)
                    res.check(f"send_recv/{sfx}", t, inp(n, 0, dt, 3))
            res.run(f"send_recv/{sfx}", send_recv)

            def batch_p2p():
                # Around the ring in one batch (a group of send and recv).
                nxt, prv = (rank + 1) % world, (rank - 1) % world
                t = torch.full((n,), -1, dtype=dt, device=device)
                ops = [dist.P2POp(dist.isend, inp(n, rank, dt, 4).to(device), nxt),
                       dist.P2POp(dist.irecv, t, prv)]
                for req in dist.batch_isend_irecv(ops):
                    req.wait()
                res.check(f"batch_isend_irecv/{sfx}", t, inp(n, prv, dt, 4))
            res.run(f"batch_isend_irecv/{sfx}", batch_p2p)

    # A second communicator (ncclCommSplit when the group is bound to a device).
    def new_group():
        g = dist.new_group(list(range(world)))
        t = inp(1000, rank, torch.float32).to(device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=g)
        res.check("new_group/all_reduce/sum/float32/1000", t, ranks_sum(1000, torch.float32))
        dist.destroy_process_group(g)
    res.run("new_group/all_reduce/sum/float32/1000", new_group)
    if not cpu:
        torch.cuda.synchronize()

    # The device NCCL bound the default communicator to: the caller's current device. Asked
    # through the libnccl.so.2 already loaded (dlopen by SONAME finds it); never when none is
    # mapped, where dlopen could load another library that does not own torch's handle.
    try:
        if cpu:
            raise RuntimeError("CPU self-test")
        backend = dist.distributed_c10d._get_default_group()._get_backend(device)
        ptr = backend._comm_ptr() if hasattr(backend, "_comm_ptr") else 0
        loaded = any(os.path.basename(p).startswith("libnccl.so") for p in mapped_nccl())
        if ptr and not loaded:
            report["notes"].append("comm device not checked: no libnccl.so mapped")
        elif ptr:
            lib = ctypes.CDLL("libnccl.so.2")  # the one loaded: a SONAME match, no new load
            dev = ctypes.c_int(-2)
            r = lib.ncclCommCuDevice(ctypes.c_void_p(int(ptr)), ctypes.byref(dev))
            report["comm_cu_device"] = dev.value if r == 0 else f"ncclCommCuDevice -> {r}"
        else:
            report["notes"].append("comm device not checked: ProcessGroupNCCL has no "
                                   "_comm_ptr()")
    except Exception as e:  # noqa: BLE001
        report["notes"].append(f"comm device not checked: {type(e).__name__}: {e}")

    # DistributedDataParallel: the same model (seed 0), each rank its own synthetic data.
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                              nn.Linear(64, 1)).to(device)
        ddp = DDP(model, device_ids=None if cpu else [local])
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        gen = torch.Generator().manual_seed(1000 + rank)
        xs = torch.randn(DDP_STEPS, 16, 32, generator=gen)
        ys = torch.sin(xs.sum(-1, keepdim=True)) + 0.1 * torch.randn(DDP_STEPS, 16, 1,
                                                                     generator=gen)
        losses = []
        for step in range(DDP_STEPS):
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(ddp(xs[step].to(device)), ys[step].to(device))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        flat = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
        report["ddp"] = {"losses": losses, "params_sha256": digest(flat),
                         "params": flat.tolist()}
    except Exception as e:  # noqa: BLE001
        report["ddp"] = {"error": f"{type(e).__name__}: {e}"}
        traceback.print_exc()

    dist.barrier()
    if not cpu:
        torch.cuda.synchronize()

    # Which NCCL this process really ran on.
    maps = mapped_nccl()
    report["libnccl_mapped"] = maps
    if args.expect_shim:
        shim = os.path.realpath(args.expect_shim)
        others = [p for p in maps
                  if os.path.basename(p).startswith("libnccl.so") and p != shim]
        report["checks"]["maps"] = {
            "ok": shim in maps and not others,
            "detail": (f"other libnccl.so mapped: {', '.join(others)}" if others else
                       f"the shim {shim} is not mapped" if shim not in maps else
                       f"only the shim is mapped ({shim})")}
        line = shim_log_line()
        report["checks"]["shim_log"] = {
            "ok": line is not None,
            "detail": line or (f"no '{SHIM_LINE}' line in {loom_log_files() or 'any log'}: "
                               "NCCL calls did not reach the shim (is NCCL linked statically "
                               "into libtorch_cuda?)")}
    if args.forbid_shim:
        shim = os.path.realpath(args.forbid_shim)
        report["checks"]["maps"] = {
            "ok": shim not in maps,
            "detail": (f"loom's shim {shim} is mapped in the run on NVIDIA's NCCL"
                       if shim in maps else
                       f"NVIDIA's NCCL: {', '.join(maps)}" if maps else
                       "no libnccl mapped: NCCL is linked into torch statically")}

    report["cases"] = res.cases
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.tag}.rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f, indent=1)
    os.replace(path + ".tmp", path)
    bad = sum(1 for c in res.cases.values() if c["status"] in ("wrong", "error"))
    print(f"rank {rank} ({args.tag}): {len(res.cases)} cases, {bad} wrong or failed, "
          f"NCCL {report['nccl_version']}, libnccl mapped: {', '.join(maps) or 'none'}",
          flush=True)
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------------------------
# compare


def load_run(d, tag):
    runs = {}
    try:
        names = sorted(os.listdir(d))
    except OSError:
        names = []
    for name in names:
        if name.startswith(tag + ".rank") and name.endswith(".json"):
            with open(os.path.join(d, name)) as f:
                r = json.load(f)
            runs[r["rank"]] = r
    return runs


def compare(args):
    plain, loom = load_run(args.plain, "plain"), load_run(args.loom, "loom")
    failures, notes = [], []

    def fail(msg):
        failures.append(msg)
        print("DIFF " + msg)

    for name, run, d in (("plain", plain, args.plain), ("loom", loom, args.loom)):
        if not run:
            fail(f"{name}: no results in {d} (did the run crash? see its log)")
            continue
        world = next(iter(run.values()))["world"]
        missing = [r for r in range(world) if r not in run]
        if missing:
            fail(f"{name}: no results from rank(s) {missing} in {d}")
    if failures:
        print(f"torch_shim: FAILED: {len(failures)} problem(s)")
        return 1

    p0, l0 = plain[0], loom[0]
    print(f"plain: torch {p0['torch']}, CUDA {p0['cuda']}, NCCL {p0['nccl_version']}, "
          f"libnccl: {', '.join(p0.get('libnccl_mapped') or []) or 'none'}")
    print(f"loom:  torch {l0['torch']}, CUDA {l0['cuda']}, NCCL {l0['nccl_version']} "
          f"(as the shim claims), libnccl: {', '.join(l0.get('libnccl_mapped') or []) or 'none'}")

    # Which NCCL each run was on.
    for name, run in (("plain", plain), ("loom", loom)):
        for rank in sorted(run):
            for check, c in sorted(run[rank].get("checks", {}).items()):
                if not c["ok"]:
                    fail(f"{name} rank {rank}: {check}: {c['detail']}")
    c = l0.get("checks", {}).get("shim_log")
    if c and c["ok"]:
        print(f"loom rank 0 log: {c['detail']}")
    on_shim = all("shim_log" in loom[r].get("checks", {}) for r in loom)
    if not on_shim and not l0.get("selftest_cpu"):
        fail("the loom run did not check that it ran on the shim (run it with --expect-shim)")
    for name, run in (("plain", plain), ("loom", loom)):
        for n in run[0].get("notes", []):
            notes.append(f"{name}: {n}")

    # Collectives: exact in both runs, and the same bits.
    checked = skipped = 0
    for rank in sorted(set(plain) | set(loom)):
        pc = plain.get(rank, {}).get("cases", {})
        lc = loom.get(rank, {}).get("cases", {})
        for key in sorted(set(pc) | set(lc)):
            p, l = pc.get(key), lc.get(key)
            where = f"{key} (rank {rank})"
            if p is None or l is None:
                fail(f"{where}: only in the {'plain' if l is None else 'loom'} run")
                continue
            ps, ls = p["status"], l["status"]
            if ps == "ok" and ls == "ok":
                if p["sha256"] != l["sha256"]:
                    fail(f"{where}: both exact but the bits differ (plain {p['sha256'][:16]}, "
                         f"loom {l['sha256'][:16]})")
                else:
                    checked += 1
            elif ps == ls == "skipped":
                skipped += 1
            elif ps == ls == "wrong" and p["sha256"] == l["sha256"]:
                # NVIDIA's NCCL gives the same bits: the expectation of this case is off (seen:
                # PyTorch's bfloat16 pre-multiplied sum yields -0.0 on both), not loom
                checked += 1
                notes.append(f"{where}: loom and NVIDIA's NCCL agree bit for bit, both unlike "
                             f"this script's expected value ({p.get('detail', '')})")
            elif ps == ls == "error" and p["detail"] == l["detail"]:
                skipped += 1
                notes.append(f"{where}: refused alike in both runs: {p['detail']}")
            else:
                pd = p.get("detail", "exact")
                ld = l.get("detail", "exact")
                fail(f"{where}: plain NCCL {ps} ({pd}); loom {ls} ({ld})")
    skip_kinds = sorted({d["detail"] for d in plain[0]["cases"].values()
                         if d["status"] == "skipped"})
    for s in skip_kinds:
        notes.append(f"skipped: {s}")

    # The device of the default communicator.
    pd, ld = p0.get("comm_cu_device"), l0.get("comm_cu_device")
    for rank in sorted(loom):
        pdev = plain.get(rank, {}).get("comm_cu_device")
        ldev = loom[rank].get("comm_cu_device")
        if pdev is None or ldev is None:
            continue
        if pdev != ldev:
            fail(f"rank {rank}: ncclCommCuDevice: NVIDIA's NCCL {pdev}, loom {ldev}")
    if pd is None or ld is None:
        notes.append("ncclCommCuDevice of the default communicator not compared")

    # DDP: the losses of rank 0 (tolerance), and every rank's parameters alike within a run.
    maxdiff = maxrel = float("nan")
    pdp, ldp = p0.get("ddp", {}), l0.get("ddp", {})
    for name, d in (("plain", pdp), ("loom", ldp)):
        if "error" in d:
            fail(f"DDP training in the {name} run failed: {d['error']}")
    for name, run in (("plain", plain), ("loom", loom)):
        shas = {r: run[r].get("ddp", {}).get("params_sha256") for r in run}
        if len(set(shas.values())) != 1:
            fail(f"DDP ({name}): ranks ended with different parameters: {shas}")
    if "losses" in pdp and "losses" in ldp:
        pl, ll = pdp["losses"], ldp["losses"]
        if len(pl) != len(ll):
            fail(f"DDP: {len(pl)} losses on NCCL, {len(ll)} on loom")
        else:
            maxdiff = maxrel = 0.0
            worst = None
            for step, (a, b) in enumerate(zip(ll, pl)):
                if not (math.isfinite(a) and math.isfinite(b)):
                    fail(f"DDP step {step}: loss loom {a!r}, NCCL {b!r}")
                    continue
                diff = abs(a - b)
                maxdiff = max(maxdiff, diff)
                maxrel = max(maxrel, diff / abs(b) if b else 0.0)
                if diff > LOSS_ATOL + LOSS_RTOL * abs(b) and worst is None:
                    worst = (step, a, b, diff)
            print(f"DDP: {len(pl)} steps, rank 0 loss {pl[0]:.6g} -> {pl[-1]:.6g} on NCCL, "
                  f"{ll[0]:.6g} -> {ll[-1]:.6g} on loom; max |diff| {maxdiff:.3g} "
                  f"(max rel {maxrel:.3g})")
            if worst:
                fail(f"DDP losses differ beyond rtol {LOSS_RTOL}/atol {LOSS_ATOL}: first at "
                     f"step {worst[0]}: loom {worst[1]!r}, NCCL {worst[2]!r} "
                     f"(diff {worst[3]:.3g}); max diff {maxdiff:.3g}")
            if pl[-1] >= pl[0]:
                notes.append(f"DDP loss did not fall on NCCL ({pl[0]:.4g} -> {pl[-1]:.4g})")
        if "params" in pdp and "params" in ldp and len(pdp["params"]) == len(ldp["params"]):
            pmax = max((abs(a - b) for a, b in zip(ldp["params"], pdp["params"])), default=0.0)
            print(f"DDP: final parameters, max |loom - NCCL| {pmax:.3g}"
                  + (" (bit-identical)" if pdp["params_sha256"] == ldp["params_sha256"] else ""))

    for n in notes:
        print("note: " + n)
    if failures:
        print(f"torch_shim: FAILED: {len(failures)} difference(s) between loom and NCCL "
              f"({checked} results agreed)")
        return 1
    print(f"torch_shim: PASSED: {checked} collective results on {len(loom)} ranks exact and "
          f"bit-identical to NVIDIA's NCCL ({skipped} skipped alike), DDP {DDP_STEPS} steps: "
          f"max loss diff {maxdiff:.3g} (rtol {LOSS_RTOL}, atol {LOSS_ATOL})"
          + (f"; the loom run mapped only the shim and logged '{SHIM_LINE}'" if on_shim else
             "; CPU self-test only: nothing about NCCL or loom"))
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    sub.add_parser("probe")
    r = sub.add_parser("run")
    r.add_argument("--tag", required=True, choices=["plain", "loom"])
    r.add_argument("--out", required=True)
    r.add_argument("--timeout", type=int, default=300, help="process group timeout (s)")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--expect-shim", help="the shim's path: the only libnccl.so allowed")
    g.add_argument("--forbid-shim", help="the shim's path: must not be mapped")
    r.add_argument("--selftest-cpu", action="store_true",
                   help="gloo on CPU tensors: checks this script, not NCCL or loom")
    c = sub.add_parser("compare")
    c.add_argument("--plain", required=True)
    c.add_argument("--loom", required=True)
    args = ap.parse_args(argv)
    if args.mode == "probe":
        return probe()
    if args.mode == "run":
        t0 = time.time()
        rc = run_rank(args)
        print(f"rank {os.environ.get('RANK')} ({args.tag}) done in {time.time() - t0:.1f} s",
              flush=True)
        return rc
    return compare(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

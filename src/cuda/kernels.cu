/*
 * The device executor's kernel: one launch per collective on the caller's stream (see
 * kernels.h for the protocol). Cost per rank for n local ranks and S bytes:
 *   one-shot allreduce: pushes (n-1)S over the links, reads nS locally; one flag round trip.
 *   two-shot (reduce-scatter then allgather): pushes 2(n-1)S/n, two launches.
 * Loads of slots written by peers bypass L1 (ld.global.cg), since a slot is reused every two
 * steps; flags are published with st.release.sys after a system fence and read with
 * ld.acquire.sys. Spins poll the host-mapped abort word and give up after the timeout.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "kernels.h"

typedef unsigned long long u64;

#define DEV_OFF_CLAIM (4 * DEV_TABLE_BYTES) /* int in the region: first failure claims it */
static_assert(DEV_OFF_CLAIM + 64 <= DEV_OFF_ARRIVE, "the claim word overlaps a table");
static_assert(DEV_OFF_DSTEP + DEV_TABLE_BYTES <= DEV_OFF_SLOTS, "region tables overlap the slots");

static __device__ __forceinline__ u64 ld_acquire(const u64 *p)
{
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

static __device__ __forceinline__ void st_release(u64 *p, u64 v)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

static __device__ __forceinline__ u64 gtimer()
{
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#define piece_bytes dev_piece_bytes

/* Records the first failure of this rank's kernel and raises the abort word so that every
 * other block stops too. Called by one thread. */
static __device__ void fail_record(const dev_args_t &a, int code, int peer, int kind, u64 want,
                                   u64 seen, u64 waited)
{
    dev_err_t *e = a.err;
    int *claim = (int *)(a.region[a.me] + DEV_OFF_CLAIM);
    if (atomicCAS(claim, 0, 1) == 0) {
        e->peer = peer;
        e->block = blockIdx.x;
        e->wait_kind = kind;
        e->step = want;
        e->seen = seen;
        e->seq = a.seq;
        e->waited_ns = waited;
        __threadfence_system();
        e->code = code;
    }
    __threadfence_system();
    e->abort = 1;
}

/* A spin's check, made every 1024 polls: false once the host asked to stop (the abort word,
 * read every 16384 polls), the communicator's timeout has passed since the first check, or
 * another thread of the block failed (fail, when given); the failure is then recorded and
 * *fail set. The clock starts at the first check, so a wait that ends sooner reads no timer. */
static __device__ __noinline__ bool spin_ok(const dev_args_t &a, unsigned it, u64 *start, int peer,
                                            int kind, u64 want, u64 seen, volatile int *fail)
{
    if (fail && *fail) return false;
    const u64 now = gtimer();
    if (*start == 0) *start = now;
    const u64 waited = now - *start;
    const bool ab = (it & 16383) == 0 && a.err->abort;
    if (!ab && !(a.timeout_ns && waited > a.timeout_ns)) return true;
    fail_record(a, ab ? DEV_ERR_ABORT : DEV_ERR_TIMEOUT, peer, kind, want, seen, waited);
    if (fail) *fail = 1;
    return false;
}

static __device__ __forceinline__ u64 ld_relaxed(const u64 *p)
{
    u64 v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* Spins until *flag >= want; false (after recording why) on abort or timeout. One thread.
 * The spin reads relaxed (cheap) and acquires once it sees the step; the abort word lives in
 * host memory (a PCIe read), so it is looked at rarely. */
static __device__ __noinline__ bool wait_geq(const u64 *flag, u64 want, const dev_args_t &a,
                                             int peer, int kind)
{
    if (ld_acquire(flag) >= want) return true;
    u64 start = 0, v = 0;
    for (unsigned it = 1;; it++) {
        v = ld_relaxed(flag);
        if (v >= want) {
            ld_acquire(flag);
            return true;
        }
        if ((it & 1023) == 0 && !spin_ok(a, it, &start, peer, kind, want, v, NULL)) return false;
    }
}

/* ---- byte copies (block-wide) ---- */

static __device__ __noinline__ void copy_bytes(char *dst, const char *src, u64 len, int t, int nt)
{
    if (dst == src || len == 0) return;
    if ((((uintptr_t)dst | (uintptr_t)src) & 15) == 0) {
        const int4 *s = (const int4 *)src;
        int4 *d = (int4 *)dst;
        u64 nv = len >> 4, i = t;
        for (; i + 3ull * nt < nv; i += 4ull * nt) {
            int4 v0 = __ldcg(s + i), v1 = __ldcg(s + i + nt), v2 = __ldcg(s + i + 2 * nt),
                 v3 = __ldcg(s + i + 3 * nt);
            d[i] = v0;
            d[i + nt] = v1;
            d[i + 2 * nt] = v2;
            d[i + 3 * nt] = v3;
        }
        for (; i < nv; i += nt)
            d[i] = __ldcg(s + i);
        for (u64 k = (nv << 4) + t; k < len; k += nt)
            dst[k] = __ldcg(src + k);
    } else if ((((uintptr_t)dst | (uintptr_t)src | len) & 3) == 0) {
        const unsigned *s = (const unsigned *)src;
        unsigned *d = (unsigned *)dst;
        for (u64 i = t; i < len / 4; i += nt)
            d[i] = __ldcg(s + i);
    } else {
        for (u64 i = t; i < len; i += nt)
            dst[i] = __ldcg(src + i);
    }
}

/* ---- typed reductions ---- */

template <int DT> struct ty;
template <> struct ty<0> {
    typedef int8_t S;
    typedef int8_t A;
};
template <> struct ty<1> {
    typedef uint8_t S;
    typedef uint8_t A;
};
template <> struct ty<2> {
    typedef int32_t S;
    typedef int32_t A;
};
template <> struct ty<3> {
    typedef uint32_t S;
    typedef uint32_t A;
};
template <> struct ty<4> {
    typedef long long S;
    typedef long long A;
};
template <> struct ty<5> {
    typedef unsigned long long S;
    typedef unsigned long long A;
};
template <> struct ty<6> {
    typedef unsigned short S;
    typedef float A;
};
template <> struct ty<7> {
    typedef float S;
    typedef float A;
};
template <> struct ty<8> {
    typedef double S;
    typedef double A;
};
template <> struct ty<9> {
    typedef unsigned short S;
    typedef float A;
};
/* the 8-bit floats: combined in float32, narrowed with saturation (the host's red_float_to_fp8
 * gives the same bits) */
template <> struct ty<10> {
    typedef unsigned char S;
    typedef float A;
};
template <> struct ty<11> {
    typedef unsigned char S;
    typedef float A;
};

template <int DT> static __device__ __forceinline__ typename ty<DT>::A up(typename ty<DT>::S s)
{
    return (typename ty<DT>::A)s;
}
template <> __device__ __forceinline__ float up<6>(unsigned short s)
{
    return __half2float(__ushort_as_half(s));
}
template <> __device__ __forceinline__ float up<9>(unsigned short s)
{
    return __bfloat162float(__ushort_as_bfloat16(s));
}
template <> __device__ __forceinline__ float up<10>(unsigned char s)
{
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(s, __NV_E4M3)));
}
template <> __device__ __forceinline__ float up<11>(unsigned char s)
{
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(s, __NV_E5M2)));
}
template <int DT> static __device__ __forceinline__ typename ty<DT>::S down(typename ty<DT>::A a)
{
    return (typename ty<DT>::S)a;
}
template <> __device__ __forceinline__ unsigned short down<6>(float a)
{
    return __half_as_ushort(__float2half_rn(a));
}
template <> __device__ __forceinline__ unsigned short down<9>(float a)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(a));
}
template <> __device__ __forceinline__ unsigned char down<10>(float a)
{
    return __nv_cvt_float_to_fp8(a, __NV_SATFINITE, __NV_E4M3);
}
template <> __device__ __forceinline__ unsigned char down<11>(float a)
{
    return __nv_cvt_float_to_fp8(a, __NV_SATFINITE, __NV_E5M2);
}

template <int OP, typename A> static __device__ __forceinline__ A apply(A x, A y)
{
    if (OP == 0) return x + y;
    if (OP == 1) return x * y;
    if (OP == 2) return x > y ? x : y;
    return x < y ? x : y;
}

/* The scalar of a pre-multiplied sum, in the accumulation type. */
template <int DT> static __device__ typename ty<DT>::A scale_of(const dev_args_t &a)
{
    typedef typename ty<DT>::S S;
    typedef typename ty<DT>::A A;
    if (a.scale_dev) return up<DT>(*(const S *)a.scale_dev);
    if (DT >= 6) return (A)a.scale_f; /* 6..11: the float types */
    return (A)a.scale_i;
}

/* dst = op over src[0..nsrc) (rank order); src[scaled] (if >= 0) is multiplied by the scalar
 * and rounded to the type first; avg divides by navg. */
template <int DT, int OP>
static __device__ __noinline__ void reduce_t(char *dst, const char *const *src, int nsrc,
                                             int scaled, u64 bytes, const dev_args_t &a, int navg,
                                             int t, int nt)
{
    typedef typename ty<DT>::S S;
    typedef typename ty<DT>::A A;
    const int E = 16 / sizeof(S);
    A scale = scaled >= 0 ? scale_of<DT>(a) : (A)1;
    u64 nel = bytes / sizeof(S);
    uintptr_t al = (uintptr_t)dst;
    for (int s = 0; s < nsrc; s++)
        al |= (uintptr_t)src[s];
    u64 nv = (al & 15) == 0 ? nel / E : 0;
    /* U independent vectors per thread and iteration, so that enough loads are in flight to
     * cover the memory latency (fewer for the wide-accumulator small types) */
    const int U = sizeof(S) == 1 ? 1 : sizeof(S) == 2 ? 2 : 4;
    for (u64 i0 = t; i0 < nv; i0 += (u64)U * nt) {
        int nvec = 0;
        while (nvec < U && i0 + (u64)nvec * nt < nv)
            nvec++;
        A acc[U][E];
        for (int s = 0; s < nsrc; s++) {
            union {
                int4 v;
                S e[E];
            } u[U];
#pragma unroll
            for (int h = 0; h < U; h++)
                if (h < nvec) u[h].v = __ldcg((const int4 *)src[s] + i0 + (u64)h * nt);
#pragma unroll
            for (int h = 0; h < U; h++) {
#pragma unroll
                for (int k = 0; k < E; k++) {
                    A x = up<DT>(u[h].e[k]);
                    if (s == scaled) x = up<DT>(down<DT>(x * scale));
                    acc[h][k] = s == 0 ? x : apply<OP, A>(acc[h][k], x);
                }
            }
        }
#pragma unroll
        for (int h = 0; h < U; h++) {
            if (h >= nvec) break;
            union {
                int4 v;
                S e[E];
            } o;
#pragma unroll
            for (int k = 0; k < E; k++)
                o.e[k] = down<DT>(navg > 1 ? acc[h][k] / (A)navg : acc[h][k]);
            ((int4 *)dst)[i0 + (u64)h * nt] = o.v;
        }
    }
    for (u64 i = nv * E + t; i < nel; i += nt) {
        A acc = (A)0;
        for (int s = 0; s < nsrc; s++) {
            A x = up<DT>(((const volatile S *)src[s])[i]);
            if (s == scaled) x = up<DT>(down<DT>(x * scale));
            acc = s == 0 ? x : apply<OP, A>(acc, x);
        }
        ((S *)dst)[i] = down<DT>(navg > 1 ? acc / (A)navg : acc);
    }
}

template <int DT>
static __device__ void reduce_dt(char *dst, const char *const *src, int nsrc, int scaled, u64 bytes,
                                 const dev_args_t &a, int navg, int t, int nt)
{
    switch (a.op) {
    case 0: reduce_t<DT, 0>(dst, src, nsrc, scaled, bytes, a, navg, t, nt); break;
    case 1: reduce_t<DT, 1>(dst, src, nsrc, scaled, bytes, a, navg, t, nt); break;
    case 2: reduce_t<DT, 2>(dst, src, nsrc, scaled, bytes, a, navg, t, nt); break;
    default: reduce_t<DT, 3>(dst, src, nsrc, scaled, bytes, a, navg, t, nt); break;
    }
}

static __device__ void reduce_any(char *dst, const char *const *src, int nsrc, int scaled,
                                  u64 bytes, const dev_args_t &a, int navg, int t, int nt)
{
    switch (a.dtype) {
    case 0: reduce_dt<0>(dst, src, nsrc, scaled, bytes, a, navg, t, nt); break;
    case 1: reduce_dt<1>(dst, src, nsrc, scaled, bytes, a, navg, t, nt); break;
    case 2: reduce_dt<2>(dst, src, nsrc, scaled, bytes, a, navg, t, nt); break;
    case 3: reduce_dt<3>(dst, src, nsrc, scaled, bytes, a, navg, t, nt); break;
    case 4: reduce_dt<4>(dst, src, nsrc, scaled, bytes, a, navg, t, nt); break;
    case 5: reduce_dt<5>(dst, src, nsrc, scaled, bytes, a, navg, t, nt); break;
    case 6: reduce_dt<6>(dst, src, nsrc, scaled, bytes, a, navg, t, nt); break;
    case 7: reduce_dt<7>(dst, src, nsrc, scaled, bytes, a, navg, t, nt); break;
    case 8: reduce_dt<8>(dst, src, nsrc, scaled, bytes, a, navg, t, nt); break;
    case 9: reduce_dt<9>(dst, src, nsrc, scaled, bytes, a, navg, t, nt); break;
    case 10: reduce_dt<10>(dst, src, nsrc, scaled, bytes, a, navg, t, nt); break;
    default: reduce_dt<11>(dst, src, nsrc, scaled, bytes, a, navg, t, nt); break;
    }
}

/* ---- the exchange ---- */

/* Named barrier for one half of the block (ids 1 and 2; 0 is __syncthreads). */
static __device__ __forceinline__ void half_sync(int id, int nt)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nt) : "memory");
}

static __device__ __forceinline__ u64 rounds_of(u64 len, int nb, u64 slot)
{
    return dev_rounds_of(len, nb, slot);
}

static __device__ __forceinline__ bool piece_of(u64 len, u64 k, int nb, int b, u64 slot, u64 *pos,
                                                u64 *plen)
{
    return dev_piece_of(len, k, nb, b, slot, pos, plen);
}

struct xshared {
    volatile int fail;
    volatile unsigned long long pushed; /* rounds the push half has finished (aliasing) */
    const char *srcs[DEV_MAX_LOCAL];
};

/* ---- low-latency pieces (see kernels.h) ---- */

static __device__ __forceinline__ unsigned gather4(const char *p, u64 left)
{
    if (left >= 4 && ((uintptr_t)p & 3) == 0) return *(const unsigned *)p;
    unsigned v = 0;
    for (int i = 0; i < 4 && (u64)i < left; i++)
        v |= (unsigned)(unsigned char)p[i] << (8 * i);
    return v;
}

static __device__ __forceinline__ void scatter4(char *p, u64 left, unsigned v)
{
    if (left >= 4 && ((uintptr_t)p & 3) == 0) {
        *(unsigned *)p = v;
        return;
    }
    for (int i = 0; i < 4 && (u64)i < left; i++)
        p[i] = (char)(v >> (8 * i));
}

static __device__ void ll_push(u64 *dst, const char *src, u64 len, u64 step, int t, int nt)
{
    for (u64 c = t; c * 4 < len; c += nt) {
        u64 w = (u64)gather4(src + c * 4, len - c * 4) | ((u64)(unsigned)step << 32);
        asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(dst + c), "l"(w) : "memory");
    }
}

/* Waits for every word of the piece; false on abort or timeout (then *fail is set). */
static __device__ bool ll_take(char *dst, const u64 *src, u64 len, u64 step, int t, int nt,
                               const dev_args_t &a, int peer, volatile int *fail)
{
    const unsigned want = (unsigned)step;
    for (u64 c = t; c * 4 < len; c += nt) {
        u64 w;
        u64 start = 0;
        for (unsigned it = 1;; it++) {
            asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(w) : "l"(src + c) : "memory");
            if ((unsigned)(w >> 32) == want) break;
            if ((it & 1023) == 0 &&
                !spin_ok(a, it, &start, peer, DEV_WAIT_DATA, step, w >> 32, fail))
                return false;
        }
        scatter4(dst + c * 4, len - c * 4, (unsigned)w);
    }
    return true;
}

/* The push half: my pieces into the peers' slots, round after round. */
static __device__ __forceinline__ void push_half(const dev_args_t &a, xshared &sh, u64 rounds,
                                                 int t, int nt)
{
    const int b = blockIdx.x, nb = a.nblocks, n = a.n, me = a.me;
    char *mine = a.region[me];
    u64 *ack = (u64 *)(mine + DEV_OFF_ACK);
    u64 *sstep = (u64 *)(mine + DEV_OFF_SSTEP);
    u64 ss[DEV_MAX_LOCAL];
    for (int j = 0; j < n; j++)
        ss[j] = sstep[j * DEV_MAX_BLOCKS + b];
    const bool scale_push = a.mode == DEV_REDUCE && a.premul;
    for (u64 k = 0; k < rounds; k++) {
        for (int j = 0; j < n; j++) {
            u64 pos, len;
            if (j == me || !piece_of(a.io[j].send_len, k, nb, b, a.slot, &pos, &len)) continue;
            u64 s = ss[j] + 1;
            if (t == 0 && s > (u64)a.nslot &&
                !wait_geq(&ack[j * DEV_MAX_BLOCKS + b], s - a.nslot, a, j, DEV_WAIT_ACK))
                sh.fail = 1;
            half_sync(1, nt);
            if (sh.fail) return;
            if (dev_is_ll(a.io[j].send_len, nb, a.slot, scale_push)) {
                ll_push((u64 *)(a.region[j] +
                                DEV_LL_SLOT_OFF(me, b, s % a.nslot, n, nb, a.nslot, a.slot)),
                        a.send + a.io[j].send_off + pos, len, s, t, nt);
                ss[j] = s;
                continue;
            }
            char *dst = a.region[j] + DEV_SLOT_OFF(me, b, s % a.nslot, nb, a.nslot, a.slot);
            const char *src = a.send + a.io[j].send_off + pos;
            if (scale_push) {
                const char *one[1] = {src};
                reduce_any(dst, one, 1, 0, len, a, 0, t, nt);
            } else {
                copy_bytes(dst, src, len, t, nt);
            }
            half_sync(1, nt);
            /* the barrier orders the half's stores before this release (cumulativity) */
            if (t == 0)
                st_release((u64 *)(a.region[j] + DEV_OFF_RFLAG) + me * DEV_MAX_BLOCKS + b, s);
            ss[j] = s;
        }
        if (t == 0) sh.pushed = k + 1;
    }
    if (t == 0)
        for (int j = 0; j < n; j++)
            sstep[j * DEV_MAX_BLOCKS + b] = ss[j];
}

/* The receive half: peers' pieces out of my slots, copied or reduced. */
static __device__ __forceinline__ void recv_half(const dev_args_t &a, xshared &sh, u64 rounds,
                                                 int t, int nt)
{
    const int b = blockIdx.x, nb = a.nblocks, n = a.n, me = a.me;
    char *mine = a.region[me];
    u64 *rflag = (u64 *)(mine + DEV_OFF_RFLAG);
    u64 *rstep = (u64 *)(mine + DEV_OFF_RSTEP);
    u64 rs[DEV_MAX_LOCAL];
    for (int j = 0; j < n; j++)
        rs[j] = rstep[j * DEV_MAX_BLOCKS + b];
    for (u64 k = 0; k < rounds; k++) {
        /* Writing over my input (in place) waits until the push half has sent this round. */
        if (a.alias && t == 0)
            while (sh.pushed < k + 1 && !sh.fail)
                __nanosleep(32);
        if (a.mode == DEV_COPY) {
            for (int j = 0; j < n; j++) {
                u64 pos, len;
                if (j == me || !piece_of(a.io[j].recv_len, k, nb, b, a.slot, &pos, &len)) continue;
                u64 s = rs[j] + 1;
                if (dev_is_ll(a.io[j].recv_len, nb, a.slot, 0)) {
                    ll_take(a.recv + a.io[j].recv_off + pos,
                            (const u64 *)(mine + DEV_LL_SLOT_OFF(j, b, s % a.nslot, n, nb, a.nslot,
                                                                 a.slot)),
                            len, s, t, nt, a, j, &sh.fail);
                    half_sync(2, nt);
                    if (sh.fail) return;
                    if (t == 0)
                        st_release((u64 *)(a.region[j] + DEV_OFF_ACK) + me * DEV_MAX_BLOCKS + b, s);
                    rs[j] = s;
                    continue;
                }
                if (t == 0 && !wait_geq(&rflag[j * DEV_MAX_BLOCKS + b], s, a, j, DEV_WAIT_DATA))
                    sh.fail = 1;
                half_sync(2, nt);
                if (sh.fail) return;
                copy_bytes(a.recv + a.io[j].recv_off + pos,
                           mine + DEV_SLOT_OFF(j, b, s % a.nslot, nb, a.nslot, a.slot), len, t, nt);
                half_sync(2, nt);
                if (t == 0)
                    st_release((u64 *)(a.region[j] + DEV_OFF_ACK) + me * DEV_MAX_BLOCKS + b, s);
                rs[j] = s;
            }
            u64 pos, len;
            if (piece_of(a.self_len, k, nb, b, a.slot, &pos, &len))
                copy_bytes(a.recv + a.self_dst + pos, a.send + a.self_src + pos, len, t, nt);
        } else {
            u64 pos, len;
            if (!piece_of(a.self_len, k, nb, b, a.slot, &pos, &len)) continue;
            const bool ll = dev_is_ll(a.self_len, nb, a.slot, a.premul);
            if (ll) {
                /* gather each peer's words into its unpack area, then reduce from there */
                for (int j = 0; j < n; j++)
                    if (j != me)
                        ll_take(mine + DEV_UNPACK_OFF(j, b, n, nb, a.nslot, a.slot),
                                (const u64 *)(mine + DEV_LL_SLOT_OFF(j, b, (rs[j] + 1) % a.nslot, n,
                                                                     nb, a.nslot, a.slot)),
                                len, rs[j] + 1, t, nt, a, j, &sh.fail);
            } else if (t == 0) {
                for (int j = 0; j < n; j++)
                    if (j != me &&
                        !wait_geq(&rflag[j * DEV_MAX_BLOCKS + b], rs[j] + 1, a, j, DEV_WAIT_DATA))
                        sh.fail = 1;
            }
            if (t < n)
                sh.srcs[t] =
                    t == me ? a.send + a.self_src + pos
                    : ll    ? mine + DEV_UNPACK_OFF(t, b, n, nb, a.nslot, a.slot)
                            : mine + DEV_SLOT_OFF(t, b, (rs[t] + 1) % a.nslot, nb, a.nslot, a.slot);
            half_sync(2, nt);
            if (sh.fail) return;
            reduce_any(a.recv + a.self_dst + pos, sh.srcs, n, a.premul ? me : -1, len, a,
                       a.avg ? n : 0, t, nt);
            half_sync(2, nt);
            for (int j = 0; j < n; j++) {
                if (j == me) continue;
                rs[j]++;
                if (t == 0)
                    st_release((u64 *)(a.region[j] + DEV_OFF_ACK) + me * DEV_MAX_BLOCKS + b, rs[j]);
            }
        }
    }
    if (t == 0)
        for (int j = 0; j < n; j++)
            rstep[j * DEV_MAX_BLOCKS + b] = rs[j];
}

/* Lane b's arrival at direct operation s: tell every peer, wait for every peer (thread 0). */
static __device__ void direct_arrive(const dev_args_t &a, xshared &sh, int b, u64 s)
{
    const int n = a.n, me = a.me;
    char *mine = a.region[me];
    for (int j = 0; j < n; j++)
        if (j != me) st_release((u64 *)(a.region[j] + DEV_OFF_ARRIVE) + me * DEV_MAX_BLOCKS + b, s);
    for (int j = 0; j < n; j++)
        if (j != me && !wait_geq((u64 *)(mine + DEV_OFF_ARRIVE) + j * DEV_MAX_BLOCKS + b, s, a, j,
                                 DEV_WAIT_DATA))
            sh.fail = 1;
}

/* DEV_MEET: see kernels.h. */
static __device__ void direct_meet(const dev_args_t &a, xshared &sh)
{
    const int b = blockIdx.x;
    u64 *dstep = (u64 *)(a.region[a.me] + DEV_OFF_DSTEP);
    if (threadIdx.x != 0) return;
    const u64 s = dstep[b] + 1;
    direct_arrive(a, sh, b, s);
    if (!sh.fail) dstep[b] = s;
}

/* DEV_CE_REDUCE: see kernels.h. */
static __device__ void ce_reduce(const dev_args_t &a, xshared &sh)
{
    const int b = blockIdx.x, t = threadIdx.x, nt = blockDim.x, n = a.n, me = a.me;
    u64 len = a.self_len, ch = ((len + gridDim.x - 1) / gridDim.x + 15) & ~15ull;
    u64 pos = (u64)b * ch;
    if (pos >= len) return;
    u64 plen = len - pos < ch ? len - pos : ch;
    if (t < n) sh.srcs[t] = (t == me ? a.send + a.self_src : a.peer_send[t]) + pos;
    __syncthreads();
    reduce_any(a.recv + a.self_dst + pos, sh.srcs, n, -1, plen, a, a.avg ? n : 0, t, nt);
}

/* DEV_DIRECT: see kernels.h. */
static __device__ void direct_allreduce(const dev_args_t &a, xshared &sh)
{
    const int b = blockIdx.x, t = threadIdx.x, nt = blockDim.x, n = a.n, me = a.me;
    char *mine = a.region[me];
    u64 *dstep = (u64 *)(mine + DEV_OFF_DSTEP);
    const u64 s = dstep[b] + 1;
    if (t == 0) direct_arrive(a, sh, b, s);
    __syncthreads();
    if (sh.fail) return;
    u64 len = a.self_len, ch = ((len + gridDim.x - 1) / gridDim.x + 15) & ~15ull;
    u64 pos = (u64)b * ch;
    /* a window's one shot in place (direct_stage): the peers still read my input, so the block's
     * result waits in its own scratch (my slots of writer `me`, which nobody else writes) until
     * every peer is done, then lands in my buffer */
    char *scratch = mine + DEV_SLOT_OFF(me, b, 0, a.nblocks, a.nslot, a.slot);
    if (a.direct_copy) {
        /* a window's allgather or broadcast: io[j] says what comes from rank j's buffer */
        for (int j = 0; j < n; j++) {
            u64 jl = a.io[j].recv_len, jc = ((jl + gridDim.x - 1) / gridDim.x + 15) & ~15ull,
                jp = (u64)b * jc;
            if (jp >= jl) continue;
            copy_bytes(a.recv + a.io[j].recv_off + jp,
                       (j == me ? a.send : a.peer_send[j]) + a.io[j].send_off + jp,
                       jl - jp < jc ? jl - jp : jc, t, nt);
        }
    } else if (pos < len) {
        u64 plen = len - pos < ch ? len - pos : ch;
        if (t < n) sh.srcs[t] = (t == me ? a.send : a.peer_send[t]) + a.self_src + pos;
        __syncthreads();
        char *out = a.direct_stage ? scratch : a.recv + a.self_dst + pos;
        reduce_any(out, sh.srcs, n, -1, plen, a, a.avg ? n : 0, t, nt);
        __syncthreads();
        if (a.direct_fanout)
            for (int j = 0; j < n; j++)
                if (j != me) copy_bytes(a.peer_recv[j] + a.self_dst + pos, out, plen, t, nt);
    }
    __syncthreads();
    if (t == 0) {
        for (int j = 0; j < n; j++)
            if (j != me)
                st_release((u64 *)(a.region[j] + DEV_OFF_DONE) + me * DEV_MAX_BLOCKS + b, s);
        for (int j = 0; j < n; j++)
            if (j != me && !wait_geq((u64 *)(mine + DEV_OFF_DONE) + j * DEV_MAX_BLOCKS + b, s, a, j,
                                     DEV_WAIT_ACK))
                sh.fail = 1;
        if (!sh.fail) dstep[b] = s;
    }
    if (a.direct_stage && pos < len) {
        __syncthreads();
        if (sh.fail) return;
        copy_bytes(a.recv + a.self_dst + pos, scratch, len - pos < ch ? len - pos : ch, t, nt);
    }
}

/* ---- DEV_LLA: see kernels.h ---- */

/* Writer w's word of chunk c at parity par, in DEV_LLA's slots starting at `slots`. */
static __device__ __forceinline__ dev_lla_word_t *lla_word(char *slots, int w, int par, u64 c,
                                                           u64 cap)
{
    return (dev_lla_word_t *)(slots + DEV_LLA_OFF(w, par, c, cap));
}

/* v as the word of step `flag`, in one store. */
static __device__ __forceinline__ void lla_put(dev_lla_word_t *p, u64 v, unsigned flag)
{
    const dev_lla_word_t w = {(unsigned)v, flag, (unsigned)(v >> 32), flag};
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w.lo),
                 "r"(w.step), "r"(w.hi), "r"(w.step2)
                 : "memory");
}

/* The 8 bytes of a word once both halves carry `flag`. */
static __device__ __forceinline__ bool lla_get(const dev_lla_word_t *p, unsigned flag, u64 *v,
                                               unsigned *seen)
{
    dev_lla_word_t w;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w.lo), "=r"(w.step), "=r"(w.hi), "=r"(w.step2)
                 : "l"(p)
                 : "memory");
    *v = (u64)w.lo | (u64)w.hi << 32;
    *seen = w.step != flag ? w.step : w.step2;
    return w.step == flag && w.step2 == flag;
}

/* Up to 8 bytes of a buffer whose elements are aligned to their size (zeros past the end). */
static __device__ __forceinline__ u64 load8(const char *p, u64 left)
{
    if (left >= 8 && ((uintptr_t)p & 7) == 0) return *(const u64 *)p;
    if (left >= 8 && ((uintptr_t)p & 3) == 0)
        return (u64)((const unsigned *)p)[0] | (u64)((const unsigned *)p)[1] << 32;
    u64 v = 0;
    for (int i = 0; i < 8 && (u64)i < left; i++)
        v |= (u64)(unsigned char)p[i] << (8 * i);
    return v;
}

static __device__ __forceinline__ void store8(char *p, u64 left, u64 v)
{
    if (left >= 8 && ((uintptr_t)p & 7) == 0) {
        *(u64 *)p = v;
    } else if (left >= 8 && ((uintptr_t)p & 3) == 0) {
        ((unsigned *)p)[0] = (unsigned)v;
        ((unsigned *)p)[1] = (unsigned)(v >> 32);
    } else {
        for (int i = 0; i < 8 && (u64)i < left; i++)
            p[i] = (char)(v >> (8 * i));
    }
}

/* Spins for a peer's word; false (after recording why) on abort, timeout, or another thread's
 * failure. */
static __device__ __forceinline__ bool lla_wait(const dev_args_t &a, const dev_lla_word_t *p,
                                                unsigned flag, int peer, volatile int *fail, u64 *v)
{
    unsigned seen;
    if (lla_get(p, flag, v, &seen)) return true;
    u64 start = 0;
    for (unsigned it = 1;; it++) {
        if (lla_get(p, flag, v, &seen)) return true;
        if ((it & 1023) == 0 && !spin_ok(a, it, &start, peer, DEV_WAIT_DATA, flag, seen, fail))
            return false;
    }
}

/* What the latency path reads on its way, copied out of the launch arguments into shared
 * memory by one thread at the start (loads of the kernel's parameters through their address, as
 * a callee makes them, go to memory the launch just wrote: a chain of them cost ~1 us per call;
 * a copy per thread on its stack cost more from 512 threads; measured with
 * perf/probes/persist.cu); the rest of dev_args_t is read only for a premultiplied scalar or a
 * failure. */
struct lla_t {
    const char *send;
    char *recv;
    char *region[DEV_MAX_LOCAL];
    u64 len, base, cap, step, seg;
    int n, me, nblocks, premul, avg;
};

/* Returns the step this lane used. */
template <int DT, int OP>
static __device__ __forceinline__ u64 lla_run(const lla_t &L, const dev_args_t &a, const u64 *lstep,
                                              volatile int *fail)
{
    typedef typename ty<DT>::S S;
    typedef typename ty<DT>::A A;
    const int E = 8 / sizeof(S);
    union W {
        u64 v;
        S e[E];
    };
    /* the host's step (one per call), or, in launches a graph may replay, the lane's own */
    const u64 step = L.step ? L.step : *lstep + 1;
    const int n = L.n, me = L.me;
    const u64 len = L.len, nchunk = (len + 7) / 8;
    const u64 first = (u64)blockIdx.x * DEV_LLA_SPAN, stride = DEV_LLA_SPAN * (u64)L.nblocks;
    const unsigned flag = (unsigned)step;
    const int par = (int)(step & 1);
    char *mine = L.region[me] + L.base;
    /* my contribution as every rank sees it (premultiplied) */
    auto scaled = [&](W w) {
        if (L.premul) {
            const A scale = scale_of<DT>(a);
#pragma unroll
            for (int k = 0; k < E; k++)
                w.e[k] = down<DT>(up<DT>(w.e[k]) * scale);
        }
        return w;
    };
    /* chunk c of what goes to rank j (an allreduce sends everyone the same buffer, a
     * reduce-scatter rank j's segment) */
    auto input = [&](int j, u64 c) {
        W w;
        w.v = load8(L.send + (u64)j * L.seg + c * 8, len - c * 8);
        return w;
    };
    /* mine: my own chunk c, premultiplied (for an allreduce, what every peer gets too) */
    auto push = [&](u64 c, const W &mine_c) {
        for (int j = 0; j < n; j++)
            if (j != me)
                lla_put(lla_word(L.region[j] + L.base, me, par, c, L.cap),
                        L.seg ? scaled(input(j, c)).v : mine_c.v, flag);
    };
    auto finish = [&](u64 c, const A *acc) {
        W o;
#pragma unroll
        for (int k = 0; k < E; k++)
            o.e[k] = down<DT>(L.avg ? acc[k] / (A)n : acc[k]);
        store8(L.recv + c * 8, len - c * 8, o.v);
    };
    if (nchunk <= stride) {
        /* at most one chunk per thread (the latency case): push, then wait for the peers'
         * words (looking at them before the push cost 0.3-0.4 us per call from 4 KiB on;
         * perf/results/*_lla_variants_s4.txt) */
        const u64 c = first + threadIdx.x;
        if (c >= nchunk) return step;
        W w = scaled(input(me, c)), pw[DEV_MAX_LOCAL];
        push(c, w);
        A acc[E];
#pragma unroll
        for (int j = 0; j < DEV_MAX_LOCAL; j++) {
            if (j >= n) break;
            if (j != me && !lla_wait(a, lla_word(mine, j, par, c, L.cap), flag, j, fail, &pw[j].v))
                return step;
            const W &x = j == me ? w : pw[j];
#pragma unroll
            for (int k = 0; k < E; k++)
                acc[k] = j == 0 ? up<DT>(x.e[k]) : apply<OP, A>(acc[k], up<DT>(x.e[k]));
        }
        finish(c, acc);
        return step;
    }
    /* several chunks per thread: push them all, then take the peers' */
    for (u64 r = first; r < nchunk; r += stride)
        for (u64 c = r + threadIdx.x; c < r + DEV_LLA_SPAN && c < nchunk; c += blockDim.x) {
            push(c, L.seg ? W{} : scaled(input(me, c)));
        }
    for (u64 r = first; r < nchunk; r += stride)
        for (u64 c = r + threadIdx.x; c < r + DEV_LLA_SPAN && c < nchunk; c += blockDim.x) {
            A acc[E];
            for (int j = 0; j < n; j++) {
                W w;
                if (j == me) {
                    w = scaled(input(me, c));
                } else if (!lla_wait(a, lla_word(mine, j, par, c, L.cap), flag, j, fail, &w.v)) {
                    return step;
                }
#pragma unroll
                for (int k = 0; k < E; k++)
                    acc[k] = j == 0 ? up<DT>(w.e[k]) : apply<OP, A>(acc[k], up<DT>(w.e[k]));
            }
            finish(c, acc);
        }
    return step;
}

/* L: the block's copy of the hot arguments, in shared memory */
template <int DT, int OP>
static __device__ __forceinline__ void lla_allreduce(const lla_t &L, const dev_args_t &a,
                                                     xshared &sh)
{
    u64 *lstep = (u64 *)(L.region[L.me] + DEV_OFF_LSTEP) + blockIdx.x;
    const u64 step = lla_run<DT, OP>(L, a, lstep, &sh.fail);
    __syncthreads(); /* every thread has read the step */
    if (threadIdx.x == 0 && !sh.fail) *lstep = step;
}

/* Each block is two halves that run side by side: one pushes round after round, the other
 * receives; slots (two per lane) bound how far the pushes run ahead. */
extern "C" __global__ void __launch_bounds__(DEV_MAX_THREADS, 1)
    loom_exchange(const __grid_constant__ dev_args_t a)
{
    __shared__ xshared sh;
    const int t = threadIdx.x, np = a.push_threads;
    if (a.empty) return; /* LOOM_CUDA_EMPTY: timing of everything but the kernel's work */
    if (a.mode == DEV_DIRECT) {
        if (t == 0) sh.fail = 0;
        __syncthreads();
        direct_allreduce(a, sh);
        return;
    }
    if (t == 0) {
        sh.fail = 0;
        sh.pushed = 0;
    }
    u64 rounds = rounds_of(a.self_len, a.nblocks, a.slot);
    for (int j = 0; j < a.n; j++) {
        if (j == a.me) continue;
        u64 r = rounds_of(a.io[j].send_len, a.nblocks, a.slot);
        if (r > rounds) rounds = r;
        r = rounds_of(a.io[j].recv_len, a.nblocks, a.slot);
        if (r > rounds) rounds = r;
    }
    __syncthreads();
    if (t < np)
        push_half(a, sh, rounds, t, np);
    else
        recv_half(a, sh, rounds, t - np, (int)blockDim.x - np);
    /* a failed half must not leave the other waiting at a barrier: both only wait at their
     * own barrier, and the waits see sh.fail or the abort word */
}

/* The copy-engine path's meetings and reductions (DEV_MEET, DEV_CE_REDUCE): an entry of their
 * own, so that loom_exchange's registers stay as they are. */
extern "C" __global__ void __launch_bounds__(DEV_MAX_THREADS, 1)
    loom_ce(const __grid_constant__ dev_args_t a)
{
    __shared__ xshared sh;
    if (a.empty) return;
    if (threadIdx.x == 0) sh.fail = 0;
    __syncthreads();
    if (a.mode == DEV_MEET)
        direct_meet(a, sh);
    else
        ce_reduce(a, sh);
}

/* DEV_LLA's own entries (below): the latency path gets registers of its own (loom_exchange's
 * slot path needs all 128 and a stack frame) and no dispatch on the mode. */
template <int DT, int OP> static __device__ __forceinline__ void lla_kernel(const dev_args_t &a)
{
    /* Launched as a programmatic dependent (PDL, Hopper and later): the next launch may be
     * scheduled as soon as every block of this one got here (so this comes first), and waits
     * at its own griddepcontrol.wait, which returns once this grid has completed and its
     * writes are visible. Before that wait only the launch's own parameters are read (they
     * are not memory a kernel before writes). Without the launch attribute both are no-ops. */
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    __shared__ xshared sh;
    __shared__ lla_t L;
    if (threadIdx.x == 0) { /* direct parameter loads, independent of one another */
        sh.fail = 0;
        L.send = a.send;
        L.recv = a.recv;
#pragma unroll
        for (int j = 0; j < DEV_MAX_LOCAL; j++)
            L.region[j] = a.region[j];
        L.len = a.self_len;
        L.base = a.lla_base;
        L.cap = a.lla_cap;
        L.step = a.lla_step;
        L.seg = a.lla_seg;
        L.n = a.n;
        L.me = a.me;
        L.nblocks = a.nblocks;
        L.premul = a.premul;
        L.avg = a.avg;
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    __syncthreads();
    /* LOOM_CUDA_EMPTY: no work, but still counted (the host waits for the count) */
    if (!a.empty) lla_allreduce<DT, OP>(L, a, sh); /* ends with a barrier of the block */
    if (a.lla_count && threadIdx.x == 0) { /* counted even after a failure: nothing waits forever */
        __threadfence(); /* the block's stores (seen through the barrier) before the count */
        atomicAdd((unsigned long long *)(a.region[a.me] + DEV_OFF_LDONE), 1ull);
    }
}

/* One entry per type and operation, loom_lla_<type>_<op> (types and ops numbered as
 * dev_args_t's dtype and op): no dispatch in the kernel, and each entry's code is only what
 * it runs (one kernel for all 40 cost 0.2-0.5 us more per call). */
#define LLA_ENTRY(D, O)                                                                            \
    extern "C" __global__ void __launch_bounds__(DEV_LLA_SPAN, 1)                                  \
        loom_lla_##D##_##O(const __grid_constant__ dev_args_t a)                                   \
    {                                                                                              \
        lla_kernel<D, O>(a);                                                                       \
    }
#define LLA_ENTRIES(D) LLA_ENTRY(D, 0) LLA_ENTRY(D, 1) LLA_ENTRY(D, 2) LLA_ENTRY(D, 3)
LLA_ENTRIES(0)
LLA_ENTRIES(1)
LLA_ENTRIES(2)
LLA_ENTRIES(3)
LLA_ENTRIES(4)
LLA_ENTRIES(5)
LLA_ENTRIES(6)
LLA_ENTRIES(7)
LLA_ENTRIES(8)
LLA_ENTRIES(9)
LLA_ENTRIES(10)
LLA_ENTRIES(11)

/* A fusion context's pack and unpack (dev_copies_t in kernels.h). */
template <typename T>
static __device__ __forceinline__ void copy_words(const char *s, char *d, u64 bytes)
{
    const T *S = (const T *)s;
    T *D = (T *)d;
    const u64 n = bytes / sizeof(T), stride = (u64)gridDim.x * blockDim.x;
    for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += stride)
        D[k] = S[k];
}

extern "C" __global__ void __launch_bounds__(DEV_MAX_THREADS)
    loom_fuse_copy(const __grid_constant__ dev_copies_t a)
{
    const int i = blockIdx.y;
    if (i >= a.n) return;
    const char *s = (const char *)a.src[i];
    char *d = (char *)a.dst[i];
    const u64 b = a.bytes[i], al = a.src[i] | a.dst[i] | b;
    if ((al & 15) == 0)
        copy_words<uint4>(s, d, b);
    else if ((al & 7) == 0)
        copy_words<u64>(s, d, b);
    else if ((al & 3) == 0)
        copy_words<unsigned>(s, d, b);
    else if ((al & 1) == 0)
        copy_words<unsigned short>(s, d, b);
    else
        copy_words<unsigned char>(s, d, b);
}

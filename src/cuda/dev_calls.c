/*
 * The ranks of a node compare their device collectives (dev_impl.h, struct dev_calls).
 *
 * Device calls return before their kernels run, and the kernels trust that every rank made the
 * same call: ranks whose counts differ wait for steps that never come (until LOOM_TIMEOUT), and
 * ranks whose types or ops differ add unlike data without a word. So every rank writes each
 * collective it orders (kind, count, type, op, root: what must agree; not the buffers, not
 * point-to-point calls, which pair different calls by design) into its lane of a small segment
 * of host memory that the node's ranks share (a memfd of local rank 0's, opened by the others
 * through /proc/<pid>/fd, as the node segment of core is), numbered by its collective count.
 * The comparison costs the call a few stores: at a call, against what the peers already wrote
 * for the same number (the later rank of a pair sees the difference before it launches); and
 * every watchdog period (dev_watch.c), against what they wrote since. A difference is the
 * communicator's error on every rank, naming the call's number and both sides, and the kernels
 * in flight are told to give up. Where the segment cannot be made (another pid namespace) the
 * check is off and said at INFO. Only ranks of one node are compared.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dev_impl.h"
#include "param.h"
#include "reduce.h"

#define CALLS_MAGIC 0x6c6f6f6d63616c6cull /* "loomcall" */

typedef struct {
    uint64_t seq, count;
    int32_t kind, dtype, op, root;
} call_t;

typedef struct {
    _Atomic uint64_t last; /* collectives written so far */
    uint8_t pad[56];
    call_t ring[DEV_CALLS_RING];
} lane_t;

typedef struct {
    uint64_t magic, nonce;
    uint32_t n;
    uint8_t pad[44];
    lane_t lane[];
} calls_head_t;

static size_t calls_len(int n)
{
    return sizeof(calls_head_t) + (size_t)n * sizeof(lane_t);
}

int dev_calls_offer(int n, uint64_t *nonce)
{
    int fd = (int)syscall(SYS_memfd_create, "loom-device-calls", MFD_CLOEXEC);
    if (fd < 0) return -1;
    size_t len = calls_len(n);
    void *m = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0)
        m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED || base_random(nonce, sizeof(*nonce)) != loomSuccess || *nonce == 0) {
        if (m != MAP_FAILED) munmap(m, len);
        close(fd);
        return -1;
    }
    calls_head_t *hd = m;
    hd->n = (uint32_t)n;
    hd->nonce = *nonce;
    hd->magic = CALLS_MAGIC;
    munmap(m, len);
    return fd;
}

void dev_calls_attach(dev_state_t *s, int pid, int fd, uint64_t nonce)
{
    struct dev_calls *c = &s->calls;
    int n = s->lay.n;
    const char *why = NULL;
    char path[64];
    bool own = pid == (int)getpid() && s->lay.me == 0;
    int f = fd;
    if (nonce == 0) {
        why = "local rank 0 could not make the segment";
    } else if (!own) {
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
        f = open(path, O_RDWR | O_CLOEXEC);
        if (f < 0) why = strerror(errno);
    }
    calls_head_t head;
    if (!why && (pread(f, &head, sizeof(head), 0) != (ssize_t)sizeof(head) ||
                 head.magic != CALLS_MAGIC || head.nonce != nonce || head.n != (uint32_t)n))
        why = "the descriptor does not hold local rank 0's segment (another pid namespace?)";
    void *m = MAP_FAILED;
    if (!why) {
        m = mmap(NULL, calls_len(n), PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
        if (m == MAP_FAILED) why = strerror(errno);
    }
    if (!own && f >= 0) close(f);
    if (own) c->fd = fd; /* local rank 0 keeps it open: a later peer's open needs it */
    if (why) {
        INFO(LOG_CUDA,
             "rank %d: device collectives are not compared between the ranks of this node (%s)",
             s->h->rank, why);
        return;
    }
    c->base = m;
    c->len = calls_len(n);
}

static const char *op_name(int op)
{
    return base_op_code_name(op >= 0 && op < (int)loomNumOps ? op : BASE_OP_CODE_PREMUL);
}

static bool reduces(int kind)
{
    return kind == OPK_ALLREDUCE || kind == OPK_REDUCE || kind == OPK_REDUCESCATTER;
}

static bool rooted(int kind)
{
    return kind == OPK_BROADCAST || kind == OPK_REDUCE;
}

static void call_str(const call_t *e, char *buf, size_t len)
{
    char root[24] = "";
    if (rooted(e->kind)) snprintf(root, sizeof(root), ", root %d", e->root);
    snprintf(buf, len, "%s of %llu %s%s%s%s", dev_kind_name(e->kind), (unsigned long long)e->count,
             red_type_name((loomDataType_t)e->dtype), reduces(e->kind) ? " " : "",
             reduces(e->kind) ? op_name(e->op) : "", root);
}

/* The first difference with local peer j over collectives (from, to], if any: the
 * communicator's error (and the kernels told to stop); true when one was found. */
static bool compare_lane(dev_state_t *s, int j, uint64_t from, uint64_t to)
{
    calls_head_t *hd = s->calls.base;
    const lane_t *mine = &hd->lane[s->lay.me], *theirs = &hd->lane[j];
    if (to > from + DEV_CALLS_RING) from = to - DEV_CALLS_RING; /* older ones were overwritten */
    for (uint64_t q = from + 1; q <= to; q++) {
        call_t a = mine->ring[q % DEV_CALLS_RING], b = theirs->ring[q % DEV_CALLS_RING];
        if (a.seq != q || b.seq != q) continue; /* overwritten meanwhile */
        if (a.kind == b.kind && a.count == b.count && a.dtype == b.dtype && a.op == b.op &&
            a.root == b.root)
            continue;
        char ma[160], tb[160], text[DEV_TEXT_MAX];
        call_str(&a, ma, sizeof(ma));
        call_str(&b, tb, sizeof(tb));
        snprintf(text, sizeof(text),
                 "rank %d: device collective %llu of this communicator differs between ranks of "
                 "this node: rank %d calls %s, rank %d calls %s; every rank must make the same "
                 "collective calls in the same order (kind, count, type, op and root agree; a "
                 "group of calls is compared call by call)",
                 s->h->rank, (unsigned long long)q, s->h->rank, ma, s->lay.lrank[j], tb);
        WARN(LOG_CUDA, "%s", text);
        s->calls.failed = true;
        if (s->xg.err) s->xg.err->abort = 1;
        s->h->set_error(s->h, loomInvalidUsage, text);
        base_set_error_text(text);
        return true;
    }
    return false;
}

/* Against every peer, the collectives both have written since the last look. */
static bool compare_all(dev_state_t *s)
{
    struct dev_calls *c = &s->calls;
    if (c->failed) return true;
    calls_head_t *hd = c->base;
    uint64_t mine = atomic_load_explicit(&hd->lane[s->lay.me].last, memory_order_acquire);
    for (int j = 0; j < s->lay.n; j++) {
        if (j == s->lay.me) continue;
        uint64_t theirs = atomic_load_explicit(&hd->lane[j].last, memory_order_acquire);
        uint64_t to = mine < theirs ? mine : theirs;
        uint64_t from = c->checked[j];
        if (to <= from) continue;
        if (compare_lane(s, j, from, to)) return true;
        c->checked[j] = to;
    }
    return false;
}

loomResult_t dev_calls_log(dev_state_t *s, const dev_op_t *ops, int nops)
{
    struct dev_calls *c = &s->calls;
    if (c->base == NULL) return loomSuccess;
    calls_head_t *hd = c->base;
    lane_t *me = &hd->lane[s->lay.me];
    uint64_t n = atomic_load_explicit(&me->last, memory_order_relaxed);
    int logged = 0;
    for (int i = 0; i < nops; i++) {
        const dev_op_t *o = &ops[i];
        if (o->kind == OPK_SEND || o->kind == OPK_RECV) continue;
        call_t e = {.seq = ++n,
                    .count = o->count,
                    .kind = o->kind,
                    .dtype = (int32_t)o->type,
                    .op = reduces(o->kind) ? (int32_t)o->op : 0,
                    .root = rooted(o->kind) ? o->root : -1};
        me->ring[n % DEV_CALLS_RING] = e;
        logged++;
    }
    if (logged == 0) return loomSuccess;
    atomic_store_explicit(&me->last, n, memory_order_release);
    pthread_mutex_lock(&c->lock);
    bool bad = compare_all(s);
    pthread_mutex_unlock(&c->lock);
    if (!bad) return loomSuccess;
    const char *why = NULL;
    loomResult_t r = s->h->error(s->h, &why);
    return base_error(r != loomSuccess ? r : loomInvalidUsage, LOG_CUDA, "%s", why ? why : "");
}

void dev_calls_check(dev_state_t *s)
{
    if (s->calls.base == NULL) return;
    pthread_mutex_lock(&s->calls.lock);
    if (!s->calls.failed) (void)compare_all(s);
    pthread_mutex_unlock(&s->calls.lock);
}

void dev_calls_free(dev_state_t *s)
{
    struct dev_calls *c = &s->calls;
    if (c->base) munmap(c->base, c->len);
    if (c->fd >= 0) close(c->fd);
    c->base = NULL;
    c->fd = -1;
    pthread_mutex_destroy(&c->lock);
}

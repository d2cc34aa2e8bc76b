/*
 * Communicator split: two allgathers on the parent through core's internal entry (a third where
 * a transport has addresses larger than a handle, UCX's), then a child
 * communicator made of the ranks of one colour, its transports started and its peers known
 * without a new rendezvous; a child on one node then sets up its node segment (one allgather on
 * the child).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll.h"
#include "comm.h"

static loomResult_t split_allgather(loomComm_t comm, const void *send, void *recv, size_t bytes)
{
    return coll_allgather_many(&comm, &send, &recv, bytes, 1);
}

typedef struct {
    int32_t color, key;
    uint8_t handle[TP_MAX][TRANSPORT_HANDLE_BYTES];
    uint32_t addr_bytes; /* the large transport addresses (comm_peer_addr), in a third exchange */
    uint32_t pad;
    uint8_t shrink_addr[32]; /* the child's shrink listener (shrink.c) */
    nodeseg_offer_t seg;     /* the child's rank 0: its node segment (zero elsewhere, or none) */
} split_rec_t;

/* The child's rank of parent rank q: its place in the order of (key, parent rank) among the
 * ranks of its colour. */
static int child_rank(const split_rec_t *all, int n, int q)
{
    int qr = 0;
    for (int o = 0; o < n; o++)
        if (all[o].color == all[q].color &&
            (all[o].key < all[q].key || (all[o].key == all[q].key && o < q)))
            qr++;
    return qr;
}

LOOM_EXPORT loomResult_t loomCommSplit(loomComm_t comm, int color, int key, loomComm_t *newcomm,
                                       loomConfig_t *config)
{
    base_clear_error();
    LOOM_CHECK(comm_check(comm, "loomCommSplit"));
    log_set_rank(comm->rank);
    if (newcomm == NULL)
        return base_error(loomInvalidArgument, LOG_INIT, "loomCommSplit: newcomm is NULL");
    if (color < 0 && color != LOOM_SPLIT_NOCOLOR)
        return base_error(loomInvalidArgument, LOG_INIT,
                          "loomCommSplit: colour %d is negative (use LOOM_SPLIT_NOCOLOR)", color);
    loomConfig_t cfg;
    LOOM_CHECK(comm_config_read(config, &cfg));
    bool held;
    LOOM_CHECK(comm_enter(comm, "loomCommSplit", 0, &held));
    loomResult_t r = comm_split(comm, color, key, &cfg, newcomm);
    comm_leave(comm, held);
    if (r == loomSuccess && *newcomm && (r = boot_child_service(*newcomm)) != loomSuccess) {
        comm_free(*newcomm);
        *newcomm = NULL;
    }
    return r;
}

loomResult_t comm_split(loomComm_t comm, int color, int key, const loomConfig_t *cfg,
                        loomComm_t *newcomm)
{
    uint64_t split_id = base_hash64(&comm->seq.split, sizeof(comm->seq.split), comm->lay.comm_id);
    comm->seq.split++;
    loomResult_t r = loomSuccess;
    loomComm_t child = NULL;
    split_rec_t mine = {.color = color, .key = key};
    split_rec_t *all = calloc((size_t)comm->nranks, sizeof(*all));
    if (all == NULL) return base_error(loomSystemError, LOG_INIT, "out of memory");
    /* Two exchanges: colours and keys fix the child's size and this rank's place in it, which
     * its transport needs before it can listen; then the listeners' addresses. */
    int crank = 0, cn = 0, seg_fd = -1;
    LOOM_CHECK_GOTO(split_allgather(comm, &mine, all, sizeof(mine)), r, out);
    if (color != LOOM_SPLIT_NOCOLOR) {
        for (int q = 0; q < comm->nranks; q++) {
            if (all[q].color != color) continue;
            if (all[q].key < key || (all[q].key == key && q < comm->rank)) crank++;
            cn++;
        }
        LOOM_CHECK_GOTO(comm_alloc(cn, crank, cfg, &child), r, out);
        child->lay.comm_id = base_hash64(&color, sizeof(color), split_id);
        memcpy(child->lay.secret, comm->lay.secret, 16);
        LOOM_CHECK_GOTO(comm_start_transport(child, mine.handle), r, out);
        LOOM_CHECK_GOTO(comm_shrink_listen(child, mine.shrink_addr), r, out);
        mine.addr_bytes = child->net.my_addr_len;
        /* The child's rank 0 offers a node segment when all its ranks are on this node (the
         * parent's layout says so), as init's rank 0 does */
        bool one_node = true;
        for (int q = 0; q < comm->nranks && crank == 0; q++)
            if (all[q].color == color &&
                comm->lay.peers[q].node_hash != comm->lay.peers[comm->rank].node_hash)
                one_node = false;
        if (crank == 0 && one_node) seg_fd = nodeseg_create(cn, &mine.seg);
    }
    LOOM_CHECK_GOTO(split_allgather(comm, &mine, all, sizeof(mine)), r, out);
    /* Every rank takes part (the same sizes everywhere): records padded to the longest. */
    size_t amax = 0;
    for (int q = 0; q < comm->nranks; q++)
        amax = LOOM_MAX(amax, (size_t)all[q].addr_bytes);
    if (amax) {
        uint8_t *pad = calloc(1, amax), *every = calloc((size_t)comm->nranks, amax);
        if (pad == NULL || every == NULL) {
            free(pad);
            free(every);
            r = base_error(loomSystemError, LOG_INIT, "out of memory (split addresses)");
            goto out;
        }
        if (child && mine.addr_bytes) memcpy(pad, child->net.my_addr, mine.addr_bytes);
        r = split_allgather(comm, pad, every, amax);
        free(pad);
        size_t total = 0;
        uint8_t *buf = NULL;
        int *of_child = NULL; /* parent rank by child rank */
        if (r == loomSuccess && child) {
            for (int q = 0; q < comm->nranks; q++)
                if (all[q].color == color) total += all[q].addr_bytes;
            buf = malloc(total ? total : 1);
            of_child = malloc((size_t)child->nranks * sizeof(int));
            if (buf == NULL || of_child == NULL)
                r = base_error(loomSystemError, LOG_INIT, "out of memory");
        }
        if (r == loomSuccess && child) {
            for (int q = 0; q < comm->nranks; q++)
                if (all[q].color == color) of_child[child_rank(all, comm->nranks, q)] = q;
            /* Concatenated in the child's rank order (comm_set_peer_addrs). */
            size_t off = 0;
            for (int cr = 0; cr < child->nranks; cr++) {
                int q = of_child[cr];
                memcpy(buf + off, every + (size_t)q * amax, all[q].addr_bytes);
                off += all[q].addr_bytes;
            }
        }
        free(of_child);
        free(every);
        if (r != loomSuccess) {
            free(buf);
            goto out;
        }
        if (child) child->lay.addrs = buf; /* offsets once the peers are placed */
    }
    if (child) {
        for (int q = 0; q < comm->nranks; q++) {
            if (all[q].color != color) continue;
            int qr = child_rank(all, comm->nranks, q);
            child->lay.peers[qr] = comm->lay.peers[q];
            child->lay.peers[qr].rank = qr;
            memcpy(child->lay.peers[qr].handle, all[q].handle, sizeof(all[q].handle));
            memcpy(child->lay.peers[qr].shrink_addr, all[q].shrink_addr, 32);
            child->lay.peers[qr].addr_bytes = all[q].addr_bytes;
            child->lay.peers[qr].seg = all[q].seg; /* the child's rank 0's, not the parent's */
        }
        if (child->lay.addrs) {
            size_t total = 0;
            for (int q = 0; q < cn; q++)
                total += child->lay.peers[q].addr_bytes;
            LOOM_CHECK_GOTO(comm_set_peer_addrs(child, child->lay.addrs, total), r, out);
        }
        LOOM_CHECK_GOTO(comm_layout(child), r, out);
        r = comm_seg_setup(child, seg_fd); /* closes seg_fd */
        seg_fd = -1;
        if (r != loomSuccess) goto out;
        INFO(LOG_INIT, "split: colour %d key %d -> rank %d of %d", color, key, crank, cn);
    }
out:
    free(all);
    if (seg_fd >= 0) close(seg_fd);
    if (r != loomSuccess) {
        comm_free(child);
        return r;
    }
    *newcomm = child;
    return loomSuccess;
}
